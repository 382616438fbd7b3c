"""``from dlmspec.dsl import Spec``: the spec class Python specs start from.

:class:`Spec` is :class:`dlmspec.spec.models.Spec` (same keys as TOML, validated on assignment,
``.replace``) with two starting points: :meth:`Spec.from_preset` (what ``dlmspec new --preset``
writes) and :meth:`Spec.load` (a bundled spec or a TOML file), and sweep makers:
:meth:`Spec.layouts` (the best layouts ``dlmspec plan --search`` finds) and, for scaling studies,
:meth:`Spec.shapes` (a family of model shapes by size, :class:`ShapeRule`), :meth:`Spec.isoflop`
(an isoFLOP sweep) and :meth:`Spec.data_constrained` (a size x unique tokens x epochs grid). ``docs/python.md`` is the guide;
:mod:`dlmspec.spec.python` records where each value was set. Nothing in dlmspec imports this
module (it reaches the CLI's starter spec and the bundled specs, above the spec models).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from dlmspec.spec import models


class Spec(models.Spec):
    """A whole training job (:class:`dlmspec.spec.models.Spec`) with the DSL's starting points."""

    @classmethod
    def from_preset(cls, preset: str, *, gpus: int | None = None, name: str | None = None,
                    **options: Any) -> models.Spec:
        """The starter spec ``dlmspec new OUT --preset PRESET`` writes, e.g.
        ``Spec.from_preset("llada-8b", gpus=64)``: :func:`from_preset`."""
        return from_preset(preset, gpus=gpus, name=name, **options)

    @classmethod
    def load(cls, name_or_path: str) -> models.Spec:
        """A bundled spec (``Spec.load("demo-dlm")``) or a TOML spec file: :func:`load_spec`."""
        return load_spec(name_or_path)

    @classmethod
    def layouts(cls, spec: models.Spec, *, top: int = 3) -> dict[str, models.Spec]:
        """A sweep of the ``top`` fastest layouts that fit, as ``dlmspec plan --search`` ranks
        them, e.g. ``spec = Spec.layouts(base, top=3)``: :func:`layouts`."""
        return layouts(spec, top=top)

    @classmethod
    def shapes(cls, base: models.Spec, sizes: Any, *, rule: "ShapeRule | None" = None) -> dict[str, models.Spec]:
        """``base`` at each model size (non-embedding parameters), shaped by ``rule``, e.g.
        ``Spec.shapes(base, [1e6, 2e6, 4e6])``: :func:`shapes`."""
        return shapes(base, sizes, rule=rule)

    @classmethod
    def isoflop(cls, base: models.Spec, budgets: Any, sizes: Any, *,
                rule: "ShapeRule | None" = None) -> dict[str, models.Spec]:
        """An isoFLOP sweep: each size trained for the steps that spend each budget (training
        FLOPs as the planner counts them), e.g. ``Spec.isoflop(base, [1e14, 3e14], [1e6, 2e6])``:
        :func:`isoflop`."""
        return isoflop(base, budgets, sizes, rule=rule)

    @classmethod
    def data_constrained(cls, base: models.Spec, sizes: Any, unique_tokens: Any, epochs: Any, *,
                         rule: "ShapeRule | None" = None) -> dict[str, models.Spec]:
        """A (size x unique tokens x epochs) grid, the training data capped at the unique tokens,
        e.g. ``Spec.data_constrained(base, [2e6], [3e5, 1e6], [1, 4])``: :func:`data_constrained`."""
        return data_constrained(base, sizes, unique_tokens, epochs, rule=rule)



