"""The OpenAI-compatible HTTP layer: JSON <-> engine requests, nothing else (001 §10.1)."""
