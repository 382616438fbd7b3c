"""Search the parallel layouts of a spec's model and cluster for the fastest that fit.

:func:`enumerate_layouts` yields every layout the cross-field rules accept (the divisibility
rules of :mod:`dlmspec.check`, as the integer tests of :mod:`dlmspec.layout`, the one
derivation of DP, microbatches and divisibility, so that thousands of layouts are screened
without building a spec each): TP, PP, virtual PP, CP, EP (and expert TP), micro
batch, recomputation (none, selective ``core_attn``, full uniform 1) and the distributed
optimizer, for the spec's fixed global batch, sequence length, GPU count and everything else.
:func:`search` plans each (memory of the ranks that can peak, step time), keeps those whose
peak fits the GPU, ranks them by tokens per second and re-checks the best with the real
rules (:func:`dlmspec.check.issues_for` with ``search``'s scopes: the spec's rules and the
runtime's) on the spec with the layout's ``--set`` values.

Ranking (:func:`rank`): layouts whose throughput is within :data:`TIE_TOLERANCE` of the fastest of
their group are tied, and a tie goes to the simpler layout (fewer parallel dimensions, then less
context, virtual-pipeline, pipeline, expert and tensor parallelism, then less recomputation);
layouts whose peak exceeds :data:`~dlmspec.plan.HEADROOM_WARNING` of the GPU's memory come after
every layout with more headroom. The spec's own values of the searched keys do not matter: the
search validates the spec with them at :data:`NEUTRAL_LAYOUT` (:func:`spec_issues_for_search`),
so a spec whose own layout breaks a rule (TP not dividing the heads, say) is still searched, and
those errors are reported as the spec's, not the candidates'.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterator

from dlmspec.check import issues_for
from dlmspec.gpus import GPU
from dlmspec.layout import (
    batch_divides, data_parallel_size, expert_data_parallel_size, expert_world_divides, num_microbatches,
)
from dlmspec.plan import HEADROOM_WARNING, SPEC_KEYS, PlanError, set_args
from dlmspec.plan.calibration import Calibration
from dlmspec.plan.provenance import calibration_for, calibration_info
from dlmspec.plan.compute import step_flops
from dlmspec.plan.memory import layer_terms, memory_plan
from dlmspec.pipeline_split import LayoutError, expand_layout
from dlmspec.plan.shape import (
    LOCAL_CP_COMM_TYPES,
    Layout,
    ModelShape,
    pipeline_fits,
    attention_path,
    cross_entropy_path,
    fast_replace,
    kernels_path,
    layout,
    model_shape,
    relayout,
    transformer_impl,
)
from dlmspec.plan.time import time_plan
from dlmspec.resolve import Resolved, padded_vocab_size
from dlmspec.wording import count

#: Recomputation settings the search tries: (granularity, method, num_layers, selective modules).
#: The selective ones are megatron-core's ``recompute_modules`` sets that recompute GEMM-free or
#: cheap parts (attention core, norms) or the MLP; the search times every one that fits and ranks
#: them by tokens/s (:func:`search`), so the cheapest to recompute is not assumed the fastest.
RECOMPUTE_CHOICES = (
    ("none", "uniform", 1, None),
    ("selective", "uniform", 1, ("core_attn",)),
    ("selective", "uniform", 1, ("layernorm",)),
    ("selective", "uniform", 1, ("core_attn", "layernorm")),
    ("selective", "uniform", 1, ("mlp",)),
    ("selective", "uniform", 1, ("core_attn", "mlp")),
    ("full", "uniform", 1, None),
)

#: Optimizer-state options the search falls back to when no layout fits with the spec's own
#: optimizer state (name, layout changes): bf16 Adam moments with the int16
#: remainders of the fp32 master (Transformer Engine's FusedAdam: 6 bytes per parameter instead of
#: 12, :mod:`dlmspec.plan.optimizer_state`), then all of the state in host memory (CPU offload).
#: Tried only for Adam with the distributed optimizer and a spec that sets none of them.
OPTIMIZER_CHOICES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("bf16-states", {"precision_aware": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}),
    ("cpu-offload", {"precision_aware": True, "cpu_offload": True}),
)

#: Micro batch sizes above this are not tried (activations grow linearly, throughput saturates).
MAX_MICRO_BATCH = 64

#: Layouts whose tokens/s are within this fraction of the fastest of their group count as tied
#: (the time model is good to ~15%, so 1% buys nothing that complexity should pay for).
TIE_TOLERANCE = 0.01

#: Spec keys the search chooses itself (an error on one of them does not stop ``--search``).
SEARCHED_KEYS = frozenset(SPEC_KEYS.values()) | {"recompute.modules", "train.global_batch_size"}

#: The layout a spec is validated at to tell its own errors from those of its layout: one GPU's
#: worth of everything (TP, PP, CP, EP 1, no interleaving, expert TP following TP, no sequence
#: parallelism, micro batch 1, no recomputation). The recomputed modules and the optimizer are
#: kept (the search uses the spec's).
NEUTRAL_LAYOUT: dict[str, Any] = {
    "parallel.tensor_model_parallel_size": 1,
    "parallel.pipeline_model_parallel_size": 1,
    "parallel.virtual_pipeline_model_parallel_size": None,
    "parallel.context_parallel_size": 1,
    "parallel.expert_model_parallel_size": 1,
    "parallel.expert_tensor_parallel_size": None,
    "parallel.sequence_parallel": False,
    "train.micro_batch_size": 1,
    "recompute.granularity": "none",
    "recompute.method": None,
    "recompute.num_layers": None,
}

#: Recomputation, least first (the tie-break prefers less).
_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}
#: Optimizer-state options, the spec's own first (the tie-break prefers it).
_STATE_ORDER = {"": 0, "precision-aware": 1, "bf16-states": 1, "cpu-offload": 2}


#: :func:`_divisors` tries at most this many divisors of a number.
_DIVISOR_TRIALS = 1 << 16


@lru_cache(maxsize=4096)
def _divisor_tuple(n: int) -> tuple[int, ...]:
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n and d <= _DIVISOR_TRIALS:
        if n % d == 0:
            small.append(d)
            if n // d != d:
                large.append(n // d)
        d += 1
    return (*small, *reversed(large))


def _divisors(n: int) -> list[int]:
    """Divisors of ``n``, ascending: every one for ``n <= 2**32`` (trial division up to the
    square root), and for larger ``n`` (absurd batch sizes) those up to 2**16 with their
    cofactors, so no ``n`` costs more than 65,536 divisions (a search over 2**25 nodes or a
    global batch of 2**40 ran for minutes, one division per integer up to ``n``)."""
    return list(_divisor_tuple(n)) if n > 0 else []


@dataclass(frozen=True)
class Candidate:
    """One planned layout.

    Attributes:
        layout: the layout.
        peak_bytes: planned per-GPU peak (with CUDA context and allocator reserve), bytes.
        peak_allocated_bytes: the allocated part, bytes.
        step_seconds, tokens_per_second, mfu: from the time model.
        changes: layout field -> value that selects it (see :func:`Candidate.set_args`).
        memory_fraction: ``peak_bytes`` / the GPU's memory.
    """

    layout: Layout
    peak_bytes: float
    peak_allocated_bytes: float
    step_seconds: float
    tokens_per_second: float
    mfu: float
    changes: tuple[tuple[str, Any], ...]
    memory_fraction: float = 0.0

    @property
    def tight(self) -> bool:
        """Whether the peak exceeds :data:`~dlmspec.plan.HEADROOM_WARNING` of the GPU's memory
        (it fits, but allocator fragmentation or an unplanned workspace can push it over)."""
        return self.memory_fraction > HEADROOM_WARNING

    def set_args(self) -> list[str]:
        """``--set key=value`` arguments that select this layout on the spec."""
        return set_args(dict(self.changes))

    def spec_changes(self) -> dict[str, Any]:
        """Dotted spec key -> value (for :meth:`dlmspec.spec.models.Spec.replace`)."""
        return {SPEC_KEYS[k]: v for k, v in self.changes}

    @property
    def label(self) -> str:
        """A short name of the layout, e.g. ``tp2-pp1-mb8-sel-distopt``: TP and PP, then
        virtual PP, CP, EP and expert TP where they are not 1 (expert TP: where it is not TP),
        the micro batch, the recomputation (``sel``, ``full``; nothing for none) and
        ``distopt`` for the distributed optimizer: what tells two candidates apart."""
        lay = self.layout
        parts = [f"tp{lay.tp}", f"pp{lay.pp}"]
        parts += [f"vpp{lay.vpp}"] if lay.vpp > 1 else []
        parts += [f"cp{lay.cp}"] if lay.cp > 1 else []
        parts += [f"ep{lay.ep}"] if lay.ep > 1 else []
        parts += [f"etp{lay.etp}"] if lay.etp != lay.tp else []
        parts.append(f"mb{lay.micro_batch}")
        parts += {"selective": ["sel"], "full": ["full"]}.get(lay.recompute, [])
        if lay.recompute == "selective" and tuple(lay.recompute_modules) != ("core_attn",):
            parts[-1] += "(" + "+".join(lay.recompute_modules) + ")"
        parts += ["distopt"] if lay.distributed_optimizer else []
        state = optimizer_state_name(lay)
        parts += [state] if state else []
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        lay = self.layout
        return {
            "tensor_model_parallel_size": lay.tp,
            "pipeline_model_parallel_size": lay.pp,
            "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
            "context_parallel_size": lay.cp,
            "expert_model_parallel_size": lay.ep,
            "expert_tensor_parallel_size": lay.etp,
            "data_parallel_size": lay.dp,
            "sequence_parallel": lay.sp,
            "micro_batch_size": lay.micro_batch,
            "num_microbatches": lay.num_microbatches,
            "recompute_granularity": lay.recompute,
            "recompute_modules": list(lay.recompute_modules) if lay.recompute == "selective" else None,
            "use_distributed_optimizer": lay.distributed_optimizer,
            "optimizer_state": optimizer_state_name(lay) or "spec",
            "peak_bytes": int(round(self.peak_bytes)),
            "peak_allocated_bytes": int(round(self.peak_allocated_bytes)),
            "memory_fraction": self.memory_fraction,
            "tight": self.tight,
            "step_seconds": self.step_seconds,
            "tokens_per_second": self.tokens_per_second,
            "mfu": self.mfu,
            "set": self.set_args(),
        }


@dataclass
class SearchResult:
    """What :func:`search` found.

    Attributes:
        enumerated: layouts the divisibility rules accept.
        evaluated: how many were planned: a layout is skipped when the same layout with less
            recomputation already fits (it would only be slower).
        fitting: how many planned layouts fit the GPU.
        checked: how many of the fastest fitting ones were re-checked with the validator.
        rejected_by_validator: of those, how many the validator refused (with one reason each).
        top: the best ``top`` valid fitting layouts, fastest first.
        smallest: the layout with the smallest peak (reported when nothing fits).
        capacity_bytes: the GPU's memory.
        message: a one-line summary (why nothing fits, when nothing does).
        tight: how many fitting layouts exceed :data:`~dlmspec.plan.HEADROOM_WARNING` of the GPU's
            memory (ranked after the others).
        spec_layout_issues: errors of the spec's own layout (the values of the searched keys
            it was given), which do not apply to the layouts found; the CLI fills them in
            (:func:`spec_issues_for_search`).
        calibration: the constants the layouts were planned with
            (:func:`dlmspec.plan.provenance.calibration_info`: ``status``, ``fitted_on``, ``text``, ...).
    """

    enumerated: int
    evaluated: int
    fitting: int
    checked: int
    top: list[Candidate]
    smallest: Candidate | None
    capacity_bytes: int
    message: str
    rejected_by_validator: list[tuple[Candidate, str]] = field(default_factory=list)
    tight: int = 0
    spec_layout_issues: list[Any] = field(default_factory=list)
    calibration: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``dlmspec plan --search --json``; ``spec_layout_issues`` as
        ``{"rule", "key", "value", "message"}``)."""
        return {
            "enumerated": self.enumerated,
            "evaluated": self.evaluated,
            "fitting": self.fitting,
            "checked_with_validator": self.checked,
            "capacity_bytes": self.capacity_bytes,
            "headroom_fraction": HEADROOM_WARNING,
            "tight": self.tight,
            "message": self.message,
            "calibration": self.calibration,
            "spec_layout_issues": [{"rule": i.rule, "key": i.key, "value": i.value, "message": i.message}
                                   for i in self.spec_layout_issues],
            "top": [c.to_dict() for c in self.top],
            "smallest_peak": self.smallest.to_dict() if self.smallest else None,
            "rejected_by_validator": [{"layout": c.to_dict(), "reason": why} for c, why in self.rejected_by_validator],
        }


