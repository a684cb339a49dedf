"""``calctl import`` and ``calctl combine``: real checkpoints become sealed calbin packages.

* :mod:`.families` – which checkpoint families the mock's decoder runs (Llama,
  Qwen2, Qwen3) and how their config becomes an explicit
  :class:`~calctl.package.model.Architecture`; anything else is refused by name;
* :mod:`.hf` – a Hugging Face directory (``config.json``, ``*.safetensors``,
  ``tokenizer.json``, ``tokenizer_config.json``), read with ``safetensors``;
* :mod:`.gguf_file` – a llama.cpp GGUF file, read and dequantised with ``gguf``,
  its Q/K RoPE row permutation undone, its tokenizer rebuilt with ``tokenizers``;
* :mod:`.build` – golden data from the float64 no-cache reference path, the
  KV/workspace plan from the real config, then :mod:`calctl.compiler.writer`;
* :mod:`.combine` – two packages become one combined (two models, one per chip)
  or replica (one model on both chips) package.

Every bad input is a :class:`CheckpointError` (exit 2) naming the file and what
was expected. Nothing here validates the output; ``calctl validate`` does.
"""
