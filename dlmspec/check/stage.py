"""Rules of the training stage (pretrain, SFT, RL), the checkpoints it starts from and saves,
and logging (wandb, the profiler window)."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.spec.names import NAME_KEYS, PLACEHOLDER, has_placeholder


@rule(
    "stage-kind-known",
    "error",
    "dlmspec.stages.STAGE_KINDS (the compiler's stages; the runtime's: dlmspec.backends.megatron.stages.STAGES)",
    "stage.kind names a registered stage that the runtime trains",
    fix="set stage.kind = \"pretrain\"",
    fix_keys=Fix({"stage.kind": "pretrain"}),
)
def _stage_kind(ctx: Context) -> Iterator[Finding]:
    from dlmspec.stages import known_kinds, stage_kind

    kind = ctx.spec.stage.kind
    entry = stage_kind(kind)
    if entry is None:
        yield Finding("stage.kind", f"no stage of kind {kind!r} is registered (known: {known_kinds()})",
                      "set stage.kind = \"pretrain\" (or \"sft\"), or import the module that registers the stage",
                      fix=Fix({"stage.kind": "pretrain"}))
    elif not entry.runtime:
        yield Finding("stage.kind", f"{entry.summary}: stage.kind = {kind!r} is registered without a runtime stage "
                      "(dlmspec.backends.megatron.stages.STAGES)",
                      "set stage.kind = \"pretrain\", or install the package that trains the stage",
                      fix=Fix({"stage.kind": "pretrain"}))


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


#: Keys of :data:`~dlmspec.spec.names.NAME_KEYS` whose sharing continues another run: a child
#: that inherits them saves into, and resumes from, the parent's checkpoints.
_CHECKPOINT_KEYS = ("checkpoint.save", "checkpoint.load")

#: What an inherited key of another run's name does to this run, per key.
_SHARED = {
    "checkpoint.save": "saves into that run's folder and, on every relaunch, resumes that run's latest checkpoint",
    "checkpoint.load": "resumes that run's latest checkpoint",
    "logging.run_dir": "writes its metrics.jsonl and exit_status.json into that run's folder",
    "logging.tensorboard_dir": "writes its TensorBoard events among that run's events",
    "logging.wandb_exp_name": "logs to wandb under that run's name",
    "logging.wandb_save_dir": "keeps its W&B files, and resumes the W&B run, of that run's folder",
    "cluster.slurm.job_name": "is queued under that run's SLURM job name",
}


def _name_word(name: str) -> re.Pattern[str]:
    """``name`` as a word of a path (not inside a longer name: ``t`` is not in ``tb``)."""
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])")


def _holds_name(value: str, name: str) -> bool:
    """Whether ``name`` is a word of ``value`` (:func:`_name_word`)."""
    return _name_word(name).search(value) is not None


def _raw_value(raw: dict, key: str) -> object:
    node: object = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


@rule(
    "checkpoint-inherited",
    "error",
    "dlmspec.spec.load (extends deep-merges the parent; a relaunch resumes from checkpoint.load's latest); "
    "dlmspec.spec.names ({name} in a run's paths)",
    "a spec that renames the run of a spec it extends inherits none of that run's folders: paths are written "
    "with {name}, or in this spec",
)
def _checkpoint_inherited(ctx: Context) -> Iterator[Finding]:
    """Each key of :data:`~dlmspec.spec.names.NAME_KEYS` that a parent file (not this spec, not
    ``--set``) wrote as a literal (no ``{name}``) while this spec's name differs from that
    file's: checkpoint.save / checkpoint.load always (an error: the run would resume, or save
    over, the other run's checkpoints, and a SLURM job has no one to ask) unless
    ``checkpoint.resume_from_run`` names that run; the other keys when they hold that run's name
    (a warning: logs and names mix, the training state does not)."""
    loaded = ctx.loaded
    if loaded is None:
        return
    parents = list(loaded.files)[1:]
    meant = ctx.spec.checkpoint.resume_from_run
    for key in NAME_KEYS:
        written = _raw_value(loaded.raw, key)
        file = loaded.origins.get(key, (None, None))[0]
        if not isinstance(written, str) or has_placeholder(written) or file not in parents:
            continue
        other = loaded.files[file]
        if other == ctx.spec.name:
            continue
        checkpoint = key in _CHECKPOINT_KEYS
        if checkpoint and meant == other:
            continue
        named = _holds_name(written, other)
        if not (checkpoint or named):
            continue
        # what the parent wrote is spec text already (braces doubled): the name becomes {name}
        if key == "logging.tensorboard_dir":
            # the runtime writes events to <run_dir>/tensorboard only (rule runtime-tensorboard-dir)
            fixed = posixpath.join(ctx.spec.logging.run_dir or "runs/" + PLACEHOLDER, "tensorboard")
            if ctx.spec.logging.run_dir and ctx.spec.name in ctx.spec.logging.run_dir:
                fixed = _name_word(ctx.spec.name).sub(lambda _: PLACEHOLDER, fixed)
        else:
            fixed = _name_word(other).sub(lambda _: PLACEHOLDER, written) if named else "runs/{name}/checkpoints"
        quoted = fixed.replace("\\", "\\\\").replace('"', '\\"')
        hint = f'set {key} = "{quoted}" in this spec ({PLACEHOLDER} is its name)'
        if checkpoint:
            hint += f', or checkpoint.resume_from_run = "{other}" to continue that run on purpose'
        yield Finding(
            key,
            f"is inherited from {Path(file).name}, written for the run '{other}'"
            f"{'' if named else ' (and for every run that extends it)'}: this run ('{ctx.spec.name}') "
            f"{_SHARED[key]}",
            hint,
            value=written,
            severity=None if checkpoint else "warning",
            fix=Fix({key: fixed}),
        )


#: The ``[logging]`` W&B keys that only mean something with ``wandb_project``.
_WANDB_KEYS = ("wandb_exp_name", "wandb_save_dir", "wandb_entity", "wandb_mode", "wandb_tags")


@rule(
    "wandb-name-without-project",
    "warning",
    "Megatron-LM training (wandb is enabled by --wandb-project)",
    "logging.wandb_exp_name (and the other wandb_* keys) come with logging.wandb_project",
)
def _wandb(ctx: Context) -> Iterator[Finding]:
    lg = ctx.spec.logging
    if lg.wandb_project is not None:
        return
    for name in _WANDB_KEYS:
        if getattr(lg, name) is not None:
            yield Finding(f"logging.{name}", "has no effect: W&B logs only when logging.wandb_project is set",
                          f"set logging.wandb_project (the W&B project), or remove logging.{name}",
                          fix=Fix(unset=(f"logging.{name}",)))


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
