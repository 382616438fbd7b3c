"""The compiler side of an objective: one :class:`Objective` registered per ``objective.kind``.

An objective module (:mod:`dlmspec.objectives.mdm`, :mod:`dlmspec.objectives.ar`, or one outside
the package, e.g. a test's) subclasses :class:`Objective` and calls :func:`register`; the checks
(:mod:`dlmspec.check.objective`, rules of the one registry :mod:`dlmspec.check.registry`), the
planner (:mod:`dlmspec.plan`) and the template read it through :func:`get`, never by comparing
``kind`` with a string. Its runtime half registers the same kind in
:mod:`dlmspec.backends.megatron.objectives` (``prepare(batch, rng) -> ObjectiveBatch``).

Nothing here imports pydantic or torch: the fast ``validate``/``plan`` path imports it.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

from dlmspec.objectives.schedules import LINEAR, MaskingSchedule


class Objective:
    """What the compiler knows of one objective. Subclass it, set the class attributes, override
    the methods whose default does not fit, and :func:`register` an instance.

    Attributes:
        kind: the ``objective.kind`` it answers.
        description: one line for messages.
        attention: the attention mask ``objective.attention_mask`` defaults to
            (``"bidirectional"``, ``"causal"``, ``"block_causal"``).
        attentions: the attention masks it trains with.
        diffusion: whether it masks tokens with ``[MASK]`` (needs ``mask_token_id``; sampled by the
            masked-diffusion sampler, scored by the ELBO).
        loss_row_fraction: the expected share of positions that carry loss (planner: the fused
            linear cross entropy projects only those rows; MDM masks each token with probability
            ``1 - alpha(t)``, a half on average over ``t ~ U(0, 1)`` for the linear schedule; AR 1).
        input_bytes_per_token: bytes per token the objective adds to a micro-batch on the first
            pipeline stage (MDM: the noised ids, the mask, the weights, ~9 B; planner memory).
        predicts_next_token: whether position ``i`` is trained to predict token ``i + 1`` (AR: a
            score needs at least one context token, sampling runs left to right with megatron-core's
            KV cache, likelihoods are exact rather than an ELBO bound).
        rl_algorithm: the ``stage.rl.algorithm`` that trains it (``""``: none).
        adjective: the objective as an adjective in descriptions (``dlmspec new``'s starter spec;
            empty: its kind).
        spec_model: the pydantic model its ``[objective]`` table validates against: a subclass of
            :class:`dlmspec.spec.models.ObjectiveSpec` (the keys every objective has) adding its own
            keys; ``None`` (the built-ins): ``ObjectiveSpec`` itself. ``Spec.objective`` is then a
            union discriminated on ``objective.kind`` (:func:`dlmspec.spec.models.objective_model`);
            errors keep their plain locations (``objective.toy_rate``). Its ``kind`` field is
            narrowed to the kinds registered with it when it is registered.
        block_diffusion: whether it trains on block diffusion's ``x_t (+) x_0`` input with a mask
            function passed to each attention call (reads ``objective.block_size``; the local
            layers only: :mod:`dlmspec.check.block_diffusion`).
    """

    kind: str = ""
    description: str = ""
    attention: str = "causal"
    attentions: Tuple[str, ...] = ("causal",)
    diffusion: bool = False
    loss_row_fraction: float = 1.0
    input_bytes_per_token: int = 0
    predicts_next_token: bool = True
    rl_algorithm: str = ""
    adjective: str = ""
    block_diffusion: bool = False
    spec_model: Any = None  # a pydantic model class; not imported here (the fast path runs without pydantic)

    # ---- planner terms -------------------------------------------------------------------------
    def extra_seq_length(self, objective: Any, seq_length: int) -> int:
        """Positions the objective adds to ``seq_length`` (``train.seq_length``) in the model's input
        (0: none; block diffusion's ``x_t (+) x_0`` would add ``seq_length``). The planner's
        activations, attention and FLOPs count ``seq_length + extra_seq_length``
        (:func:`dlmspec.plan.shape.input_length`)."""
        return 0

    def extra_positions_output(self, objective: Any) -> bool:
        """Whether the :meth:`extra_seq_length` positions reach the output layer (logits and cross
        entropy) when the decoder's output is whole (no sequence parallelism). ``True`` (the
        default): every input position does; ``False``: the runtime drops them from the decoder's
        output first (block diffusion without an AR loss scores only ``x_t``). The planner's
        output rows: :func:`dlmspec.plan.shape.output_length`."""
        return True

    def attended_keys(self, objective: Any, seq_length: int, train_iters: int = 0) -> Optional[float]:
        """Mean keys a query attends over the model's input (``seq_length + extra_seq_length``),
        where the objective's own mask sets it (block diffusion's ``x_t (+) x_0``; averaged over the
        ``train_iters`` steps where it changes during training); ``None``: the layer pattern's
        (:func:`dlmspec.flops.attended_keys`)."""
        return None

    def extra_forward_passes(self, objective: Any) -> int:
        """Forward passes per micro-batch beyond the one of the model being trained (0: none; a
        frozen teacher or a second view would add 1)."""
        return 0

    def loss_row_fraction_of(self, objective: Any) -> float:
        """The expected share of positions that carry loss for these settings (default:
        :attr:`loss_row_fraction`)."""
        return self.loss_row_fraction

    def masked_variable_length_prob(self, objective: Any) -> float:
        """The probability that a sequence is cut and its tail hidden by a key-padding mask
        (``objective.variable_length = "sequence"``): planner host syncs and mask memory."""
        return 0.0

    def variable_length_prob(self, objective: Any) -> float:
        """The probability that a sequence (``objective.variable_length = "sequence"``) or a whole
        micro-batch (``"micro_batch"``) is cut to a random length (0: never; only MDM cuts)."""
        return 0.0

    def micro_batch_variable_length_prob(self, objective: Any) -> float:
        """The probability that a whole micro-batch is cut to a random length
        (``objective.variable_length = "micro_batch"``): a shorter dense micro-batch, which pipeline
        parallelism cannot send and fp8 GEMMs need a multiple of rows of."""
        if getattr(objective, "variable_length", None) != "micro_batch":
            return 0.0
        return self.variable_length_prob(objective)

    # ---- data, sampling, likelihood ------------------------------------------------------------
    def dataset_extra_token(self, objective: Any, stage_kind: str) -> bool:
        """megatron-core's ``add_extra_token_to_sequence``: the dataset draws ``seq_length + 1`` ids."""
        return False

    def unsupervised_padding_segment(self, pad_eos_tokens: Optional[int]) -> bool:
        """SFT: whether the padding beyond ``pad_eos_tokens`` becomes a segment of its own (then
        batches carry a segment mask)."""
        return False

    def schedule(self, objective: Any) -> MaskingSchedule:
        """The masking schedule ``alpha(t)`` (:mod:`dlmspec.objectives.schedules`): the training
        loss's weight, the sampler's transfer schedule and eval's ELBO. Non-diffusion: linear
        (unused)."""
        return LINEAR

    def runtime_options(self, objective: Any) -> List[Tuple[str, Any, str]]:
        """``(keyword, value, comment)`` the template adds to ``ObjectiveConfig(...)`` beyond the
        keys every objective has: options that differ from the runtime's defaults only, so a spec
        that does not use them compiles to the same bytes."""
        return []


