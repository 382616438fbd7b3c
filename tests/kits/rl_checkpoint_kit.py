"""RL runs that checkpoint their reference model, on CPU (not a test module): in this process (the
``cpu_train`` fixture of rl_loop_kit) or in a spawned gloo world of several ranks with any tensor-
parallel size (:func:`run_world`), with an optimizer that moves the weights (rl_loop_kit's does
not), so the policy at a stop differs from the policy at the last refresh of the reference.

A run: 4 steps of 4 rows (2 prompts x 2 completions), a checkpoint every 2 steps, the reference
refreshed every ``sync`` steps (``ref_model_sync_steps``). :class:`PerRankReferenceStage` writes
the reference as earlier dlmspec versions did (per rank, with the RNG states: the fixture of an
old checkpoint)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from dlmspec.backends.megatron.config import ObjectiveConfig
from dlmspec.backends.rl.stage import RLConfig, RLStage

from cpu_world_kit import spawn_world
from rl_kit import ROWS, CharTokenizer, core
from rl_loop_kit import MASK, SEQ, VOCAB, _config, _forward_backward, _Optimizer, _run


class MovingOptimizer(_Optimizer):
    """Each step maps every weight ``w -> 0.9 w + 0.01``: a function of the weights alone, the same
    on every rank, so a resumed run (in any layout) moves them exactly as an uninterrupted one."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def step(self):
        with torch.no_grad():
            for chunk in self.model:
                for p in chunk.parameters():
                    p.mul_(0.9).add_(0.01)
        return super().step()


def write_prompts(folder: Path) -> None:
    """The prompts file ``p.jsonl`` the runs read (relative to the working folder)."""
    (folder / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")


def rl_run(root: Path, *, init_from: Optional[str] = None, **schedule):
    """The run of a test: ``root/ckpt``, ``root/run``; ``schedule`` overrides (``stop_at_iteration``)."""
    base = dict(micro_batch_size=2, global_batch_size=4, train_iters=4, eval_interval=None)
    run = _run(root, **{**base, **schedule})
    # a train record per step: the stage's metrics of one step each
    return dataclasses.replace(run, objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK),
                               checkpoint=dataclasses.replace(run.checkpoint, init_from=init_from),
                               logging=dataclasses.replace(run.logging, log_interval=1))


def resumed(run):
    """``run`` without its ``stop_at_iteration`` (the relaunch that resumes it)."""
    return dataclasses.replace(run, schedule=dataclasses.replace(run.schedule, stop_at_iteration=None))


def rl_options(sync: int) -> RLConfig:
    return RLConfig(algorithm="diffu-grpo", grpo_group_size=2, grpo_prompts_per_step=2, grpo_kl_beta=0.04,
                    ref_model_sync_steps=sync, chat_template="plain", prompts="p.jsonl", sample_log_interval=1,
                    rewards=(("builtin:exact_match", 1.0),),
                    generate=dict(gen_length=8, steps=8, block_length=8, temperature=1.0))


class PerRankReferenceStage(RLStage):
    """The RL stage writing its reference as dlmspec did before the sharded format: nothing in the
    distributed checkpoint's stage entry, and in each rank's state ``reference_synced_at`` and
    (after a refresh, or without ``init_from``) ``reference``: a list per chunk of the chunk's
    ``state_dict`` tensors on the CPU."""

    def sharded_state_dict(self) -> Dict[str, Any]:
        return {}

    def state_dict(self) -> Dict[str, Any]:
        from megatron.core.utils import unwrap_model

        state = super().state_dict()
        if state and self.reference is not None:
            state["reference_synced_at"] = int(self.reference_synced_at)
            if self.reference_synced_at > 0 or not self.run.checkpoint.init_from:
                state["reference"] = [{k: v.detach().to("cpu", copy=True)
                                       for k, v in unwrap_model(c).state_dict().items() if isinstance(v, torch.Tensor)}
                                      for c in self.reference]
        return state