def optimizer_state_name(lay: Layout) -> str:
    """The :data:`OPTIMIZER_CHOICES` name of ``lay``'s optimizer-state options, ``""`` for none."""
    if lay.cpu_offload:
        return "cpu-offload"
    if lay.precision_aware:
        return "bf16-states" if (lay.exp_avg_dtype, lay.exp_avg_sq_dtype) == ("bf16", "bf16") else "precision-aware"
    return ""


def _optimizer_choices(base: Layout, distopt: bool, state_options: bool) -> list[tuple[str, dict[str, Any]]]:
    """The spec's own optimizer state (``("", {})``), or with ``state_options`` the
    :data:`OPTIMIZER_CHOICES` (for Adam on the distributed optimizer when the spec sets no state
    option; none otherwise)."""
    if not state_options:
        return [("", {})]
    if distopt and base.optimizer == "adam" and not (base.precision_aware or base.cpu_offload) and base.fsdp == "none":
        return list(OPTIMIZER_CHOICES)
    return []


def _selective_sets(shape: ModelShape, base: Layout, layernorm: bool = True) -> list[tuple[str, ...]]:
    """The selective module sets of :data:`RECOMPUTE_CHOICES` for this model and path: the spec's
    own modules first (when it names any), 'layernorm' not on Transformer Engine's dense layers
    (the norm is fused into the next linear: nothing to recompute, rule recompute-layernorm-te;
    ``layernorm=False`` where the run may take them, ``transformer_impl = "auto"``),
    'mlp' not on an all-MoE model."""
    dense = not shape.is_moe or 0 in shape.moe_layers
    sets: list[tuple[str, ...]] = []
    for gran, _, _, modules in RECOMPUTE_CHOICES:
        if gran != "selective" or modules is None:
            continue
        if "layernorm" in modules and (not layernorm or base.impl == "transformer_engine") and not shape.is_moe:
            continue
        if "mlp" in modules and not dense:
            continue
        sets.append(modules)
    own = tuple(base.recompute_modules)
    return [own] + [m for m in sets if m != own] if own and own not in sets else sets


