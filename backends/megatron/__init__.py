"""dlmspec's training runtime on megatron-core (imported by the compiled ``train.py``).

The loop and what it runs on, one concern per module (each imports torch and megatron-core;
docs/runtime.md tells the whole story):

* :mod:`.training` - ``train(...)``: the loop; :mod:`.stage` - what a stage (pre-training
  today) supplies to it: data, objective, per-step work.
* :mod:`.config` - ``RunConfig`` and the other dataclasses train.py fills.
* :mod:`.checks` - what the runtime refuses at start; :mod:`.distributed` - process groups,
  parallel state, CUDA, seeds; :mod:`.signals` - stop signals.
* :mod:`.checkpointing` - saves, ``latest``, resume; :mod:`.spec_record` - the spec a checkpoint
  records; :mod:`.init_from` - initial weights; :mod:`.fsdp` - Megatron-FSDP.
* :mod:`.optim` - learning-rate schedule, optimizer hooks and state; :mod:`.metrics` - logging,
  MFU; :mod:`.hostbench`, :mod:`.profiling` - measurements of a run.
* :mod:`.data`, :mod:`.microbatches` - datasets and the step's microbatches; :mod:`.objective`,
  :mod:`.rng`, :mod:`.output_loss` - the losses and their random draws.
* :mod:`.layers`, :mod:`.attention`, :mod:`.qkv`, :mod:`.norms`, :mod:`.rope` - layer specs and
  the local path's kernels.
"""
