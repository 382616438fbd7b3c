"""The one derivation of how a model's transformer layers split over pipeline stages.

megatron-core 0.16.1 has four ways to place layers besides the even split, each a
``TransformerConfig`` field of the same name in ``[parallel]``:

* ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the
  embedding (the loss) counts as one layer of the split, so ``L + 1`` (``L + 2``) layers split
  evenly and the first virtual stage of the first rank (the last virtual stage of the last rank)
  builds one transformer layer fewer (``transformer_block.get_num_layers_to_build``);
* ``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``: the first
  (last) rank holds that many layers, the other ranks split the rest evenly;
* ``pipeline_model_parallel_layout``: an explicit string, one ``|``-separated stage per
  (virtual) stage in order ``vpp_rank * pp + pp_rank``, ``E`` the embedding, ``L`` the loss, ``t`` a
  transformer layer, ``m`` an MTP layer, ``(...)*n`` / ``x*n`` repetition and ``,`` cosmetic
  (``pipeline_parallel_layer_layout.PipelineParallelLayerLayout.parse_str_to_list``).

:func:`split_problems` says, in megatron-core's order, what its ``TransformerConfig.__post_init__``
and ``get_num_layers_to_build`` refuse; :func:`chunk_layers` gives the transformer layers of each
(pipeline rank, virtual stage) megatron-core builds. The validator's rules
(:mod:`dlmspec.check.pipeline`), the planner (:func:`dlmspec.plan.memory.stage_layer_counts`, the
layout search) and their tests use these functions and nothing else. Pure integer and string
arithmetic: no pydantic, no torch.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

#: The layout string's layer characters and what they are (megatron-core ``LayerType``).
LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}

#: Longest layout a string may expand to, in characters: far above any real layout (Llama-3.1-405B on
#: PP 16 x VPP 8 is 128 stages and 128 characters), small enough that ``(t)*999999999`` is refused
#: before it is expanded.
MAX_EXPANDED = 1 << 16

#: megatron-core's two unrolling patterns, applied in this order (``parse_str_to_list``).
_UNROLL = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))


class Split(NamedTuple):
    """The pipeline split options of a run (``[parallel]``, megatron-core's names).

    Attributes:
        num_layers: ``model.num_layers``.
        pp: pipeline-parallel size; vpp: virtual stages per rank (None without interleaving).
        first, last: ``num_layers_in_first_pipeline_stage`` / ``..._last_...`` (None: unset).
        embedding, loss: the two ``account_for_*_in_pipeline_split`` flags.
        layout: ``pipeline_model_parallel_layout`` (None: unset).
    """

    num_layers: int
    pp: int
    vpp: int | None = None
    first: int | None = None
    last: int | None = None
    embedding: bool = False
    loss: bool = False
    layout: str | None = None

    @property
    def uneven(self) -> bool:
        """Whether any of the uneven options is set (the even split otherwise)."""
        return (self.first is not None or self.last is not None or self.embedding or self.loss
                or self.layout is not None)


class Problem(NamedTuple):
    """One thing megatron-core refuses about a split.

    Attributes:
        rule: the validator rule that reports it (:mod:`dlmspec.check.pipeline`).
        key: the spec key to change (dotted).
        why: megatron-core's reason, in words.
    """

    rule: str
    key: str
    why: str


class LayoutError(ValueError):
    """A layout string megatron-core cannot parse (or one too long to expand)."""


def expand_layout(text: str) -> list[str]:
    """The stages of a layout string, each a string of :data:`LAYER_CHARS`.

    megatron-core's ``parse_str_to_list``: commas removed, ``(...)*n`` then ``x*n`` unrolled with
    the same regular expressions, split on ``|``.

    Raises:
        LayoutError: a character outside :data:`LAYER_CHARS` (and ``|``), or an expansion longer
            than :data:`MAX_EXPANDED` characters.
    """
    text = text.replace(",", "")
    if len(text) > MAX_EXPANDED:
        raise LayoutError(f"{len(text)} characters, more than {MAX_EXPANDED}")
    for pattern in _UNROLL:
        size = len(text)
        for match in pattern.finditer(text):
            digits = match.group(2)  # int() of thousands of digits raises; any count past the cap is refused
            times = int(digits) if len(digits) <= 12 else MAX_EXPANDED + 1
            size += len(match.group(1)) * times - len(match.group(0))
            if size > MAX_EXPANDED:
                raise LayoutError(f"it expands to more than {MAX_EXPANDED} characters")
        text = pattern.sub(lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    for stage in stages:
        for char in stage:
            if char not in LAYER_CHARS:
                known = ", ".join(repr(c) for c in LAYER_CHARS)
                raise LayoutError(f"{char!r} is not a layer character (known: {known}, '|' between stages, "
                                  "'(...)*n' and 'x*n' to repeat)")
    return stages


def layout_string(chunks: tuple[tuple[int, ...], ...]) -> str:
    """The layout string of per-(rank, virtual stage) transformer-layer counts ``chunks[rank][chunk]``
    (:func:`chunk_layers`' form), with the embedding on the first stage and the loss on the last:
    ``"Et*3|t*4|t*4|t*3L"`` for 14 layers on PP 4."""
    pp, v = len(chunks), len(chunks[0])
    stages = []
    for c in range(v):
        for i in range(pp):
            n = chunks[i][c]
            body = "t" if n == 1 else (f"t*{n}" if n else "")
            if c == 0 and i == 0:
                body = "E" + body
            if c == v - 1 and i == pp - 1:
                body += "L"
            stages.append(body)
    return "|".join(stages)


def split_problems(split: Split) -> list[Problem]:
    """What megatron-core 0.16.1 refuses about ``split``, in the order it checks (empty: it builds).

    Sources: ``TransformerConfig.__post_init__`` (the first/last counts with the accounting flags;
    the layout with any other option; the layout's stage count, virtual size and layer counts via
    ``PipelineParallelLayerLayout.__init__`` and ``validate_layer_layout``; the first/last counts'
    sizes, middle remainder and virtual divisibility; the accounted layers' divisibility by PP and
    VPP) and ``transformer_block.get_num_layers_to_build`` (without options, ``L`` divisible by PP
    and the layers per rank by VPP). One more, dlmspec's: a layout with several stages per rank
    needs ``virtual_pipeline_model_parallel_size`` written (megatron-core would set it from the
    layout, leaving the runtime's ``initialize_model_parallel`` sizes behind).
    """
    s = split
    par = "parallel."
    if (s.first is not None or s.last is not None) and (s.embedding or s.loss):
        return [Problem("pipeline-stage-layers-with-accounting", par + _set_count_key(s),
                        "num_layers_in_first/last_pipeline_stage cannot be set together with "
                        "account_for_embedding/loss_in_pipeline_split")]
    if s.layout is not None:
        if s.first is not None or s.last is not None or s.embedding or s.loss:
            return [Problem("pipeline-layout-alone", par + "pipeline_model_parallel_layout",
                            "pipeline_model_parallel_layout cannot be set together with the other pipeline "
                            "split options (num_layers_in_first/last_pipeline_stage, account_for_*_in_pipeline_split)")]
        return _layout_problems(s)
    if s.first is not None or s.last is not None:
        return _stage_count_problems(s)
    v = s.vpp if (s.vpp is not None and s.pp > 1) else None  # get_num_layers_to_build ignores VPP at PP 1
    n = s.num_layers + int(s.embedding) + int(s.loss)
    if not (s.embedding or s.loss):
        if n % s.pp:
            return [Problem("pp-divides-layers", par + "pipeline_model_parallel_size",
                            f"num_layers = {n} is not a multiple of the PP size {s.pp}")]
        if v is not None and (n // s.pp) % v:
            return [Problem("vpp-divides-stage-layers", par + "virtual_pipeline_model_parallel_size",
                            f"each of the {s.pp} pipeline stages has {n // s.pp} layers, not a multiple of the "
                            f"virtual size {v}")]
        return []
    what = " + ".join(["num_layers"] + (["1 (embedding)"] if s.embedding else []) + (["1 (loss)"] if s.loss else []))
    if n % s.pp:
        return [Problem("pipeline-accounted-layers-divide", par + "pipeline_model_parallel_size",
                        f"{what} = {n} is not a multiple of the PP size {s.pp}")]
    if s.vpp is not None and (n // s.pp) % s.vpp:  # __post_init__ checks VPP whatever PP is
        return [Problem("pipeline-accounted-layers-divide", par + "virtual_pipeline_model_parallel_size",
                        f"each pipeline rank has ({what}) / PP = {n // s.pp} layers, not a multiple of the "
                        f"virtual size {s.vpp}")]
    return []


def _set_count_key(s: Split) -> str:
    return "num_layers_in_first_pipeline_stage" if s.first is not None else "num_layers_in_last_pipeline_stage"


def _layout_problems(s: Split) -> list[Problem]:
    key = "parallel.pipeline_model_parallel_layout"
    try:
        stages = expand_layout(s.layout or "")
    except LayoutError as exc:
        return [Problem("pipeline-layout-grammar", key, f"megatron-core cannot parse it: {exc}")]
    if len(stages) % s.pp:
        return [Problem("pipeline-layout-stages", key, f"{len(stages)} stages, not a multiple of the PP size {s.pp}")]
    detected = len(stages) // s.pp
    if s.vpp is not None and s.vpp != detected:
        return [Problem("pipeline-layout-virtual-size", "parallel.virtual_pipeline_model_parallel_size",
                        f"virtual_pipeline_model_parallel_size = {s.vpp} but the layout has {len(stages)} stages "
                        f"= PP {s.pp} x {detected} virtual stages")]
    own = []  # dlmspec's own, after megatron-core's (which would set the size from the layout)
    if s.vpp is None and detected > 1:
        own = [Problem("pipeline-layout-virtual-size", "parallel.virtual_pipeline_model_parallel_size",
                       f"the layout has {len(stages)} stages = PP {s.pp} x {detected} virtual stages; "
                       "write virtual_pipeline_model_parallel_size so the runtime's pipeline groups agree")]
    flat = "".join(stages)
    why = []
    if not flat or flat[0] != "E":
        why.append("the first layer must be the embedding 'E'")
    if not flat or flat[-1] != "L":
        why.append("the last layer must be the loss 'L'")
    if flat.count("E") != 1:
        why.append(f"the embedding 'E' must appear exactly once (it appears {flat.count('E')} times)")
    if flat.count("L") != 1:
        why.append(f"the loss 'L' must appear exactly once (it appears {flat.count('L')} times)")
    if flat.count("t") != s.num_layers:
        why.append(f"it has {flat.count('t')} transformer layers 't', and model.num_layers = {s.num_layers}")
    if flat.count("m"):
        why.append("it has MTP layers 'm', and the model has none (mtp_num_layers unset)")
    return ([Problem("pipeline-layout-layers", key, "; ".join(why))] if why else []) + own


def _stage_count_problems(s: Split) -> list[Problem]:
    rest, stages = s.num_layers, s.pp
    v = s.vpp
    for name, value in (("first", s.first), ("last", s.last)):
        if value is None:
            continue
        if v is not None and value % v:
            return [Problem("pipeline-stage-layers", f"parallel.num_layers_in_{name}_pipeline_stage",
                            f"{value} layers on the {name} stage, not a multiple of the virtual size {v}")]
        rest -= value
        stages -= 1
    key = "parallel." + _set_count_key(s)
    if bool(rest) != bool(stages):
        return [Problem("pipeline-stage-layers", key,
                        f"{rest} layers are left for {stages} middle pipeline stages")]
    if stages and rest % stages:
        return [Problem("pipeline-stage-layers", key,
                        f"the {rest} layers left are not a multiple of the {stages} middle pipeline stages")]
    if stages and v is not None and (rest // stages) % v:
        return [Problem("pipeline-stage-layers", key,
                        f"each middle pipeline stage has {rest // stages} layers, not a multiple of the virtual size {v}")]
    return []


@lru_cache(maxsize=4096)
def chunk_layers(split: Split) -> tuple[tuple[int, ...], ...]:
    """Transformer layers megatron-core builds on each pipeline rank and virtual stage:
    ``result[rank][chunk]``, ``pp`` rows of ``vpp`` (or 1) entries, in the order of its
    ``get_num_layers_to_build`` (layers run in order chunk 0 of ranks ``0..pp-1``, then chunk 1, ...).

    A split :func:`split_problems` refuses gets the planner's stand-in instead: without interleaving
    the first ``L % pp`` ranks take one layer more; with it the even split when ``pp * vpp``
    divides ``L``. (The validator reports the problem; the planner still gives numbers.)
    """
    s = split
    pp = s.pp
    v = s.vpp if (s.vpp is not None and pp > 1) else 1
    if split_problems(s):
        L = s.num_layers
        if v > 1 and L % (pp * v) == 0:
            return tuple((L // (pp * v),) * v for _ in range(pp))
        base, extra = divmod(L, pp)
        return tuple((base + (1 if i < extra else 0),) for i in range(pp))
    if s.layout is not None:  # its own virtual size (the spec's, when it builds; at PP 1 too)
        stages = expand_layout(s.layout)
        v = len(stages) // pp
        return tuple(tuple(stages[c * pp + i].count("t") for c in range(v)) for i in range(pp))
    if s.first is not None or s.last is not None:
        rest, left = s.num_layers, pp
        for value in (s.first, s.last):
            if value is not None:
                rest -= value
                left -= 1
        middle = rest // left if left > 0 else 0
        per_rank = [middle] * pp
        if s.first is not None:
            per_rank[0] = s.first
        if s.last is not None:
            per_rank[-1] = s.last
    else:
        per_rank = [(s.num_layers + int(s.embedding) + int(s.loss)) // pp] * pp
    chunks = [[n // v] * v for n in per_rank]
    if s.embedding:
        chunks[0][0] -= 1
    if s.loss:
        chunks[-1][-1] -= 1
    return tuple(tuple(row) for row in chunks)


def rank_layers(split: Split) -> tuple[int, ...]:
    """Transformer layers on each pipeline rank (the sum of its virtual stages)."""
    return tuple(sum(row) for row in chunk_layers(split))


def layer_ranges(split: Split, rank: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` layer-index ranges rank ``rank`` holds, one per virtual stage
    (megatron-core ``get_transformer_layer_offset``: chunk ``c`` of rank ``i`` follows chunk ``c``
    of ranks ``0..i-1`` and every rank's chunks ``0..c-1``)."""
    chunks = chunk_layers(split)
    pp, v = len(chunks), len(chunks[0])
    out, start = [], 0
    for c in range(v):
        for i in range(pp):
            n = chunks[i][c]
            if i == rank:
                out.append((start, start + n))
            start += n
    return out


def split_of(num_layers: int, parallel: object, pp: int | None = None, vpp: int | None = None) -> Split:
    """The :class:`Split` of a spec's ``model.num_layers`` and ``[parallel]`` table (any object with
    its attributes: the pydantic model, the fast path's table); ``pp`` / ``vpp`` override its
    pipeline sizes (the resolved ones)."""
    return Split(
        num_layers=num_layers,
        pp=pp if pp is not None else getattr(parallel, "pipeline_model_parallel_size", 1),
        vpp=vpp if vpp is not None else getattr(parallel, "virtual_pipeline_model_parallel_size", None),
        first=getattr(parallel, "num_layers_in_first_pipeline_stage", None),
        last=getattr(parallel, "num_layers_in_last_pipeline_stage", None),
        embedding=bool(getattr(parallel, "account_for_embedding_in_pipeline_split", False)),
        loss=bool(getattr(parallel, "account_for_loss_in_pipeline_split", False)),
        layout=getattr(parallel, "pipeline_model_parallel_layout", None),
    )