def _tp_ok(shape: ModelShape, tp: int) -> bool:
    """``tp-divides-heads``, ``tp-divides-query-groups`` (or groups replicated over TP) and
    ``tp-divides-ffn`` of :mod:`dlmspec.check.parallel`."""
    if shape.heads % tp:
        return False
    if shape.groups % tp and tp % shape.groups:
        return False
    dense = not shape.is_moe or 0 in shape.moe_layers
    return not (dense and shape.ffn % tp)


def _split_vpps(shape: ModelShape, base: Layout, pp: int) -> list[int]:
    """Virtual sizes (1: no interleaving) at which megatron-core builds ``base``'s pipeline split on
    ``pp`` ranks (:func:`dlmspec.plan.shape.pipeline_fits`); empty: none. The even split: 1 and
    the divisors of ``L / pp`` above 1 when PP > 1, nothing when PP does not divide ``L``."""
    L = shape.num_layers
    if base.pipeline_split is None:
        if L % pp:
            return []
        return [1] + [v for v in _divisors(L // pp) if v > 1 and pp > 1]
    # a valid VPP divides L (first/last counts), L + 1 or L + 2 (accounting), or is the layout's
    # stage count over PP
    candidates = {v for n in (L, L + 1, L + 2) for v in _divisors(n)} if pp > 1 else set()
    layout = base.pipeline_split[4]
    if layout is not None and pp > 1:
        try:
            candidates.add(max(1, len(expand_layout(layout)) // pp))
        except LayoutError:  # a layout string megatron-core cannot parse: validate reports it; no extra candidate
            pass
    return [v for v in sorted(candidates | {1}) if pipeline_fits(shape, base, pp, v)]


def enumerate_layouts(shape: ModelShape, base: Layout, *, allow_cp: bool = True, cp_comm_type: str = "p2p",
                      max_micro_batch: int = MAX_MICRO_BATCH,
                      state_options: bool = False, layernorm_recompute: bool = True) -> Iterator[tuple[Layout, dict[str, Any]]]:
    """Every layout of ``base``'s cluster and batch the divisibility rules accept, with the
    layout changes that select it. Deterministic order.

    Rules (ids of :data:`dlmspec.check.RULES`): world divisible by TP*PP*CP and by ETP*EP*PP; TP
    within a node and dividing heads, query groups (or a multiple of them) and the FFN; PP
    dividing the layers; CP > 1 only with Transformer Engine, ``seq % (2*CP) == 0``, and with
    ``a2a`` the heads per TP rank divisible by CP; sequence parallelism on for TP > 1 (and then
    ``(seq/CP) % TP == 0``); EP dividing the experts, expert TP dividing the expert FFN;
    ``global_batch % (micro_batch * DP) == 0``; interleaving only with PP > 1, layers per stage
    divisible by VPP and microbatches a positive multiple of PP.
    """
    world = base.world
    selective = _selective_sets(shape, base, layernorm_recompute)
    own_modules = tuple(base.recompute_modules)
    for tp in _divisors(world):
        if tp > base.gpus_per_node or not _tp_ok(shape, tp):
            continue
        for pp in _divisors(world // tp):
            split_vpps = _split_vpps(shape, base, pp)
            if not split_vpps:
                continue
            for cp in _divisors(world // (tp * pp)):
                if cp > 1 and (not allow_cp or base.seq % (2 * cp)):
                    continue
                if cp > 1 and cp_comm_type == "a2a" and (shape.heads // tp) % cp:
                    continue
                sp = tp > 1
                if sp and (base.seq // cp) % tp:
                    continue
                dp = data_parallel_size(world, tp, pp, cp)  # exact: tp*pp*cp divides world here
                if not batch_divides(base.global_batch, 1, dp):
                    continue
                for ep, etp in _expert_choices(shape, world, tp, pp):
                    for mbs in _divisors(base.global_batch // dp):
                        if mbs > max_micro_batch:
                            break
                        m = num_microbatches(base.global_batch, mbs, dp)  # exact: mbs divides gbs/dp
                        vpps = [v for v in split_vpps if v == 1 or (m >= pp and m % pp == 0)]
                        for v in vpps:
                            expert_dp = expert_data_parallel_size(world, etp, ep, pp)
                            distopts = (True, False) if dp * cp > 1 or (shape.is_moe and expert_dp > 1) \
                                else (base.distributed_optimizer,)
                            # The optimizer state (the spec's first), then recomputation
                            # innermost, cheapest first: the search skips full recomputation once
                            # a cheaper one fits (it is the slowest), times every selective set
                            # that fits, and tries a state option only where the spec's own state
                            # fits nowhere (:func:`search`).
                            for distopt, (_, state_changes), (gran, method, nlayers, modules) in (
                                    (d, st, rc) for d in distopts for st in _optimizer_choices(base, d, state_options)
                                    for rc in RECOMPUTE_CHOICES):
                                if gran == "selective" and modules not in selective:
                                    continue
                                changes: dict[str, Any] = {
                                    "tp": tp, "pp": pp, "cp": cp, "sp": sp, "micro_batch": mbs,
                                    "distributed_optimizer": distopt,
                                }
                                if v > 1:
                                    changes["vpp"] = v
                                if shape.is_moe:
                                    changes["ep"] = ep
                                    changes["etp"] = etp
                                changes["recompute"] = gran
                                if gran == "full":
                                    changes["recompute_method"] = method
                                    changes["recompute_layers"] = nlayers
                                if gran == "selective" and modules != own_modules:
                                    changes["recompute_modules"] = modules
                                changes.update(state_changes)
                                lay = fast_replace(
                                    base, tp=tp, pp=pp, vpp=v, cp=cp, ep=ep, etp=etp, dp=dp,
                                    expert_dp=expert_dp, sp=sp, micro_batch=mbs,
                                    num_microbatches=m, recompute=gran, recompute_method=method,
                                    recompute_layers=nlayers,
                                    recompute_modules=modules if gran == "selective" else base.recompute_modules,
                                    distributed_optimizer=distopt, **state_changes,
                                )
                                yield lay, changes


def _expert_choices(shape: ModelShape, world: int, tp: int, pp: int) -> list[tuple[int, int]]:
    """(EP, expert TP) pairs: dense models (1, TP); MoE: EP dividing the experts, expert TP of
    TP or 1, with ``world % (etp*ep*pp) == 0`` and the expert FFN divisible by expert TP."""
    if not shape.is_moe:
        return [(1, tp)]
    out = []
    for etp in sorted({tp, 1}, reverse=True):
        if shape.expert_ffn % etp:
            continue
        for ep in _divisors(shape.num_experts):
            if not expert_world_divides(world, etp, ep, pp):
                continue
            out.append((ep, etp))
    return out


def _shape_for(shape: ModelShape, tp: int, cache: dict[int, ModelShape]) -> ModelShape:
    got = cache.get(tp)
    if got is None:
        got = replace(shape, vocab=padded_vocab_size(shape.tokenizer_vocab, shape.vocab_divisible_by, tp))
        cache[tp] = got
    return got


class _Caches:
    """Per-search caches of the parts of a plan that many layouts share: per-layer activation
    terms (they depend on TP, SP, CP, micro batch, expert TP, recomputation and the layer
    path, not on PP or the optimizer), step FLOPs and per-stage work (:func:`stage_work`)."""

    def __init__(self) -> None:
        self.terms: dict[tuple, Any] = {}
        self.flops: dict[tuple, Any] = {}
        self.works: dict[tuple, Any] = {}

    def layer_terms(self, shape: ModelShape, lay: Layout):
        key = (lay.tp, lay.sp, lay.cp, lay.micro_batch, lay.etp, lay.recompute, lay.recompute_modules, lay.impl)
        got = self.terms.get(key)
        if got is None:
            got = self.terms[key] = layer_terms(shape, lay)
        return got

    def step_flops(self, shape: ModelShape, lay: Layout):
        key = (shape.vocab, lay.recompute, lay.recompute_method, lay.recompute_layers, lay.recompute_modules,
               lay.pp * lay.vpp)
        got = self.flops.get(key)
        if got is None:
            got = self.flops[key] = step_flops(shape, lay)
        return got


def evaluate(shape: ModelShape, lay: Layout, gpu: GPU, calib: Calibration, changes: dict[str, Any],
             caches: _Caches | None = None, *, time_all: bool = True) -> Candidate:
    """Plan one layout: memory of the ranks that can peak, then - when it fits the GPU or
    ``time_all`` - the step time of the slower of the first and last rank (a layout that does
    not fit gets ``step_seconds = inf``)."""
    caches = caches or _Caches()
    mem = memory_plan(shape, lay, calib, all_stages=False, terms=caches.layer_terms(shape, lay))
    peak = mem.peak
    if time_all or peak.peak_bytes <= gpu.memory_bytes:
        tp = time_plan(shape, lay, gpu, calib, all_stages=False, flops=caches.step_flops(shape, lay),
                       work_cache=caches.works)
        step, tps, mfu = tp.step_seconds, tp.tokens_per_second, tp.mfu
    else:
        step, tps, mfu = float("inf"), 0.0, 0.0
    return Candidate(
        layout=lay,
        peak_bytes=peak.peak_bytes,
        peak_allocated_bytes=peak.peak_allocated_bytes,
        step_seconds=step,
        tokens_per_second=tps,
        mfu=mfu,
        changes=tuple(changes.items()),
        memory_fraction=peak.peak_bytes / gpu.memory_bytes,
    )


def simplicity(lay: Layout) -> tuple[int, ...]:
    """Sort key of a layout's complexity, simplest first: the number of parallel dimensions in
    use (TP, PP, virtual PP, CP, EP), then the context, virtual-pipeline, pipeline, expert and
    tensor parallel sizes (CP splits every sequence and needs Transformer Engine; interleaving
    and pipelining add schedule and p2p traffic), then recomputation (none, selective, full)."""
    dims = sum(1 for n in (lay.tp, lay.pp, lay.cp, lay.ep) if n > 1) + (1 if lay.vpp > 1 else 0)
    return (dims, lay.cp, lay.vpp, lay.pp, lay.ep, lay.tp, _RECOMPUTE_ORDER.get(lay.recompute, 3),
            _STATE_ORDER.get(optimizer_state_name(lay), 3))


def rank(candidates: list[Candidate], tolerance: float = TIE_TOLERANCE) -> list[Candidate]:
    """Rank fitting layouts, best first; deterministic for any input order.

    By tokens/s, fastest first, in tie groups: from the fastest layout not yet ranked, every
    layout within ``tolerance`` (relative) of it is tied with it, and a group is ordered by
    :func:`simplicity`, then smaller peak, then the layout's ``--set`` changes. Then layouts that
    are :attr:`Candidate.tight` on memory move after every other (in the same order among
    themselves): the top pick keeps headroom when any layout does.
    """
    fastest = sorted(candidates, key=lambda c: (-c.tokens_per_second, c.peak_bytes, c.changes))
    out: list[Candidate] = []
    i = 0
    while i < len(fastest):
        floor = fastest[i].tokens_per_second * (1 - tolerance)
        j = i + 1
        while j < len(fastest) and fastest[j].tokens_per_second >= floor:
            j += 1
        out.extend(sorted(fastest[i:j], key=lambda c: (simplicity(c.layout), c.peak_bytes, c.changes)))
        i = j
    return [c for c in out if not c.tight] + [c for c in out if c.tight]


def neutral_layout_spec(spec: Any) -> Any:
    """``spec`` with the searched keys at :data:`NEUTRAL_LAYOUT` (``spec`` itself when that
    does not validate)."""
    try:
        return spec.replace(**NEUTRAL_LAYOUT)
    except Exception:  # pydantic ValidationError: keep the spec as written
        return spec


def spec_issues_for_search(loaded: Any, resolved: Resolved, issues: list[Any]) -> tuple[list[Any], list[Any]]:
    """Split a spec's validator errors for ``--search``.

    Args:
        loaded: the :class:`~dlmspec.spec.load.LoadedSpec` (file and line for issues) or a bare spec.
        resolved: ``resolve(loaded.spec)``.
        issues: the spec's issues as written (``plan``'s, :func:`dlmspec.check.issues_for`).

    Returns:
        ``(blocking, own_layout)``: ``blocking`` are the errors the spec has at
        :data:`NEUTRAL_LAYOUT` on keys the search does not set (its model, cluster, data... -
        the search cannot fix them); ``own_layout`` are the errors of the spec as written that
        the neutral layout does not have: they come from the values of the searched keys it was
        given (a TP that does not divide the FFN is reported on ``model.ffn_hidden_size``) and
        do not apply to the layouts the search finds. Memory rules are left out of both.
    """
    from dataclasses import replace as dc_replace

    from dlmspec.spec.load import LoadedSpec
    from dlmspec.resolve import resolve

    spec = loaded.spec if isinstance(loaded, LoadedSpec) else loaded
    errors = [i for i in issues if i.severity == "error" and not i.rule.startswith("memory-")]
    neutral = neutral_layout_spec(spec)
    if neutral is spec:
        return [e for e in errors if e.key not in SEARCHED_KEYS], []
    target = dc_replace(loaded, spec=neutral) if isinstance(loaded, LoadedSpec) else neutral
    at_neutral = [i for i in issues_for("spec", target, resolve(neutral))
                  if i.severity == "error" and not i.rule.startswith("memory-")]
    blocking = [e for e in at_neutral if e.key not in SEARCHED_KEYS]
    seen = {(e.rule, e.key) for e in at_neutral}
    own_layout = [e for e in errors if (e.rule, e.key) not in seen]
    return blocking, own_layout


def _errors(spec: Any, resolved: Resolved) -> list[Any]:
    """Errors of ``search``'s scopes (:func:`dlmspec.check.issues_for`: the spec's rules and the
    runtime's; not memory, which the search plans itself)."""
    return [i for i in issues_for("search", spec, resolved) if i.severity == "error"]


def layout_changes(spec: Any, cand: Candidate) -> dict[str, Any]:
    """Dotted key -> value that put ``spec`` (a :class:`~dlmspec.spec.models.Spec`) at
    ``cand``'s layout with :meth:`~dlmspec.spec.models.Spec.replace`: its ``--set`` values, and
    the spec's own settings the layout has no use for cleared (interleaving without VPP, the
    full-recompute method and layers, the selective modules, sequence parallelism)."""
    changes: dict[str, Any] = cand.spec_changes()
    lay = cand.layout
    if lay.vpp <= 1 and spec.parallel.virtual_pipeline_model_parallel_size is not None:
        changes["parallel.virtual_pipeline_model_parallel_size"] = None
    if lay.recompute != "full":
        changes["recompute.method"] = None
        changes["recompute.num_layers"] = None
    if lay.recompute != "selective":
        changes["recompute.modules"] = None
    if not lay.sp:
        changes["parallel.sequence_parallel"] = False
    return changes


def _validator_errors(resolved: Resolved, cand: Candidate, known: set[tuple[str, str]]) -> str | None:
    """The first error the validator reports for the spec with ``cand``'s changes that the
    spec itself does not already have (``known``: (rule, key) pairs), or None."""
    spec = resolved.spec
    try:
        new_spec = spec.replace(**layout_changes(spec, cand))
    except Exception as exc:  # pydantic ValidationError: report, never raise
        return f"the spec rejects the layout: {str(exc).splitlines()[0]}"
    from dlmspec.resolve import resolve

    for issue in _errors(new_spec, resolve(new_spec)):
        if (issue.rule, issue.key) not in known:
            return f"{issue.rule}: {issue.key}: {issue.message}"
    return None


def search(resolved: Resolved, top: int = 5, calibration: Calibration | None = None, *,
           validate: bool = True, max_checks: int = 200, time_all: bool = False,
           state_options: bool = True) -> SearchResult:
    """Find the fastest layouts of ``resolved``'s model and cluster that fit the GPU.

    Args:
        resolved: the spec (its model, GPU count, global batch, sequence length, precision,
            objective and everything not searched are kept).
        top: how many layouts to return.
        calibration: constants (default: the layer path's own, :func:`dlmspec.plan.provenance.calibration_for`, as make_plan takes them).
        validate: re-check the fastest fitting layouts with the validator (slower: one spec
            build per layout checked).
        max_checks: at most this many fitting layouts are re-checked.
        time_all: also time the layouts that do not fit (only the fitting ones are ranked;
            ``bench/plan/bench_search.py`` sets it to measure the worst case).
        state_options: when no layout fits with the spec's own optimizer state, search again with
            :data:`OPTIMIZER_CHOICES` (``dlmspec new`` leaves them out: a starter spec keeps fp32
            state and asks for more nodes instead).

    Returns:
        A :class:`SearchResult`; ``top`` ranked by :func:`rank` (tokens/s, ties to the simpler
        layout, layouts above :data:`~dlmspec.plan.HEADROOM_WARNING` of memory last), empty when
        nothing fits, and ``message`` says why (the smallest peak found against the GPU's
        memory). The spec's own values of the searched keys are ignored
        (:data:`NEUTRAL_LAYOUT`), valid or not.

    Raises:
        PlanError: the GPU is not in the catalog.
    """
    if resolved.gpu is None:
        raise PlanError(f"cluster.gpu = {resolved.spec.cluster.gpu!r} is not in the GPU catalog (dlmspec show --gpus)")
    gpu = resolved.gpu
    # The layer path is the spec's (auto with CP > 1 but not allgather means Transformer Engine); everything else
    # comes from the spec at the neutral layout, so a spec whose own layout breaks a rule is
    # searched like any other and its errors are not taken for the candidates'.
    modelled, _ = transformer_impl(resolved)
    # the path's own constants, as make_plan takes them (calibration_for: the local ones for a path without a fit)
    calib = calibration or calibration_for(modelled)[0]
    spec = neutral_layout_spec(resolved.spec)
    if spec is not resolved.spec:
        from dlmspec.resolve import resolve

        resolved = resolve(spec)
    shape0 = model_shape(resolved)
    base = layout(resolved, modelled)
    # Every layout is modelled on the spec's layer path. Context parallelism is searched where
    # that path has it: Transformer Engine (transformer_impl = transformer_engine, or auto with
    # fp8 / CP other than allgather / grouped GEMM, which require it) without block-causal masks,
    # and the local layers with cp_comm_type = allgather (shape.LOCAL_CP_COMM_TYPES).
    local_cp = spec.parallel.cp_comm_type in LOCAL_CP_COMM_TYPES
    allow_cp = (modelled == "transformer_engine" and resolved.attention_mask != "block_causal") or (
        modelled != "transformer_engine" and local_cp)
    shapes: dict[int, ModelShape] = {}
    cap = gpu.memory_bytes
    fitting: list[Candidate] = []
    smallest: Candidate | None = None
    enumerated = evaluated = 0
    caches = _Caches()
    # Layouts that fit with headroom: without recomputation (more is slower) and with some
    # recomputation (full is slower than any selective set), per layout and optimizer state.
    fitted_none: set[tuple] = set()
    fitted_some: set[tuple] = set()
    # The spec's own optimizer state first; the state options (OPTIMIZER_CHOICES) only when no layout
    # fits with it, so a spec that fits is searched as before and one that does not is told which
    # option places it.
    layernorm = resolved.transformer_impl == "local"  # 'layernorm' recomputes nothing on TE's dense layers
    state_pass = False
    for with_options in (False, True) if state_options else (False,):
        if with_options and fitting:
            break
        state_pass = with_options
        for lay, changes in enumerate_layouts(shape0, base, allow_cp=allow_cp, cp_comm_type=spec.parallel.cp_comm_type,
                                              state_options=with_options, layernorm_recompute=layernorm):
            enumerated += 1
            group = (lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp, lay.micro_batch, lay.distributed_optimizer,
                     optimizer_state_name(lay))
            if group in fitted_none or (lay.recompute == "full" and group in fitted_some):
                continue  # the same layout with less recomputation fits with headroom: this one is slower
            evaluated += 1
            cand = evaluate(_shape_for(shape0, lay.tp, shapes), lay, gpu, calib, changes, caches, time_all=time_all)
            if cand.peak_bytes <= cap:
                fitting.append(cand)
                if not cand.tight:  # a tight fit still tries more recomputation, for headroom
                    (fitted_none if lay.recompute == "none" else fitted_some).add(group)
            if smallest is None or cand.peak_bytes < smallest.peak_bytes:
                smallest = cand
    fitting = rank(fitting)
    tight = sum(1 for c in fitting if c.tight)
    chosen: list[Candidate] = []
    rejected: list[tuple[Candidate, str]] = []
    checked = 0
    # Errors the spec has at the neutral layout on keys the search does not set are not the
    # candidates' doing (the CLI stops on them before searching); any other error rejects one.
    known = ({(i.rule, i.key) for i in _errors(spec, resolved) if i.key not in SEARCHED_KEYS}
             if validate and fitting else set())
    for cand in fitting:
        if len(chosen) >= top:
            break
        if validate:
            if checked >= max_checks:
                break
            checked += 1
            why = _validator_errors(resolved, cand, known)
            if why is not None:
                rejected.append((cand, why))
                continue
        chosen.append(cand)
    gib = 1024**3
    one_gpu = resolved.spec.cluster.nodes * resolved.spec.cluster.gpus_per_node == 1
    cp_note = ("" if allow_cp or one_gpu or resolved.attention_mask == "block_causal" else
               "; context parallelism on the local layers needs cp_comm_type = \"allgather\" and was "
               "not searched (set parallel.cp_comm_type = \"allgather\", or model.transformer_impl = "
               "\"transformer_engine\", to include it)")
    if chosen:
        message = (f"{len(fitting)} of {evaluated} planned layouts fit the {cap / gib:.1f} GiB of one {gpu.name} "
                   f"({enumerated} enumerated; {enumerated - evaluated} skipped: more recomputation than a "
                   "fitting variant)")
        if state_pass:
            message += ("; none fits with the spec's fp32 optimizer state: these keep it in bf16 or in host memory "
                        "(the opt. state column, train.use_precision_aware_optimizer and its keys in the --set lines)")
        if tight:
            message += (f"; {tight} use more than {HEADROOM_WARNING:.0%} of the memory and rank after those "
                        "with headroom" + (" (none has more)" if all(c.tight for c in fitting) else ""))
    elif fitting:
        message = (f"{len(fitting)} of {evaluated} planned layouts fit the memory, but the validator rejected the "
                   f"{checked} fastest (first reason: {rejected[0][1] if rejected else 'n/a'})")
    elif smallest is not None:
        message = (f"no layout fits: the smallest peak of the {enumerated} layouts is "
                   f"{smallest.peak_bytes / gib:.1f} GiB per GPU ({' '.join(smallest.set_args())}) against "
                   f"{cap / gib:.1f} GiB of one {gpu.name}; use more GPUs, a GPU with more memory, a shorter "
                   "sequence or a smaller global batch")
    else:
        message = (f"no layout satisfies the divisibility rules for {count(base.world, 'GPU')}, global batch "
                   f"{base.global_batch} and sequence length {base.seq}; change the GPU count or the batch")
    return SearchResult(
        enumerated=enumerated,
        evaluated=evaluated,
        fitting=len(fitting),
        checked=checked,
        top=chosen,
        smallest=smallest,
        capacity_bytes=cap,
        message=message + cp_note,
        rejected_by_validator=rejected,
        tight=tight,
        calibration=calibration_info(modelled, custom=calibration is not None),
    )


def plan_candidate(resolved: Resolved, cand: Candidate, calibration: Calibration | None = None):
    """The full :class:`~dlmspec.plan.Plan` (every stage) of a search candidate."""
    from dlmspec.plan import host_launch_path, plan_layout

    shape = model_shape(resolved)
    shape, lay = relayout(shape, layout(resolved, cand.layout.impl), **dict(cand.changes))
    lay = replace(lay, impl=cand.layout.impl)
    runtime = {"transformer_impl": transformer_impl(resolved)[1], "spec_transformer_impl": resolved.spec.model.transformer_impl,
               "modelled_as": lay.impl, "cross_entropy": cross_entropy_path(lay),
               "attention": attention_path(lay, resolved.gpu.compute_capability, shape),
               "kernels": kernels_path(shape, lay),
               "host_launch": host_launch_path(lay, calibration or calibration_for(lay.impl)[0])}
    return plan_layout(resolved.spec.name, shape, lay, resolved.gpu, runtime, calibration or calibration_for(lay.impl)[0])