def from_preset(preset: str, *, gpus: int | None = None, name: str | None = None, **options: Any) -> Any:
    """``Spec.from_preset``: the starter spec ``dlmspec new OUT --preset PRESET`` writes (mock
    data, bf16, a 1,000-step cosine schedule, a layout that fits), as a ``Spec``.

    Args:
        preset: a preset id (``dlmspec show --presets``).
        gpus: GPUs in all: up to 8 on one node, else a multiple of 8 (8 per node); or give
            ``nodes`` and ``gpus_per_node``.
        name: the run's name (default: the preset id).
        options: ``objective`` (``"mdm"`` or ``"ar"``), ``gpu``, ``nodes``, ``gpus_per_node``,
            ``seq_length``: ``dlmspec new``'s options.

    Raises:
        SpecError: an unknown preset or option, a GPU count that does not split into nodes, a
            model that does not fit on any layout of those GPUs.
    """
    import tomllib

    from dlmspec.cli.commands.new import starter_text
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.spec.models import Spec
    from dlmspec.spec.python import record_of, templates_in

    allowed = {"objective", "gpu", "nodes", "gpus_per_node", "seq_length"}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise SpecError([SpecIssue(unknown[0], "not an option of Spec.from_preset", value=options[unknown[0]],
                                   hint="options: gpus, name, " + ", ".join(sorted(allowed)), rule="python")])
    if gpus is not None:
        if not isinstance(gpus, int) or gpus < 1 or (gpus > 8 and gpus % 8):
            raise SpecError([SpecIssue("gpus", "a GPU count is 1 to 8 (one node) or a multiple of 8 (8 per node)",
                                       value=gpus, hint="e.g. gpus=8 or gpus=16, or give nodes= and "
                                       "gpus_per_node=", rule="python")])
        options.setdefault("nodes", max(1, gpus // 8))
        options.setdefault("gpus_per_node", min(gpus, 8))
    text = starter_text(name or preset, preset, **options)
    data = tomllib.loads(text)
    spec = Spec.model_validate(data)
    record_of(spec, create=True).templates.update(templates_in(data))
    return spec


def load_spec(name_or_path: str | Path) -> Any:
    """``Spec.load``: a bundled spec by name (``"demo-dlm"``: ``specs/demo-dlm.toml``) or a
    TOML spec file, as a ``Spec``; issues found later point at that file's lines.

    Raises:
        SpecError: no such bundled spec or file, or the file does not load.
    """
    import dlmspec.resolve  # noqa: F401 - gives the loader its check of lock/show files' written defaults
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.spec.load import load
    from dlmspec.spec.python import _note, record_of, templates_in

    path = Path(name_or_path)
    if not path.suffix:
        from dlmspec.cli.commands.new import bundled_specs

        specs = bundled_specs()
        if str(name_or_path) not in specs:
            raise SpecError([SpecIssue("Spec.load", "not a bundled spec (nor a file path ending in .toml)",
                                       value=str(name_or_path), hint="one of: " + ", ".join(specs), rule="python")])
        path = Path(str(specs[str(name_or_path)]))
    loaded = load(path)
    spec = loaded.spec
    record = record_of(spec, create=True)
    record.templates.update(templates_in(loaded.raw))
    _note(record, dict(loaded.origins))
    return spec


def layouts(spec: models.Spec, *, top: int = 3) -> dict[str, models.Spec]:
    """``Spec.layouts``: the ``top`` best layouts :func:`dlmspec.plan.search.search` finds for
    ``spec``'s model, cluster and batch (what ``dlmspec plan SPEC --search --top TOP`` prints, in
    its order), each as ``spec`` with that layout's values
    (:func:`dlmspec.plan.search.layout_changes`), named ``<spec name>-<layout>``
    (:attr:`dlmspec.plan.search.Candidate.label`, e.g. ``demo-dlm-tp1-pp1-mb32-distopt``): a
    dict of name -> Spec, the form a sweep takes. Run paths written with ``{name}`` follow
    each member's name. Fewer than ``top`` when fewer layouts fit.

    Raises:
        SpecError: ``top`` below 1; an error of ``spec`` the search cannot fix (its model,
            cluster or data); a GPU not in the catalog; no layout that fits (the issue says
            what would). Issues without a line of their own point at the user's call.
    """
    from dlmspec.check import issues_for
    from dlmspec.cli.plan import nothing_fits
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.plan import PlanError
    from dlmspec.plan.search import layout_changes, search, spec_issues_for_search
    from dlmspec.resolve import resolve
    from dlmspec.spec.python import collect, user_frame

    frame = user_frame(2)
    here = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else (None, None)
    hint = (" (from Spec.layouts(..., top=N), which keeps the layouts dlmspec plan --search finds: "
            "fix the spec it is given)")

    def failed(issues: list[SpecIssue]) -> SpecError:
        origins = collect(spec)
        for issue in issues:
            if issue.line is None:
                issue.file, issue.line = origins.get(issue.key, here)
            issue.hint = (issue.hint or "") + hint
        return SpecError(issues)

    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise failed([SpecIssue("top", "Spec.layouts keeps at least one layout", value=top,
                                hint="e.g. Spec.layouts(base, top=3)", rule="python")])
    resolved = resolve(spec)
    issues = issues_for("plan", spec, resolved)
    blocking, _ = spec_issues_for_search(spec, resolved, issues)
    if blocking:
        raise failed(blocking)
    try:
        result = search(resolved, top=top)
    except PlanError as exc:
        raise failed([SpecIssue("cluster.gpu", str(exc), value=spec.cluster.gpu, rule="plan")]) from None
    if not result.top:
        raise failed([nothing_fits(resolved, result)])
    out: dict[str, models.Spec] = {}
    for cand in result.top:
        name = f"{spec.name}-{cand.label}"
        while name in out:  # labels tell layouts apart; a guard, not a naming scheme
            name += "-2"
        out[name] = spec.replace(name=name, **layout_changes(spec, cand))
    return out


# --- Scaling studies: model shapes by size, isoFLOP sweeps, data-constrained grids ------------------------------------
#
# Definitions used throughout (stated once):
#   N  the model's non-embedding parameters, as dlmspec/params.py counts them
#      (``count_parameters(model).non_embedding``: every parameter but the input embedding, the untied
#      output layer and learned positions; final norm included), the N of Kaplan et al. 2020 (sec. 2.1)
#      and of the fits of Hoffmann et al. 2022; the total is reported beside it.
#   C  training compute: the planner's model FLOPs of one step (``make_plan(...).time.flops.model_per_step``
#      = dlmspec.flops.model_flops_per_token x global_batch_size x input length: 3x the forward GEMMs,
#      attention's QK^T and PV at the objective's attended keys, the logits GEMM on the padded
#      vocabulary; no recomputation) times ``train_iters``. It is not 6ND: at small widths the logits
#      GEMM (6 h V per token) outweighs 6N.
#   D  training tokens: ``train_iters x global_batch_size x seq_length`` (every input position).


@dataclass(frozen=True)
class ShapeRule:
    """How a model of ``N`` non-embedding parameters is shaped (dense models only).

    The default follows the small models of Hoffmann et al. 2022 (Chinchilla), Table A9: a head
    dimension of 64 (``num_attention_heads = hidden_size / 64``) and depth growing with width at
    ``hidden_size / num_layers`` of 40 to 64 (their 44M-306M rows: 512/8, 640/10, 640/16, 768/12,
    1024/16), 64 being the preferred ratio here;
    Kaplan et al. 2020 (Fig. 5) find the loss within a few percent over aspect ratios 20-200, so
    the ratio is a preference, not a constraint. The MLP is near the base spec's
    ``ffn_hidden_size / hidden_size`` (the demo's 2048/768 = 8/3, SwiGLU's ratio in LLaMA) unless
    ``ffn_ratio`` is given; query groups keep the base's ``heads / groups`` when it divides the
    new head count, else every head has its own (MHA).

    The search: every width ``hidden_size`` in steps of ``width_multiple`` and every depth
    ``num_layers``, and every ``ffn_hidden_size`` (a multiple of ``ffn_multiple``) within
    ``ffn_slack`` (a factor) of ``ffn_ratio x hidden_size``; of the shapes whose ``N`` is within
    ``tolerance`` (relative) of the target, the one nearest both ratios wins: the least
    ``|log((hidden/layers) / aspect_ratio)| + |log(ffn / (ffn_ratio x hidden))|``, ties to the
    nearer ``N``. The MLP width is what brings a coarse (width, depth) grid onto the target at
    small sizes.

    Attributes:
        aspect_ratio: preferred ``hidden_size / num_layers``.
        head_dim: ``kv_channels``; ``hidden_size`` is a multiple of it.
        width_multiple: step of the widths tried (a multiple of ``head_dim``).
        ffn_ratio: preferred ``ffn_hidden_size / hidden_size`` (default: the base spec's).
        ffn_slack: the MLP width stays within ``ffn_ratio x hidden_size`` times or divided by this.
        ffn_multiple: ``ffn_hidden_size`` is a multiple of this.
        tolerance: largest relative distance ``|N - target| / target`` accepted.
        max_width: widest ``hidden_size`` tried.
    """

    aspect_ratio: float = 64.0
    head_dim: int = 64
    width_multiple: int = 64
    ffn_ratio: float | None = None
    ffn_slack: float = 1.5
    ffn_multiple: int = 8
    tolerance: float = 0.02
    max_width: int = 16384

    def __post_init__(self) -> None:
        """Refuse a rule no shape can follow (SpecError at the user's line, naming the field)."""
        import math

        checks = (("aspect_ratio", self.aspect_ratio, float), ("head_dim", self.head_dim, int),
                  ("width_multiple", self.width_multiple, int), ("ffn_slack", self.ffn_slack, float),
                  ("ffn_multiple", self.ffn_multiple, int), ("tolerance", self.tolerance, float),
                  ("max_width", self.max_width, int))
        for name, value, kind in checks:
            ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
                  and value > 0 and (kind is float or isinstance(value, int)))
            if not ok:
                raise _python_error(f"ShapeRule.{name}", f"must be a positive {'number' if kind is float else 'integer'}",
                                    value, f"e.g. ShapeRule({name}={getattr(ShapeRule, name)!r})")
        if self.ffn_ratio is not None and (isinstance(self.ffn_ratio, bool) or not isinstance(self.ffn_ratio, (int, float))
                                           or not self.ffn_ratio > 0):
            raise _python_error("ShapeRule.ffn_ratio", "must be a positive number (or None: the base's)", self.ffn_ratio,
                                "e.g. ShapeRule(ffn_ratio=8 / 3)")
        if self.ffn_slack < 1:
            raise _python_error("ShapeRule.ffn_slack", "is a factor of at least 1", self.ffn_slack,
                                "e.g. ShapeRule(ffn_slack=1.5)")
        if self.width_multiple % self.head_dim:
            raise _python_error("ShapeRule.width_multiple", f"must be a multiple of head_dim ({self.head_dim})",
                                self.width_multiple, f"e.g. ShapeRule(width_multiple={self.head_dim})")

    #: Where the default values come from (printed in member descriptions and docs/python.md).
    source = ("Hoffmann et al. 2022 (Chinchilla) Table A9: head dim 64, hidden/layers ~ 64; "
              "Kaplan et al. 2020 Fig. 5: loss flat over aspect ratios 20-200")


@dataclass(frozen=True)
class ModelShape:
    """A concrete shape a :class:`ShapeRule` gives for a target size.

    Attributes:
        target: the ``N`` asked for (non-embedding parameters).
        num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups: the shape.
        kv_channels: the head dimension.
        non_embedding: ``N`` of the shape (:func:`dlmspec.params.count_parameters`).
        total: every parameter, embeddings included (tokenizer vocabulary, not padded).
    """

    target: int
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    non_embedding: int
    total: int

    @property
    def relative_error(self) -> float:
        """``(non_embedding - target) / target``."""
        return (self.non_embedding - self.target) / self.target

    def model_changes(self, base: models.ModelSpec) -> dict[str, Any]:
        """The ``[model]`` keys to set on ``base`` (``kv_channels`` only when the base sets it)."""
        out: dict[str, Any] = {"num_layers": self.num_layers, "hidden_size": self.hidden_size,
                               "ffn_hidden_size": self.ffn_hidden_size,
                               "num_attention_heads": self.num_attention_heads,
                               "num_query_groups": self.num_query_groups}
        if base.kv_channels is not None:
            out["kv_channels"] = self.kv_channels
        return out


def count_label(value: float) -> str:
    """A count as a short name part: ``1500000`` -> ``1.5m``, ``300000`` -> ``300k``, ``2e9`` -> ``2b``,
    ``512`` -> ``512`` (three significant digits at most)."""
    for div, suffix in ((1e12, "t"), (1e9, "b"), (1e6, "m"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"


def flops_label(value: float) -> str:
    """FLOPs as a short name part: ``1e14`` -> ``1e14``, ``2.5e13`` -> ``2.5e13``."""
    mantissa, exponent = f"{value:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _python_error(key: str, why: str, value: Any, hint: str) -> Exception:
    """A SpecError at the user's call (the DSL's errors have no spec line of their own)."""
    from dlmspec.errors import SpecError, SpecIssue
    from dlmspec.spec.python import user_frame

    issue = SpecIssue(key, why, value=value, hint=hint, rule="python")
    frame = user_frame(2)
    if frame is not None:
        issue.file, issue.line = frame.f_code.co_filename, frame.f_lineno
    return SpecError([issue])


def _positive_numbers(key: str, values: Any, example: str) -> list[float]:
    """``values`` as a non-empty list of positive finite numbers (any ``numbers.Real``: numpy's too;
    SpecError naming ``key`` else)."""
    import math
    import numbers

    if isinstance(values, (str, bytes)):
        raise _python_error(key, "needs a list of positive numbers, not a string", values, f"e.g. {example}")
    items = [values] if isinstance(values, numbers.Real) and not isinstance(values, bool) else values
    try:
        items = list(items)
    except TypeError:
        raise _python_error(key, "needs a list of positive numbers", values, f"e.g. {example}") from None
    if not items:
        raise _python_error(key, "needs at least one value", values, f"e.g. {example}")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Real) or not math.isfinite(item) or item <= 0:
            raise _python_error(key, "every value must be a positive number", item, f"e.g. {example}")
    if len(set(items)) != len(items):
        raise _python_error(key, "a value is given twice (members would share a name)", items,
                            "give each value once")
    return [float(i) for i in items]


class _Counts(NamedTuple):
    """Non-embedding and total parameters of a candidate shape (:func:`model_shape`)."""

    non_embedding: int
    total: int


def model_shape(base: models.Spec, n: float, rule: ShapeRule | None = None) -> ModelShape:
    """The shape ``rule`` (default :class:`ShapeRule`) gives ``base``'s model for ``n``
    non-embedding parameters: ``base``'s vocabulary, norms, activation, biases, positions and
    embeddings kept, its depth, width, heads, query groups and MLP width chosen.

    Raises:
        SpecError: ``base`` is a mixture of experts (the rule shapes dense models); ``n`` is not
            a positive number; no shape of the rule is within ``rule.tolerance`` of ``n`` (the
            issue names the nearest one and a tolerance that accepts it).
    """
    import math

    from dlmspec.params import count_parameters

    rule = rule or ShapeRule()
    m = base.model
    if m.num_experts:
        raise _python_error("model.num_experts", "the shape rule shapes dense models only", m.num_experts,
                            "give a dense base spec (no model.num_experts)")
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0:
        raise _python_error("sizes", "a model size is a positive number of non-embedding parameters", n,
                            "e.g. sizes=[1e6, 2e6, 4e6]")
    ffn_ratio = rule.ffn_ratio or m.ffn_hidden_size / m.hidden_size
    groups_of = m.num_query_groups or m.num_attention_heads
    gqa = m.num_attention_heads // groups_of if m.num_attention_heads % groups_of == 0 else 1
    target = int(round(n))
    step = rule.ffn_multiple

    def exact(dims: dict[str, int]) -> Any:
        return count_parameters(m.model_copy(update={**dims, "moe_layer_freq": 1}))

    # A dense model's counts are affine in its depth (embeddings and the final norm, plus one
    # layer's parameters per layer: dlmspec.params.count_parameters), so each (width, MLP width)
    # is counted at 1 and 2 layers once and any depth follows exactly, without counting a model
    # per candidate depth (a 1e9 target tries some 10^5 candidates).
    lines: dict[tuple[int, int], tuple[int, int, int, int]] = {}

    def count(dims: dict[str, int]) -> _Counts:
        key = (dims["hidden_size"], dims["ffn_hidden_size"])
        if key not in lines:
            one, two = (exact({**dims, "num_layers": layers}) for layers in (1, 2))
            lines[key] = (one.non_embedding, two.non_embedding - one.non_embedding, one.total, two.total - one.total)
        base, per_layer, total, per_layer_total = lines[key]
        extra = dims["num_layers"] - 1
        return _Counts(base + extra * per_layer, total + extra * per_layer_total)

    found: list[tuple[float, float, ModelShape]] = []
    nearest: ModelShape | None = None
    for h in range(rule.width_multiple, rule.max_width + 1, rule.width_multiple):
        heads = h // rule.head_dim
        groups = heads // gqa if gqa > 1 and heads % gqa == 0 else heads
        lo = max(step, math.ceil(ffn_ratio * h / rule.ffn_slack / step) * step)
        hi = math.floor(ffn_ratio * h * rule.ffn_slack / step) * step
        dims = {"hidden_size": h, "num_attention_heads": heads, "num_query_groups": groups,
                "kv_channels": rule.head_dim}
        smallest = count({**dims, "num_layers": 1, "ffn_hidden_size": lo})
        if smallest.non_embedding > target * (1 + rule.tolerance):
            if nearest is None:  # the target is below the rule's smallest shape
                nearest = ModelShape(target=target, num_layers=1, hidden_size=h, ffn_hidden_size=lo,
                                     num_attention_heads=heads, num_query_groups=groups, kv_channels=rule.head_dim,
                                     non_embedding=smallest.non_embedding, total=smallest.total)
            break  # one layer of this width is already too large; wider ones are larger still
        for layers in range(1, 100_000):
            at_lo = count({**dims, "num_layers": layers, "ffn_hidden_size": lo}).non_embedding
            if at_lo > target * (1 + rule.tolerance):
                break
            per_ffn = (count({**dims, "num_layers": layers, "ffn_hidden_size": lo + step}).non_embedding - at_lo) / step
            # N is linear in ffn: the MLP widths within tolerance form an interval; take the one in
            # it (and in the slack band) nearest ffn_ratio x hidden, else the one nearest the target
            first = max(lo, math.ceil((lo + (target * (1 - rule.tolerance) - at_lo) / per_ffn) / step) * step)
            last = min(hi, math.floor((lo + (target * (1 + rule.tolerance) - at_lo) / per_ffn) / step) * step)
            if first <= last:
                ffn = min(last, max(first, int(round(ffn_ratio * h / step)) * step))
            else:
                ffn = min(hi, max(lo, int(round((lo + (target - at_lo) / per_ffn) / step)) * step))
            counts = count({**dims, "num_layers": layers, "ffn_hidden_size": ffn})
            shape = ModelShape(target=target, num_layers=layers, hidden_size=h, ffn_hidden_size=ffn,
                               num_attention_heads=heads, num_query_groups=groups, kv_channels=rule.head_dim,
                               non_embedding=counts.non_embedding, total=counts.total)
            if nearest is None or abs(shape.relative_error) < abs(nearest.relative_error):
                nearest = shape
            if abs(shape.relative_error) <= rule.tolerance:
                distance = abs(math.log(h / layers / rule.aspect_ratio)) + abs(math.log(ffn / (ffn_ratio * h)))
                found.append((distance, abs(shape.relative_error), shape))
    if not found:
        assert nearest is not None  # the first width gives one
        if nearest.non_embedding > target and nearest.num_layers == 1 and nearest.hidden_size == rule.width_multiple:
            hint = (f"ask for {nearest.non_embedding:,} or more (the rule's smallest shape: 1 layer x "
                    f"{nearest.hidden_size} wide)")
        else:
            hint = (f"ask for {nearest.non_embedding:,} (nearest: {nearest.num_layers} layers x {nearest.hidden_size} "
                    f"wide), or widen the tolerance: ShapeRule(tolerance={abs(nearest.relative_error) * 1.01:.3g})")
        raise _python_error(
            "sizes", f"no shape of the rule has {target:,} non-embedding parameters within "
            f"{100 * rule.tolerance:g}%", n, hint)
    best = min(found, key=lambda f: (f[0], f[1]))[2]
    counted = exact({"hidden_size": best.hidden_size, "num_attention_heads": best.num_attention_heads,
                     "num_query_groups": best.num_query_groups, "kv_channels": best.kv_channels,
                     "num_layers": best.num_layers, "ffn_hidden_size": best.ffn_hidden_size})
    assert (counted.non_embedding, counted.total) == (best.non_embedding, best.total)  # the affine count is exact
    return best


def _describe(spec: models.Spec, shape: ModelShape, extra: str) -> str:
    kind = spec.objective.kind
    return (f"{shape.num_layers}-layer, {shape.hidden_size}-wide {kind} LM: {shape.non_embedding:,} non-embedding "
            f"parameters ({shape.total:,} in all); {extra}")


def _scaled_schedule(base: models.Spec, iters: int) -> dict[str, Any]:
    """``train`` keys that make ``base`` run ``iters`` steps with the same schedule shape:
    ``train_iters`` set (``train_tokens`` unset), ``lr_warmup_iters`` and ``lr_decay_iters``
    scaled by ``iters / base iterations`` (at least 1 and warm-up below decay), as are
    ``lr_wsd_decay_iters`` and the steps of a piecewise schedule's ``lr_points``,
    ``lr_warmup_fraction`` kept, ``eval_interval`` at most ``iters`` (every run is evaluated
    at its end), ``[checkpoint]`` left as it is (``save_at_end`` saves the last step)."""
    from dlmspec.resolve import resolve

    tr = base.train
    base_iters = resolve(base).train_iters or iters
    ratio = iters / base_iters
    out: dict[str, Any] = {"train_iters": iters}
    if tr.train_tokens is not None:
        out["train_tokens"] = None
    decay = iters
    if tr.lr_decay_iters is not None:
        decay = max(2, int(round(tr.lr_decay_iters * ratio)))
        out["lr_decay_iters"] = decay
    if tr.lr_warmup_iters:
        out["lr_warmup_iters"] = min(max(1, int(round(tr.lr_warmup_iters * ratio))), max(0, decay - 1))
    if tr.lr_wsd_decay_iters is not None:
        out["lr_wsd_decay_iters"] = min(decay, max(1, int(round(tr.lr_wsd_decay_iters * ratio))))
    if tr.lr_points:
        out["lr_points"] = [[min(iters, int(round(step * ratio))), lr] for step, lr in tr.lr_points]
    if tr.eval_interval > iters:
        out["eval_interval"] = iters
    return out


def step_flops(spec: models.Spec) -> tuple[float, int]:
    """``(model FLOPs of one training step, tokens of one step)`` as the planner counts them:
    ``make_plan(resolve(spec)).time.flops.model_per_step`` and ``global_batch_size x seq_length``
    (see the definitions above :class:`ShapeRule`).

    Raises:
        SpecError: the spec's GPU is not in the planner's catalog.
    """
    from dlmspec.plan import PlanError, make_plan
    from dlmspec.resolve import resolve

    resolved = resolve(spec)
    try:
        plan = make_plan(resolved)
    except PlanError as exc:
        raise _python_error("cluster.gpu", str(exc), spec.cluster.gpu, "a GPU of dlmspec show --gpus") from None
    return plan.time.flops.model_per_step, resolved.tokens_per_step


def _sized(base: models.Spec, sizes: list[float], rule: ShapeRule | None) -> list[tuple[str, ModelShape, models.Spec]]:
    """``(size label, shape, base with that shape)`` per size, in order."""
    out = []
    for n in sizes:
        shape = model_shape(base, n, rule)
        out.append((f"n{count_label(n)}", shape, base.replace(model=shape.model_changes(base.model))))
    labels = [label for label, _, _ in out]
    if len(set(labels)) != len(labels):
        raise _python_error("sizes", "two sizes give the same name (three significant digits)", sizes,
                            "give sizes that differ in their first three digits")
    return out


def shapes(base: models.Spec, sizes: Any, *, rule: ShapeRule | None = None) -> dict[str, models.Spec]:
    """``Spec.shapes``: ``base`` at each size of ``sizes`` (non-embedding parameters ``N``),
    shaped by ``rule`` (:func:`model_shape`), named ``<base name>-n<N>`` (``demo-dlm-n2m``),
    its training left as ``base`` has it: a dict of name -> Spec, the form a sweep takes.

    Raises:
        SpecError: see :func:`model_shape`; sizes empty, repeated or not positive numbers.
    """
    out: dict[str, models.Spec] = {}
    for label, shape, sized in _sized(base, _positive_numbers("sizes", sizes, "sizes=[1e6, 2e6, 4e6]"), rule):
        name = f"{base.name}-{label}"
        out[name] = sized.replace(name=name, description=_describe(sized, shape, f"shape rule: {ShapeRule.source}"))
    return out


def isoflop(base: models.Spec, budgets: Any, sizes: Any, *, rule: ShapeRule | None = None) -> dict[str, models.Spec]:
    """``Spec.isoflop``: an isoFLOP sweep. For each compute budget ``C`` of ``budgets`` (training
    FLOPs as the planner counts them: :func:`step_flops`) and each size of ``sizes``: ``base``
    shaped for that size (:func:`model_shape`) and trained for the whole number of steps whose
    FLOPs are nearest ``C``: ``train_iters = round(C / step FLOPs)``, so the run spends ``C``
    within half a step; warm-up and decay scaled with it (:func:`_scaled_schedule`). Named
    ``<base name>-c<C>-n<N>-d<tokens>`` (``demo-dlm-c1e14-n2m-d1.6m``), described with its shape,
    steps, tokens and FLOPs. Batch, sequence, data and layout stay ``base``'s.

    Returns:
        A dict of name -> Spec, budget by budget, sizes in the order given.

    Raises:
        SpecError: see :func:`model_shape`; a budget below half a step of a size (the issue
            names the smallest budget that gives that size one step); budgets or sizes empty,
            repeated or not positive numbers; a GPU the planner does not know.
    """
    budgets_ = _positive_numbers("budgets", budgets, "budgets=[1e14, 3e14]")
    sized = [(label, shape, spec, *step_flops(spec))
             for label, shape, spec in _sized(base, _positive_numbers("sizes", sizes, "sizes=[1e6, 2e6]"), rule)]
    out: dict[str, models.Spec] = {}
    for c in budgets_:
        for label, shape, spec, flops, tokens_per_step in sized:
            iters = int(round(c / flops))
            if iters < 1:
                raise _python_error(
                    "budgets", f"{c:.3g} FLOPs is less than half a training step of the {label} model "
                    f"({flops:.3g} FLOPs a step of {tokens_per_step:,} tokens)", c,
                    f"give budgets of at least {flops:.3g} FLOPs, or leave out the larger sizes")
            tokens = iters * tokens_per_step
            name = f"{base.name}-c{flops_label(c)}-{label}-d{count_label(tokens)}"
            if name in out:
                raise _python_error("budgets", f"two budgets give one member name ({name}): names keep three "
                                    "significant digits", budgets, "give budgets that differ in their first three digits")
            extra = (f"{iters:,} steps = {tokens:,} tokens = {iters * flops:.4g} training FLOPs "
                     f"(isoFLOP budget {c:.4g}, planner's count)")
            out[name] = spec.replace(name=name, train=_scaled_schedule(spec, iters),
                                     description=_describe(spec, shape, extra))
    return out


def data_constrained(base: models.Spec, sizes: Any, unique_tokens: Any, epochs: Any, *,
                     rule: ShapeRule | None = None) -> dict[str, models.Spec]:
    """``Spec.data_constrained``: the (size x unique tokens x epochs) grid of a data-constrained
    study (Muennighoff et al. 2023). Each member is ``base`` shaped for its size
    (:func:`model_shape`), its training data capped at ``U`` unique tokens
    (``data.train[].max_unique_tokens``: ``U`` split over the blend's datasets by their weights, a
    deterministic prefix of each) and trained on ``U x E`` tokens rounded to whole steps
    (``train_iters = round(U x E / tokens per step)``; warm-up and decay scaled with it). Named
    ``<base name>-n<N>-u<U>-e<E>`` (``demo-dlm-n2m-u300k-e8``). Validation data is not capped.

    Two calls make a same-compute pair (one epoch against many of a smaller cap, same ``N``
    and tokens): ``{**data_constrained(b, [N], [D], [1]), **data_constrained(b, [N], [D / 8], [8])}``.

    Raises:
        SpecError: ``base`` has no training datasets (mock data) or its data cannot take a cap;
            see :func:`model_shape`; lists empty, repeated or not positive numbers.
    """
    sizes_ = _positive_numbers("sizes", sizes, "sizes=[1e6, 2e6]")
    uniques = _positive_numbers("unique_tokens", unique_tokens, "unique_tokens=[3e5, 1e6]")
    epochs_ = _positive_numbers("epochs", epochs, "epochs=[1, 4, 16]")
    if base.data.mock or not base.data.train:
        raise _python_error("data.train", "a data-constrained study caps the training datasets; this spec has none "
                            "(mock data)", base.data.mock, "give data.train datasets (dlmspec data prepare)")
    weights = [entry.weight for entry in base.data.train]
    out: dict[str, models.Spec] = {}
    for label, shape, spec in _sized(base, sizes_, rule):
        tokens_per_step = spec.train.global_batch_size * spec.train.seq_length
        for u in uniques:
            caps = [max(1, int(round(u * w / sum(weights)))) for w in weights]
            train = [{**entry.model_dump(exclude_unset=True), "max_unique_tokens": cap}
                     for entry, cap in zip(spec.data.train, caps)]
            for e in epochs_:
                iters = max(1, int(round(u * e / tokens_per_step)))
                tokens = iters * tokens_per_step
                name = f"{base.name}-{label}-u{count_label(u)}-e{e:.3g}"
                if name in out:
                    raise _python_error("unique_tokens", f"two grid cells give one member name ({name}): names keep "
                                        "three significant digits", [unique_tokens, epochs],
                                        "give unique tokens and epochs that differ in their first three digits")
                extra = (f"{int(u):,} unique training tokens, {iters:,} steps = {tokens:,} tokens "
                         f"({tokens / u:.3g} epochs)")
                out[name] = spec.replace(name=name, data={"train": train}, train=_scaled_schedule(spec, iters),
                                         description=_describe(spec, shape, extra))
    return out
