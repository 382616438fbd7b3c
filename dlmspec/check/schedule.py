"""Rules of the training length and the optimizer's schedule: the budget, the learning rate and
its warmup and decay (WSD, piecewise), evaluation, the seed, and lengths beyond int64 or every published run."""

from __future__ import annotations

from typing import Iterator

from dlmspec.check.precision import FLOAT32_MAX
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.errors import toml_text
from dlmspec.spec.fast import SCHEMA


@rule(
    "train-budget",
    "error",
    "Megatron-LM validate_args: exactly one of --train-iters / --train-samples",
    "exactly one of train.train_iters and train.train_tokens is set",
)
def _budget(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.train_iters is None and tr.train_tokens is None:
        iters = max(1000, 10 * tr.lr_warmup_iters, tr.lr_decay_iters or 0)
        yield Finding(
            "train.train_iters",
            "the training length is not set",
            f"set train.train_iters (steps, e.g. train_iters = {iters}) or train.train_tokens (one step is "
            f"{ctx.r.tokens_per_step} tokens)",
            fix=Fix({"train.train_iters": iters}),
        )
    elif tr.train_iters is not None and tr.train_tokens is not None:
        yield Finding(
            "train.train_tokens",
            "train_iters and train_tokens both set the training length",
            "keep only one of train_iters and train_tokens: remove train_tokens",
            fix=Fix(unset=("train.train_tokens",)),
        )


@rule(
    "min-lr-le-lr",
    "error",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.__init__ (max_lr >= min_lr)",
    "train.min_lr <= train.lr",
)
def _min_lr(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.min_lr > tr.lr:
        fix = Fix({"train.min_lr": float(f"{tr.lr / 10:g}")})
        yield Finding("train.min_lr", f"is above the peak lr = {tr.lr}",
                      f"use min_lr <= {tr.lr}, e.g. min_lr = {toml_text(fix.set['train.min_lr'])}", fix=fix)


@rule(
    "warmup-exclusive",
    "error",
    "Megatron-LM validate_args: only one of --lr-warmup-fraction and --lr-warmup-iters",
    "only one of lr_warmup_iters and lr_warmup_fraction is set",
)
def _warmup_exclusive(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_warmup_fraction is not None and tr.lr_warmup_iters > 0:
        yield Finding("train.lr_warmup_fraction", "lr_warmup_iters and lr_warmup_fraction both set the warmup",
                      "keep only one of them: remove lr_warmup_fraction", fix=Fix(unset=("train.lr_warmup_fraction",)))


def _schedule(ctx: Context) -> tuple[int, int]:
    """(warmup, decay) steps as Megatron-LM derives them (training.get_optimizer_param_scheduler)."""
    tr = ctx.spec.train
    decay = tr.lr_decay_iters or ctx.r.train_iters
    warmup = int(tr.lr_warmup_fraction * decay) if tr.lr_warmup_fraction is not None else tr.lr_warmup_iters
    return warmup, decay


@rule(
    "warmup-lt-decay",
    "error",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.__init__ (warmup < decay steps)",
    "the warmup is shorter than the decay",
)
def _warmup_decay(ctx: Context) -> Iterator[Finding]:
    warmup, decay = _schedule(ctx)
    if decay > 0 and warmup >= decay:
        key = "train.lr_warmup_fraction" if ctx.spec.train.lr_warmup_fraction is not None else "train.lr_warmup_iters"
        fix = Fix({key: 0.1} if key == "train.lr_warmup_fraction" else {key: decay // 10})
        yield Finding(key, f"{warmup} warmup steps do not fit in the {decay} decay steps",
                      f"use fewer than {decay} warmup steps, e.g. {fix.text().removeprefix('set ')}", fix=fix)


@rule(
    "decay-beyond-train",
    "warning",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.get_lr",
    "the LR decay ends by the last training step",
)
def _decay_beyond(ctx: Context) -> Iterator[Finding]:
    tr, iters = ctx.spec.train, ctx.r.train_iters
    if tr.lr_decay_iters is not None and iters and tr.lr_decay_iters > iters and tr.lr_decay_style != "constant":
        yield Finding(
            "train.lr_decay_iters",
            f"training stops at step {iters}, before the LR decay ends, so the LR never reaches min_lr",
            f"remove lr_decay_iters (it defaults to train_iters), or use lr_decay_iters <= {iters}",
            fix=Fix(unset=("train.lr_decay_iters",)),
        )


@rule(
    "wsd-needs-decay-iters",
    "error",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.__init__ (WSD needs wsd_decay_steps)",
    "the WSD schedule sets train.lr_wsd_decay_iters",
)
def _wsd(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_decay_style == "WSD" and tr.lr_wsd_decay_iters is None:
        _, decay = _schedule(ctx)
        yield Finding("train.lr_wsd_decay_iters", "the WSD schedule needs the length of its final decay",
                      f"set lr_wsd_decay_iters, e.g. lr_wsd_decay_iters = {max(1, decay // 10)} (10% of the {decay} "
                      "decay steps)", fix=Fix({"train.lr_wsd_decay_iters": max(1, decay // 10)}))


@rule(
    "wsd-overlaps-warmup",
    "warning",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.get_lr (WSD anneal starts at "
    "decay - wsd_decay steps)",
    "the WSD decay starts after the warmup",
)
def _wsd_overlap(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    warmup, decay = _schedule(ctx)
    if tr.lr_decay_style == "WSD" and tr.lr_wsd_decay_iters is not None and decay and tr.lr_wsd_decay_iters > decay - warmup:
        yield Finding(
            "train.lr_wsd_decay_iters",
            f"the final decay would start at step {decay - tr.lr_wsd_decay_iters}, before the warmup ends "
            f"at step {warmup}; the LR jumps when warmup ends",
            f"use lr_wsd_decay_iters = {max(1, decay - warmup)} or less",
            fix=Fix({"train.lr_wsd_decay_iters": max(1, decay - warmup)}),
        )


@rule(
    "wsd-keys-ignored",
    "warning",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler (wsd_* used only by WSD)",
    "WSD keys are only given with lr_decay_style = 'WSD'",
)
def _wsd_ignored(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_decay_style != "WSD":
        for key in ("train.lr_wsd_decay_iters", "train.lr_wsd_decay_style"):
            if ctx.is_set(key):
                yield Finding(key, f"has no effect with lr_decay_style = '{tr.lr_decay_style}'",
                              f"remove {key.split('.')[1]}, or set lr_decay_style = 'WSD'", fix=Fix(unset=(key,)))


# ------------------------------------------------------------------ the piecewise schedule (LLaDA)
#: Source of the piecewise schedule's rules.
_PIECEWISE_SOURCE = ("LLaDA, arXiv:2502.09992 sec. 2.2 (4e-4, a drop to 1e-4 at 1.2T tokens, linear to 1e-5); "
                     "dlmspec.backends.megatron.optim.PiecewiseParamScheduler")


def _points(ctx: Context) -> list[list]:
    """``train.lr_points`` as ``[[step, lr], ...]`` lists (empty when unset)."""
    return [[int(s), float(lr)] for s, lr in (ctx.spec.train.lr_points or ())]


def _default_points(ctx: Context) -> list[list]:
    """A schedule to offer: the peak at the end of the warmup, linear to min_lr at the last step."""
    warmup, _ = _schedule(ctx)
    tr, iters = ctx.spec.train, ctx.r.train_iters or 1
    start = min(warmup, iters)
    return [[start, float(tr.lr)], [iters, float(tr.min_lr)]]


def piecewise_lr(points: list, step: int) -> float:
    """The lr of ``points`` (``[[step, lr], ...]``, steps non-decreasing) at ``step``: linear
    between points, the later lr of a repeated step from that step on, the first point's lr before
    it and the last's after it. The same function as the runtime's
    ``PiecewiseParamScheduler.points_lr`` (``backends/megatron/optim.py``).

    Raises:
        ValueError: on an empty ``points``.
    """
    if not points:
        raise ValueError("piecewise_lr needs at least one point")
    if step < points[0][0]:
        return float(points[0][1])
    for (s0, lr0), (s1, lr1) in zip(points, points[1:]):
        if s0 <= step < s1:
            return float(lr0) + (float(lr1) - float(lr0)) * (step - s0) / (s1 - s0)
    return float(points[-1][1])


def _points_finding(ctx: Context, message: str, hint: str, *, fix: Fix) -> Finding:
    """A finding at ``train.lr_points`` showing the points as a spec writes them (lists, not tuples)."""
    return Finding("train.lr_points", message, hint, value=_points(ctx), fix=fix)


def _sorted_ok(points: list) -> bool:
    steps = [p[0] for p in points]
    return all(a <= b for a, b in zip(steps, steps[1:])) and all(steps.count(s) <= 2 for s in set(steps))


@rule(
    "lr-points-required",
    "error",
    _PIECEWISE_SOURCE,
    "lr_decay_style = 'piecewise' gives train.lr_points",
)
def _points_required(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.train.lr_decay_style == "piecewise" and not ctx.spec.train.lr_points:
        fix = Fix({"train.lr_points": _default_points(ctx)})
        yield Finding("train.lr_points", "the piecewise schedule needs its [step, lr] points",
                      f"set lr_points, e.g. lr_points = {toml_text(fix.set['train.lr_points'])} (the peak at the end "
                      "of the warmup, linear to min_lr at the last step)", fix=fix)


@rule(
    "lr-points-ignored",
    "warning",
    _PIECEWISE_SOURCE,
    "train.lr_points is only given with lr_decay_style = 'piecewise'",
)
def _points_ignored(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_decay_style != "piecewise" and ctx.is_set("train.lr_points"):
        yield _points_finding(ctx, f"has no effect with lr_decay_style = '{tr.lr_decay_style}'",
                      "remove lr_points, or set lr_decay_style = 'piecewise'", fix=Fix(unset=("train.lr_points",)))


@rule(
    "lr-points-order",
    "error",
    _PIECEWISE_SOURCE,
    "train.lr_points' steps are non-decreasing, at most two points per step (a jump)",
)
def _points_order(ctx: Context) -> Iterator[Finding]:
    points = _points(ctx)
    if ctx.spec.train.lr_decay_style != "piecewise" or _sorted_ok(points):
        return
    ordered = sorted(points, key=lambda p: p[0])  # stable: a jump keeps its order
    kept = [p for i, p in enumerate(ordered)
            if i in (0, len(ordered) - 1) or p[0] != ordered[i - 1][0] or p[0] != ordered[i + 1][0]]
    steps = [p[0] for p in points]
    why = (next((f"step {b} follows step {a}" for a, b in zip(steps, steps[1:]) if b < a), None)
           or next(f"step {s} has {steps.count(s)} points" for s in steps if steps.count(s) > 2))
    fix = Fix({"train.lr_points": kept})
    yield _points_finding(ctx, f"{why}: the points' steps must not decrease, and a step holds at most two "
                  "points (the lr before and after a jump)", f"use lr_points = {toml_text(kept)}", fix=fix)


@rule(
    "lr-points-range",
    "error",
    _PIECEWISE_SOURCE,
    "train.lr_points' steps lie in [0, train_iters]",
)
def _points_range(ctx: Context) -> Iterator[Finding]:
    iters = ctx.r.train_iters
    points = _points(ctx)
    if ctx.spec.train.lr_decay_style != "piecewise" or not points or not iters:
        return
    outside = [p for p in points if not 0 <= p[0] <= iters]
    if not outside:
        return
    kept = [p for p in points if 0 <= p[0] <= iters] or _default_points(ctx)
    fix = Fix({"train.lr_points": kept})
    yield _points_finding(ctx, f"step {outside[0][0]} is outside the run's steps 0 .. {iters:,}",
                  f"keep the points inside it: lr_points = {toml_text(kept)}", fix=fix)


@rule(
    "lr-points-lr",
    "error",
    _PIECEWISE_SOURCE,
    "train.lr_points' learning rates are finite and >= 0",
)
def _points_lr(ctx: Context) -> Iterator[Finding]:
    points = _points(ctx)
    if ctx.spec.train.lr_decay_style != "piecewise":
        return
    bad = [p for p in points if not 0.0 <= p[1] <= FLOAT32_MAX]
    if not bad:
        return
    lr = float(ctx.spec.train.lr)
    fixed = [[s, 0.0 if v < 0 else lr] if not 0.0 <= v <= FLOAT32_MAX else [s, v] for s, v in points]
    yield _points_finding(ctx, f"the lr {bad[0][1]!r} at step {bad[0][0]} is not a learning rate (finite, >= 0)",
                  f"use lr_points = {toml_text(fixed)}", fix=Fix({"train.lr_points": fixed}))


@rule(
    "lr-points-warmup",
    "warning",
    _PIECEWISE_SOURCE + "; megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.get_lr (warm-up to max_lr)",
    "the piecewise schedule starts at train.lr where the warmup ends",
)
def _points_warmup(ctx: Context) -> Iterator[Finding]:
    tr, iters = ctx.spec.train, ctx.r.train_iters
    points = _points(ctx)
    warmup, _ = _schedule(ctx)
    if tr.lr_decay_style != "piecewise" or not points or warmup <= 0 or not _sorted_ok(points):
        return
    if not all(0 <= p[0] <= (iters or p[0]) for p in points) or warmup > (iters or warmup):
        return
    at = piecewise_lr(points, warmup)
    hidden = [p for p in points if p[0] < warmup]
    if at == float(tr.lr) and not hidden:
        return
    kept = [[warmup, float(tr.lr)]] + [p for p in points if p[0] > warmup]
    why = (f"the warmup ramps to lr = {tr.lr:g} at step {warmup}, where the points give {at:g}: the lr jumps when the "
           "warmup ends" if at != float(tr.lr) else
           f"the points before step {warmup} are hidden by the warmup (0 -> lr = {tr.lr:g} over {warmup} steps)")
    yield _points_finding(ctx, why, f"start the points at the warmup's end: lr_points = {toml_text(kept)}",
                  fix=Fix({"train.lr_points": kept}))


@rule(
    "eval-interval",
    "warning",
    "Megatron-LM training.train (evaluates every eval_interval steps)",
    "evaluation runs at least once during training",
)
def _eval(ctx: Context) -> Iterator[Finding]:
    tr, iters = ctx.spec.train, ctx.r.train_iters
    if iters and tr.eval_interval > iters:
        yield Finding("train.eval_interval", f"exceeds the {iters} training steps: no evaluation during training",
                      f"use eval_interval = {iters} or less", fix=Fix({"train.eval_interval": iters}))


#: megatron-core's data pipeline counts the run's samples and tokens in numpy int64.
_INT64_MAX = 2**63 - 1


#: Tokens of the largest published pretraining runs (Qwen3: 36T), order of magnitude.
_LARGEST_RUN_TOKENS = 4e13


#: More tokens than this draws a warning: 25 times the largest published runs.
_IMPLAUSIBLE_TOKENS = 1e15


#: A large pretraining run, for the hint of the warning (1e12 tokens).
_LARGE_RUN_TOKENS = 10**12


def _length_key(ctx: Context) -> str:
    tr = ctx.spec.train
    return "train.train_tokens" if tr.train_tokens is not None and tr.train_iters is None else "train.train_iters"


@rule(
    "train-length-overflow",
    "error",
    "megatron-core BlendedMegatronDatasetBuilder / GPTDataset (the run's samples, train_iters * global_batch_size, "
    "and their tokens as numpy int64 sample indexes)",
    "the run's tokens, train_iters * global_batch_size * seq_length, fit in int64",
)
def _length_overflow(ctx: Context) -> Iterator[Finding]:
    steps, per_step = ctx.r.train_iters, ctx.r.tokens_per_step
    total = steps * per_step
    if total <= _INT64_MAX:
        return
    why = (f"{steps:,} steps of {per_step:,} tokens are {total:.3g} tokens, beyond int64 ({_INT64_MAX:.3g}), in which "
           "megatron-core's datasets count and index the run's samples: the index would overflow")
    most = _INT64_MAX // per_step
    if most == 0:
        tr, step = ctx.spec.train, ctx.spec.train.micro_batch_size * ctx.r.dp
        gbs = (_INT64_MAX // max(1, steps) // tr.seq_length) // step * step
        fix = Fix({"train.global_batch_size": gbs}) if gbs > 0 else None
        yield Finding("train.global_batch_size", why, "use a global_batch_size * seq_length below 2**63"
                      + (f", e.g. global_batch_size = {gbs}" if fix else ""), fix=fix)
    elif _length_key(ctx) == "train.train_tokens":
        yield Finding("train.train_tokens", why, f"use train_tokens <= {most * per_step:,}, e.g. "
                      f"train_tokens = {_LARGE_RUN_TOKENS}", fix=Fix({"train.train_tokens": _LARGE_RUN_TOKENS}))
    else:
        iters = -(-_LARGE_RUN_TOKENS // per_step)
        yield Finding("train.train_iters", why, f"use train_iters <= {most:,}, e.g. train_iters = {iters} "
                      f"({_LARGE_RUN_TOKENS:.0e} tokens)", fix=Fix({"train.train_iters": iters}))


@rule(
    "train-length-implausible",
    "warning",
    f"published pretraining runs reach about {_LARGEST_RUN_TOKENS:.0e} tokens (Qwen3: 36T)",
    f"the run trains on at most {_IMPLAUSIBLE_TOKENS:.0e} tokens",
)
def _length_implausible(ctx: Context) -> Iterator[Finding]:
    steps, per_step = ctx.r.train_iters, ctx.r.tokens_per_step
    total = steps * per_step
    if not _IMPLAUSIBLE_TOKENS < total <= _INT64_MAX:
        return
    key = _length_key(ctx)
    fix = Fix({key: _LARGE_RUN_TOKENS if key == "train.train_tokens" else -(-_LARGE_RUN_TOKENS // per_step)})
    yield Finding(key, f"{total:.3g} tokens ({steps:,} steps of {per_step:,}) is {total / _LARGEST_RUN_TOKENS:,.0f} "
                  f"times the largest published pretraining runs ({_LARGEST_RUN_TOKENS:.0e} tokens)",
                  f"check the length; a large run of 1e12 tokens is {key.split('.')[1]} = {fix.set[key]}", fix=fix)


@rule(
    "lr-implausible",
    "warning",
    "published LLM training uses learning rates of 1e-5 to 1e-2 (Adam moves each weight by about lr per step)",
    "train.lr is at most 1",
)
def _lr_implausible(ctx: Context) -> Iterator[Finding]:
    tr, defaults = ctx.spec.train, SCHEMA["TrainSpec"]["fields"]
    if not 1.0 < tr.lr <= FLOAT32_MAX:
        return
    lr, min_lr = defaults["lr"][2], defaults["min_lr"][2]
    also = f" and min_lr = {min_lr!r}" if tr.min_lr > lr else ""
    fix = Fix({"train.lr": lr, **({"train.min_lr": min_lr} if also else {})})
    yield Finding("train.lr", f"a learning rate of {tr.lr:g}: with Adam every step moves each weight by about lr, so "
                  "the loss diverges within the first steps (LLM training uses 1e-5 to 1e-2)",
                  f"use lr = {lr!r}{also} (the defaults)" if also else f"use lr = {lr!r} (the default)", fix=fix)


#: numpy.random.seed and numpy.random.RandomState take seeds in [0, 2**32).
_SEED_LIMIT = 2**32


#: What dlmspec.backends.megatron.distributed.seed_like_megatron (as Megatron-LM's _set_random_seed) adds to the seed per
#: pipeline stage.
_SEED_PER_STAGE = 100


@rule(
    "seed-range",
    "error",
    "dlmspec.backends.megatron.distributed.seed_like_megatron (numpy.random.seed(seed + 100 * pipeline rank), as Megatron-LM "
    "_set_random_seed) and megatron-core GPTDataset (numpy.random.RandomState(random_seed)): seeds in [0, 2**32)",
    "train.seed + 100 * (pipeline stages - 1) lies in [0, 2**32)",
)
def _seed_range(ctx: Context) -> Iterator[Finding]:
    seed, pp = ctx.spec.train.seed, ctx.r.pp
    top = _SEED_LIMIT - _SEED_PER_STAGE * (pp - 1)
    if 0 <= seed < top:
        return
    stages = (f"; pipeline stage {pp - 1} seeds numpy with seed + {_SEED_PER_STAGE * (pp - 1)}" if pp > 1 else "")
    yield Finding("train.seed", f"numpy and megatron-core's data shuffling take seeds in [0, 2**32){stages}, "
                  "so the run stops at start-up", f"use a seed in [0, {top:,}), e.g. seed = 1234",
                  fix=Fix({"train.seed": 1234}))
