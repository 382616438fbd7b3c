"""Training data tools: ``dlmspec data prepare`` turns JSONL into Megatron indexed datasets.

:mod:`~dlmspec.data.cli` is the command, :mod:`~dlmspec.data.prepare` its body;
:mod:`~dlmspec.data.read` reads the input in chunks, :mod:`~dlmspec.data.encode` tokenizes them
(in worker processes), :mod:`~dlmspec.data.outputs` names, checks and cleans up the files written.
Importing this package imports nothing heavy (no torch, megatron, numpy or typer).
"""
