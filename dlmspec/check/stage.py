"""Rules of the training stage (pretrain, SFT, RL), the checkpoints it starts from and saves,
and logging (wandb, the profiler window)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule


@rule(
    "stage-table-ignored",
    "warning",
    "dlmspec.spec.models.StageSpec (stage.sft / stage.rl are read only by their stage kind)",
    "stage.sft / stage.rl match stage.kind",
)
def _stage_table(ctx: Context) -> Iterator[Finding]:
    st = ctx.spec.stage
    for kind in ("sft", "rl"):
        if getattr(st, kind) is not None and st.kind != kind:
            yield Finding(f"stage.{kind}", f"has no effect: stage.kind = '{st.kind}'",
                          f"remove [stage.{kind}], or set stage.kind = '{kind}'", value=None,
                          fix=Fix(unset=(f"stage.{kind}",)))


@rule(
    "rl-objective",
    "error",
    "d1 (Zhao et al. 2025): diffu-GRPO is GRPO for masked diffusion models; GRPO (Shao et al. "
    "2024) needs autoregressive token log-probabilities",
    "the RL algorithm matches the objective",
)
def _rl_objective(ctx: Context) -> Iterator[Finding]:
    st, kind = ctx.spec.stage, ctx.spec.objective.kind
    if st.kind != "rl":
        return
    algorithm = st.rl.algorithm if st.rl is not None else "diffu-grpo"
    want = "mdm" if algorithm == "diffu-grpo" else "ar"
    if kind != want:
        yield Finding(
            "stage.rl.algorithm",
            f"{algorithm} is for {want} models, and objective.kind = '{kind}'",
            f"use algorithm = '{'grpo' if kind == 'ar' else 'diffu-grpo'}'",
            value=algorithm,
            fix=Fix({"stage.rl.algorithm": "grpo" if kind == "ar" else "diffu-grpo"}),
        )


@rule(
    "finetune-from-scratch",
    "warning",
    "SFT and RL start from trained weights (LLaDA, Nie et al. 2025, sec. 2.3)",
    "sft/rl stages load weights (checkpoint.init_from or checkpoint.load)",
)
def _from_scratch(ctx: Context) -> Iterator[Finding]:
    ck = ctx.spec.checkpoint
    if ctx.spec.stage.kind in ("sft", "rl") and ck.init_from is None and ck.load is None:
        yield Finding("checkpoint.init_from", f"a {ctx.spec.stage.kind} stage would start from random weights",
                      "set checkpoint.init_from = 'hf:PATH' or 'mcore:PATH'")


@rule(
    "init-from-format",
    "error",
    "dlmspec.spec.models.CheckpointSpec.init_from ('hf:PATH' or 'mcore:PATH')",
    "checkpoint.init_from is 'hf:PATH' or 'mcore:PATH'",
)
def _init_from(ctx: Context) -> Iterator[Finding]:
    init = ctx.spec.checkpoint.init_from
    if init is not None and not re.fullmatch(r"(hf|mcore):\S.*", init):
        target = init.split(":", 1)[-1]
        fix = Fix({"checkpoint.init_from": f"hf:{target}"}) if target.strip() else None
        yield Finding("checkpoint.init_from", "does not say which format to read",
                      f"use init_from = 'hf:{target or 'PATH'}' (Hugging Face) or 'mcore:PATH' (megatron-core checkpoint)",
                      fix=fix)


@rule(
    "no-checkpoint-save",
    "warning",
    "dlmspec.backends.megatron.training.train (saves and resumes only with CheckpointConfig.save_dir); "
    "launch.sbatch requeues a stopped job",
    "a run longer than one save interval, or one started from init_from, saves checkpoints",
)
def _no_save(ctx: Context) -> Iterator[Finding]:
    ck = ctx.spec.checkpoint
    if ck.save is not None:
        return
    long_run = ctx.r.train_iters > ck.save_interval
    if long_run or ck.init_from:
        why = (f"{ctx.r.train_iters} steps" if long_run else "a run started from init_from")
        yield Finding(
            "checkpoint.save",
            f"not set: {why} would never save a checkpoint, so a stop, a crash or a SLURM requeue "
            "starts it again from the beginning",
            f'set checkpoint.save = "runs/{ctx.spec.name}/checkpoints" (a directory every node sees)',
            fix=Fix({"checkpoint.save": f"runs/{ctx.spec.name}/checkpoints"}),
        )


@rule(
    "checkpoint-inherited",
    "warning",
    "dlmspec.spec.load (extends deep-merges the parent; a relaunch resumes from checkpoint.save's latest)",
    "a spec that renames its run does not reuse the checkpoint folder of the spec it extends",
)
def _checkpoint_inherited(ctx: Context) -> Iterator[Finding]:
    loaded = ctx.loaded
    if loaded is None or ctx.spec.checkpoint.save is None:
        return
    top = str(loaded.path)
    save_file = loaded.origins.get("checkpoint.save", (top, None))[0]
    name_file = loaded.origins.get("name", (None, None))[0]
    if save_file not in (top, "--set") and name_file in (top, "--set"):
        yield Finding("checkpoint.save",
                      f"is inherited from {Path(save_file).name}, whose run writes and resumes the same "
                      f"folder: this run ('{ctx.spec.name}') would resume the other's checkpoints",
                      f"set checkpoint.save = \"runs/{ctx.spec.name}/checkpoints\" in this spec")


@rule(
    "wandb-name-without-project",
    "warning",
    "Megatron-LM training (wandb is enabled by --wandb-project)",
    "logging.wandb_exp_name comes with logging.wandb_project",
)
def _wandb(ctx: Context) -> Iterator[Finding]:
    lg = ctx.spec.logging
    if lg.wandb_exp_name is not None and lg.wandb_project is None:
        yield Finding("logging.wandb_exp_name", "has no effect: wandb logs only when wandb_project is set",
                      "remove logging.wandb_exp_name (the bundled runtime logs to TensorBoard), or set "
                      "logging.wandb_project", fix=Fix(unset=("logging.wandb_exp_name",)))


@rule(
    "profile-window",
    "error",
    "megatron-lm training.py (--profile-step-start .. --profile-step-end, --profile-ranks)",
    "the profiled steps lie inside the run, end after start, on ranks that exist",
)
def _profile(ctx: Context) -> Iterator[Finding]:
    lg = ctx.spec.logging
    if not lg.profile:
        return
    if lg.profile_step_end <= lg.profile_step_start:
        yield Finding("logging.profile_step_end", f"must exceed profile_step_start = {lg.profile_step_start}",
                      f"use profile_step_end = {lg.profile_step_start + 2}", value=lg.profile_step_end,
                      fix=Fix({"logging.profile_step_end": lg.profile_step_start + 2}))
    elif lg.profile_step_end > ctx.r.train_iters:
        yield Finding("logging.profile_step_end", f"lies after the last step ({ctx.r.train_iters})",
                      f"use profile_step_end = {ctx.r.train_iters} or less", value=lg.profile_step_end,
                      fix=Fix({"logging.profile_step_end": ctx.r.train_iters}))
    bad = [rank for rank in lg.profile_ranks if rank >= ctx.r.world_size]
    if bad:
        good = [rank for rank in lg.profile_ranks if rank < ctx.r.world_size] or [0]
        yield Finding("logging.profile_ranks", f"ranks {bad} do not exist (world size {ctx.r.world_size})",
                      f"use ranks below the world size, e.g. profile_ranks = {good}", value=lg.profile_ranks,
                      fix=Fix({"logging.profile_ranks": good}))