_REGISTRY: Dict[str, Objective] = {}


def template_options(objective: Any) -> List[Tuple[str, Any, str]]:
    """The ``(keyword, value, comment)`` of ``objective`` (the spec's ``[objective]``) that
    ``templates/train.py.j2`` writes into ``ObjectiveConfig(...)``: its registration's
    :meth:`Objective.runtime_options`. The template writes the value through ``| py`` and the
    comment through ``| comment``; the keyword must be a Python identifier.

    Raises:
        ValueError: a keyword that is not an identifier.
    """
    options = get(objective.kind).runtime_options(objective)
    for key, _, _ in options:
        if not (isinstance(key, str) and key.isidentifier()):
            raise ValueError(f"objective {objective.kind!r}: runtime option {key!r} is not a Python identifier")
    return options


def register(objective: Objective) -> Objective:
    """Register ``objective`` under its ``kind`` (a second registration of a kind replaces the
    first: a test may redefine its toy).

    Raises:
        ValueError: an empty kind.
        TypeError: a :attr:`Objective.spec_model` that does not subclass
            :class:`dlmspec.spec.models.ObjectiveSpec` (raised once the spec models are loaded;
            nothing is registered then).
    """
    if not objective.kind:
        raise ValueError(f"{type(objective).__name__} has no kind")
    before = _REGISTRY.get(objective.kind)
    _REGISTRY[objective.kind] = objective
    if before is None or getattr(before, "spec_model", None) is not objective.spec_model:
        try:
            _refresh_spec_models()
        except Exception:
            # a spec_model the spec models cannot take: the registry stays as it was
            if before is None:
                _REGISTRY.pop(objective.kind)
            else:
                _REGISTRY[objective.kind] = before
            _refresh_spec_models()
            raise
    return objective


def unregister(kind: str) -> None:
    """Remove ``kind`` (tests that register a toy objective remove it again)."""
    if _REGISTRY.pop(kind, None) is not None:
        _refresh_spec_models()


def _refresh_spec_models() -> None:
    """The spec models' ``objective.kind`` follows the registry, if they are loaded (they are not
    imported here: the fast path runs without pydantic)."""
    models = sys.modules.get("dlmspec.spec.models")
    if models is not None and hasattr(models, "refresh_objective_kinds"):
        models.refresh_objective_kinds()


def get(kind: str) -> Objective:
    """The registered objective of ``kind``.

    Raises:
        KeyError: an unregistered kind (the message names the registered ones).
    """
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise KeyError(f"no objective registered for kind {kind!r}; registered: {sorted(_REGISTRY)}") from None


def kinds() -> Tuple[str, ...]:
    """The registered kinds, built-ins first."""
    return tuple(_REGISTRY)


def find(kind: Any) -> Optional[Objective]:
    """The registered objective of ``kind``, or ``None`` for anything else (a value read from an
    untrusted file: not a string, or no registered kind)."""
    return _REGISTRY.get(kind) if isinstance(kind, str) else None


def is_diffusion(kind: Any) -> bool:
    """Whether ``kind`` is a registered objective that masks tokens with ``[MASK]``
    (:attr:`Objective.diffusion`); ``False`` for anything unregistered."""
    found = find(kind)
    return found is not None and found.diffusion


def kinds_text(prefix: str = "") -> str:
    """The registered kinds for a message, each after ``prefix``: ``"mdm or ar"``,
    ``kinds_text("--kind ")`` = ``"--kind mdm or --kind ar"``."""
    names = [f"{prefix}{kind}" for kind in _REGISTRY]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]

