"""The tiny decoder-only transformer the mock device executes (numpy)."""
