"""What compiled code runs on, imported as ``dlmspec.backends`` (pyproject.toml maps this folder):
the megatron-core runtime (:mod:`dlmspec.backends.megatron`), Hugging Face <-> megatron-core
conversion (:mod:`dlmspec.backends.convert`), the launch checks (:mod:`dlmspec.backends.launch`) and
sampling and likelihood estimation (:mod:`dlmspec.backends.generate`).
Unlike the rest of ``dlmspec`` these modules import torch and megatron-core."""
