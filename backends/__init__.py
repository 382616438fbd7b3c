"""What compiled code runs on, imported as ``dlmspec.backends`` (pyproject.toml maps this folder):
the megatron-core runtime (:mod:`dlmspec.backends.megatron`), Hugging Face <-> megatron-core
conversion (:mod:`dlmspec.backends.convert`) and the launch checks (:mod:`dlmspec.backends.launch`).
Unlike the rest of ``dlmspec`` these modules import torch and megatron-core."""