def rl_stage(run, sync: int, *, per_rank: bool = False) -> RLStage:
    cls = PerRankReferenceStage if per_rank else RLStage
    return cls(run, rl_options(sync), core=core(), tokenizer=CharTokenizer())


def weights(chunks) -> Dict[str, torch.Tensor]:
    """The tensors of the first chunk's (unwrapped) ``state_dict``, cloned to the CPU."""
    from megatron.core.utils import unwrap_model

    return {k: v.detach().to("cpu", copy=True) for k, v in unwrap_model(chunks[0]).state_dict().items()
            if isinstance(v, torch.Tensor)}


def same(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> bool:
    """Bit-for-bit: the same names, and every tensor ``torch.equal``."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def train_rl(run, stage, *, tensor_model_parallel_size: int = 1):
    """``training.train`` of ``run`` with ``stage`` on the tiny model (rl_loop_kit's sizes)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron import training
    from dlmspec.backends.megatron.layers import build_layer_spec

    config = _config()
    config.tensor_model_parallel_size = tensor_model_parallel_size
    return training.train(
        run, transformer_config=config,
        layer_spec=build_layer_spec(attention="bidirectional", use_transformer_engine=False),
        model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                          rotary_base=10000),
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
        optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False), stage=stage,
        tensor_model_parallel_size=tensor_model_parallel_size)


def _patch_for_cpu() -> None:
    """A spawned rank's stand-ins (as rl_loop_kit's ``cpu_train_world``, without pytest): CUDA
    calls pointed at the CPU, the moving optimizer and the CPU schedule."""
    from dlmspec.backends.megatron import checks, training

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    checks.cuda_problem = lambda **kwargs: None
    training.prestart_checkpoint_helpers = lambda: None
    training.get_megatron_optimizer = lambda config, model: MovingOptimizer(model)
    training.get_forward_backward_func = lambda: _forward_backward


def _rank_main(rank: int, store: str, world: int, job: Dict[str, Any]) -> None:
    """One spawned rank: a gloo world of ``world`` processes, one RL run (``job``), then this rank's
    outcome in ``<root>/<tag>.rank<rank>.pt``: the exit code (0, or a ``SystemExit``'s), the
    reference's weights and refresh step, and ``train()``'s resume step."""
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    _patch_for_cpu()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    root = Path(job["root"])
    os.chdir(job["cwd"])
    run = rl_run(root, init_from=job.get("init_from"),
                 **({"stop_at_iteration": job["stop"]} if job.get("stop") else {}))
    stage = rl_stage(run, job["sync"], per_rank=job.get("per_rank", False))
    out: Dict[str, Any] = {"code": 0}
    try:
        result = train_rl(run, stage, tensor_model_parallel_size=job.get("tp", 1))
        out["resumed_from"] = result.resumed_from
    except SystemExit as exc:
        out["code"] = exc.code
    if stage.reference is not None:
        out["reference"] = weights(stage.reference)
        out["synced_at"] = stage.reference_synced_at
    torch.save(out, Path(job["cwd"]) / f"{job['tag']}.rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


def run_world(cwd: Path, world: int, *, tag: str, root: Path, sync: int, stop: Optional[int] = None, tp: int = 1,
              per_rank: bool = False, init_from: Optional[str] = None) -> list:
    """Run one RL run in a spawned gloo world of ``world`` CPU processes (``cpu_world_kit.spawn_world``,
    a file store in ``cwd``); returns each rank's outcome (:func:`_rank_main`)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    store = cwd / f"{tag}.store"
    job = dict(root=str(root), cwd=str(cwd), tag=tag, sync=sync, stop=stop, tp=tp, per_rank=per_rank,
               init_from=init_from)
    spawn_world(_rank_main, args=(str(store), world, job), nprocs=world)
    return [torch.load(cwd / f"{tag}.rank{r}.pt", weights_only=True) for r in range(world)]
