"""Training data tools: ``dlmspec data prepare`` turns JSONL (or a Hugging Face dataset) into
Megatron indexed datasets.

:mod:`~dlmspec.data.cli` is the command, :mod:`~dlmspec.data.prepare` its body;
:mod:`~dlmspec.data.read` reads the input in chunks (:mod:`~dlmspec.data.hub` a dataset's rows,
with the ``datasets`` library of the ``hf`` extra, imported only then),
:mod:`~dlmspec.data.encode` tokenizes them (in worker processes), :mod:`~dlmspec.data.outputs`
names, checks and cleans up the files written.
Importing this package imports nothing heavy (no torch, megatron, numpy or typer).
"""
