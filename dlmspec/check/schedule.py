"""Rules of the training length and the optimizer's schedule: the budget, the learning rate and
its warmup and decay (WSD), evaluation, the seed, and lengths beyond int64 or every published run."""

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
