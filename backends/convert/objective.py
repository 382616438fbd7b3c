"""Which objective a checkpoint was trained for, and the Hugging Face ``config.json`` of a diffusion LM.

A masked-diffusion LM (``[objective] kind = "mdm"``) was trained with bidirectional attention; loaded
into a stock ``*ForCausalLM`` it would silently run causally. ``transformers`` (5.x) reads a config
attribute ``is_causal``: when ``False``, ``create_causal_mask`` builds the bidirectional (padding only)
mask and the attention kernels are called with ``is_causal=False`` (transformers/masking_utils.py
``create_causal_mask``, utils/generic.py ``check_model_inputs``). So the exported ``config.json``
keeps its stock architecture (no remote code) and carries ``"is_causal": false`` plus a
``"dlmspec"`` record of the objective (``{"objective": "mdm", "attention": "bidirectional",
"mask_token_id": ...}``) that loaders read. docs/generate.md, "Hugging Face export of a diffusion
LM", says why this was chosen over a custom modeling file.

A block-diffusion LM (``kind = "bd3lm"``, BD3-LM) is exported the same way, stock architecture and
``"is_causal": false``, with a record that says how to call it: ``{"objective": "bd3lm", "attention":
"block_diffusion", "block_size": B, "clean_attention": "block_causal" | "causal", "input": "x_t (+) x_0",
"position_ids": "repeated", "mask_token_id": ...}``. The model reads the noised sequence and the
clean one side by side (``2 L`` ids, the position ids ``0 .. L-1`` twice) under the block-diffusion
mask, passed as a 4-D mask (:mod:`dlmspec.backends.convert.block_diffusion` builds both; the
convention: docs/block-diffusion.md, "Hugging Face export").

Where the objective comes from (:func:`checkpoint_objective`): a training checkpoint's
``dlmspec.json`` (the spec record's ``objective.*``; block diffusion's ``ar_loss_weight`` from its
``objective.options``), else the conversion sidecar's remembered Hugging Face config
(:func:`hf_objective`: ``is_causal: false``, a ``dlmspec`` record, or the LLaDA / Dream families,
diffusion LMs by design), else autoregressive.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlmspec import objectives
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.files import FileRefused, read_json
from dlmspec.names import CHECKPOINT_RECORD

#: The ``config.json`` key holding dlmspec's record of the objective.
CONFIG_KEY = "dlmspec"
#: Families whose own (remote) modeling code is bidirectional: diffusion LMs by design.
DIFFUSION_FAMILIES = frozenset({"llada", "dream"})
#: A training checkpoint's metadata file (``dlmspec.backends.megatron.checkpointing.METADATA_FILENAME``).
TRAINING_METADATA = CHECKPOINT_RECORD
#: The ``attention`` a block-diffusion LM's record names (its mask: ``masks.block_diffusion``).
BLOCK_DIFFUSION = "block_diffusion"


@dataclass(frozen=True)
class Objective:
    """What a checkpoint was trained for.

    Attributes:
        kind: ``"mdm"`` (masked diffusion, bidirectional) or ``"ar"`` (causal).
        mask_token_id: the mask token of an ``"mdm"`` model (``None`` if unknown, always for ``"ar"``).
        attention: ``"bidirectional"``, ``"causal"``, ``"block_causal"`` or ``"block_diffusion"``.
        source: where this was read (a file path, ``"argument"`` or ``"default"``), for messages.
        block_size: a block-diffusion LM's block (what it samples with), else ``None``.
        clean_causal: a block-diffusion LM whose clean half is causal within itself (trained with
            ``ar_loss_weight > 0``).
    """

    kind: str
    mask_token_id: int | None = None
    attention: str = "causal"
    source: str = "default"
    block_size: int | None = None
    clean_causal: bool = False

    @property
    def is_block_diffusion(self) -> bool:
        """Whether its kind's registration trains on ``x_t (+) x_0``
        (:attr:`dlmspec.objectives.Objective.block_diffusion`)."""
        found = objectives.find(self.kind)
        return found is not None and found.block_diffusion

    @property
    def is_diffusion(self) -> bool:
        """Whether its kind's registration masks tokens with ``[MASK]``
        (:attr:`dlmspec.objectives.Objective.diffusion`)."""
        return objectives.is_diffusion(self.kind)


AUTOREGRESSIVE = Objective("ar")


def hf_objective(config: Mapping[str, Any], source: str = "config.json") -> Objective:
    """The objective a Hugging Face ``config.json`` dict declares.

    ``"mdm"`` when it has a ``dlmspec`` record saying so, ``"is_causal": false``, or is a LLaDA /
    Dream config (mask token: the record's, else the config's ``mask_token_id``); else ``"ar"``.

    Args:
        config: the parsed ``config.json``.
        source: named in :attr:`Objective.source`.
    """
    record = config.get(CONFIG_KEY)
    record = record if isinstance(record, Mapping) else {}
    mask = record.get("mask_token_id", config.get("mask_token_id"))
    mask = mask if isinstance(mask, int) and not isinstance(mask, bool) else None
    model_type = str(config.get("model_type", "")).lower()
    found = objectives.find(record.get("objective"))
    if found is not None and found.block_diffusion:
        block = record.get("block_size")
        block = block if isinstance(block, int) and not isinstance(block, bool) and block >= 1 else None
        return Objective(found.kind, mask, BLOCK_DIFFUSION, source, block_size=block,
                         clean_causal=record.get("clean_attention") == "causal")
    if objectives.is_diffusion(record.get("objective")) or config.get("is_causal") is False or model_type in DIFFUSION_FAMILIES:
        return Objective("mdm", mask, str(record.get("attention", "bidirectional")), source)
    return Objective("ar", None, "causal", source)


def checkpoint_objective(ckpt: str | os.PathLike[str], sidecar: Mapping[str, Any] | None) -> Objective:
    """The objective of a megatron-core checkpoint directory (already resolved to the ``iter_*`` folder).

    Reads, in order: ``ckpt/dlmspec.json`` written by dlmspec's training runtime (its
    ``spec.record`` holds ``objective.kind``, ``objective.mask_token_id``,
    ``objective.attention_mask``); the sidecar's remembered Hugging Face config
    (:func:`hf_objective`); else :data:`AUTOREGRESSIVE`.

    Raises:
        ConversionError: ``dlmspec.json`` exists but is not JSON, or records an unknown objective.
    """
    meta_path = os.path.join(os.fspath(ckpt), TRAINING_METADATA)
    if os.path.isfile(meta_path):
        try:
            meta = read_json(meta_path, what="checkpoint record")
        except FileRefused as exc:
            raise ConversionError(f"{meta_path}: cannot read it as JSON ({exc.why})", tensor=meta_path,
                                  expected="the training runtime's checkpoint metadata",
                                  hint="restore the file, or pass --objective mdm|ar") from None
        spec = meta.get("spec") if isinstance(meta, Mapping) else None
        record = spec.get("record") if isinstance(spec, Mapping) else None
        if isinstance(record, Mapping) and "objective.kind" in record:
            kind = record["objective.kind"]
            if kind not in objectives.kinds():
                raise ConversionError(f"{meta_path}: objective.kind = {kind!r} is not one of {objectives.kinds()}",
                                      tensor="objective.kind", expected=objectives.kinds(),
                                      hint="pass --objective mdm or --objective ar")
            mask = record.get("objective.mask_token_id")
            registered = objectives.get(kind)
            if registered.block_diffusion:
                run_objective = meta.get("objective") if isinstance(meta.get("objective"), Mapping) else {}
                options = run_objective.get("options") if isinstance(run_objective.get("options"), Mapping) else {}
                block = record.get("objective.block_size", options.get("block_size"))
                weight = options.get("ar_loss_weight", 0.0)
                return Objective(kind, mask, BLOCK_DIFFUSION, meta_path,
                                 block_size=block if isinstance(block, int) and not isinstance(block, bool) else None,
                                 clean_causal=isinstance(weight, (int, float)) and float(weight) > 0.0)
            attention = record.get("objective.attention_mask") or registered.attention
            return Objective(kind, mask if registered.diffusion else None, str(attention), meta_path)
    hf = (sidecar or {}).get("hf_config")
    if isinstance(hf, Mapping) and hf:
        return hf_objective(hf, source=f"{os.path.join(os.fspath(ckpt), 'dlmspec_convert.json')} (hf_config)")
    return AUTOREGRESSIVE


def resolve_objective(found: Objective, kind: str | None, mask_token_id: int | None,
                      block_size: int | None = None) -> Objective:
    """``found`` overridden by explicit arguments (``kind``/``mask_token_id``/``block_size`` of
    :func:`mcore_to_hf`; a ``block_size`` alone sets the block of a block-diffusion ``found``).

    Raises:
        ConversionError: ``kind`` not in :func:`dlmspec.objectives.kinds`, a negative or non-integer
            ``mask_token_id``, or a mask token given for ``kind = "ar"``.
    """
    if kind is not None and kind not in objectives.kinds():
        raise ConversionError(f"objective = {kind!r} is not one of {', '.join(objectives.kinds())}", tensor="objective",
                              expected=objectives.kinds(), hint="use --objective mdm (diffusion) or --objective ar")
    if mask_token_id is not None and (not isinstance(mask_token_id, int) or isinstance(mask_token_id, bool)
                                      or mask_token_id < 0):
        raise ConversionError(f"mask_token_id = {mask_token_id!r} is not a token id", tensor="mask_token_id",
                              expected="an integer >= 0", hint="pass the [objective] mask_token_id of the run")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise ConversionError(f"block_size = {block_size!r} is not a block length", tensor="block_size",
                              expected="an integer >= 1", hint="pass the [objective] block_size of the run")
    if block_size is not None and not objectives.get(kind or found.kind).block_diffusion:
        raise ConversionError(f"block_size given for objective = {kind or found.kind!r} (only a block-diffusion LM "
                              "has a block)", tensor="block_size", expected=None,
                              hint="drop block_size, or pass objective = 'bd3lm'")
    if kind is None and mask_token_id is None and block_size is None:
        return found
    new_kind = kind or ("mdm" if mask_token_id is not None else found.kind)
    if not objectives.is_diffusion(new_kind):
        if mask_token_id is not None:
            raise ConversionError(f"mask_token_id given for objective = {new_kind!r} (an AR model has no mask token)",
                                  tensor="mask_token_id", expected=None,
                                  hint="drop --mask-token-id, or pass --objective mdm")
        return Objective(new_kind, None, objectives.get(new_kind).attention, "argument")
    mask = mask_token_id if mask_token_id is not None else (found.mask_token_id if found.is_diffusion else None)
    if objectives.get(new_kind).block_diffusion:
        same = found.kind == new_kind
        return Objective(new_kind, mask, BLOCK_DIFFUSION, "argument",
                         block_size=block_size if block_size is not None else (found.block_size if same else None),
                         clean_causal=found.clean_causal if same else False)
    attention = found.attention if found.is_diffusion else objectives.get(new_kind).attention
    return Objective(new_kind, mask, attention, "argument")


def diffusion_hf_config(config: dict[str, Any], objective: Objective, family: str) -> dict[str, Any]:
    """``config`` (a ``config.json`` dict) marked for ``objective``.

    ``"mdm"``: ``"is_causal": false`` (transformers then runs the stock architecture
    bidirectionally) and the ``dlmspec`` record; for LLaDA / Dream, whose own modeling code is
    bidirectional, only the record. ``"ar"``: a stale ``is_causal: false`` or record from the source
    config is removed, so the model runs causally as trained.

    Args:
        config: the config to mark (not modified; a copy is returned).
        objective: what the model was trained for.
        family: the dlmspec family of ``config``.

    A block-diffusion LM: ``"is_causal": false`` and the record of its block, its clean half's
    attention and its input (see the module docstring); the caller passes the mask.

    Raises:
        ConversionError: block-causal attention (transformers has no config flag for it); a
            block-diffusion LM without a block size.
    """
    out = dict(config)
    if not objective.is_diffusion:
        out.pop(CONFIG_KEY, None)
        if out.get("is_causal") is False:
            out.pop("is_causal")
        return out
    if objective.is_block_diffusion:
        if objective.block_size is None:
            raise ConversionError(
                f"objective {objective.kind!r} ({objective.source}) has no block size: a block-diffusion LM cannot be "
                "called without it", tensor="objective.block_size", expected="an integer >= 1",
                hint="pass block_size (the run's objective.block_size)")
        record = {"objective": objective.kind, "attention": BLOCK_DIFFUSION, "block_size": int(objective.block_size),
                  "clean_attention": "causal" if objective.clean_causal else "block_causal",
                  "input": "x_t (+) x_0", "position_ids": "repeated"}
        if objective.mask_token_id is not None:
            record["mask_token_id"] = int(objective.mask_token_id)
            out.setdefault("mask_token_id", int(objective.mask_token_id))
        out[CONFIG_KEY] = record
        if family not in DIFFUSION_FAMILIES:
            out["is_causal"] = False
        return out
    if objective.attention not in ("bidirectional", "full"):
        raise ConversionError(
            f"objective attention = {objective.attention!r} ({objective.source}): a block-causal diffusion LM has no "
            "Hugging Face config flag (transformers' is_causal is all or nothing), so the export would run with "
            "the wrong attention", tensor="objective.attention_mask", expected="bidirectional",
            hint="export a model trained with objective.attention_mask = 'bidirectional'")
    record: dict[str, Any] = {"objective": "mdm", "attention": "bidirectional"}
    if objective.mask_token_id is not None:
        record["mask_token_id"] = int(objective.mask_token_id)
        out.setdefault("mask_token_id", int(objective.mask_token_id))
    out[CONFIG_KEY] = record
    if family not in DIFFUSION_FAMILIES:
        out["is_causal"] = False
    return out


def __getattr__(name: str) -> Any:
    """``OBJECTIVES``: the ``[objective] kind`` values, :func:`dlmspec.objectives.kinds` (the
    registry, read each time)."""
    if name == "OBJECTIVES":
        return objectives.kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
