"""The settings of ``dlmspec generate`` and ``eval``: which value each ``GenerateConfig`` field takes
and where it came from (:func:`resolve_settings`; lowest first: ``GenerateConfig``'s defaults,
the checkpoint's ``spec.lock.toml`` ``[generate]`` table, ``--spec FILE``'s, then the flags),
and the token ids checked against the model (:func:`check_token_ids`). Errors are issues naming
the flag or key (:func:`_issue`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from dlmspec import objectives
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.spec.lines import COMMAND_LINE

#: The ``[generate]`` table's keys (``GenerateSpec``), in ``GenerateConfig``'s order.
TABLE_FIELDS = ("gen_length", "steps", "block_length", "remasking", "threshold", "factor", "cache", "cache_refresh",
                "compile", "cuda_graph", "temperature", "top_k", "top_p", "cfg_scale", "seed")


#: ``GenerateConfig`` fields that come from the model (its record and tokenizer) unless a flag sets them.
MODEL_FIELDS = ("kind", "mask_token_id", "eos_token_id", "pad_token_id")


def flag(field: str) -> str:
    """The command-line spelling of a ``GenerateConfig`` field: ``block_length`` -> ``--block-length``."""
    return "--" + field.replace("_", "-")


def _issue(key: str, value: Any, why: str, fix: str, rule: str = "generate-input", file: str | None = None,
           line: int | None = None) -> SpecError:
    """A :class:`SpecError` of one issue. An issue of a flag (``--prompts``) or of the argument
    ``RUN_OR_CHECKPOINT`` with no file of its own is placed on the ``command line`` (as ``--set``'s
    are), not in a spec."""
    if file is None and (key.startswith("--") or key == "RUN_OR_CHECKPOINT"):
        file = COMMAND_LINE
    return SpecError([SpecIssue(key=key, value=value, message=why, hint=fix, rule=rule, file=file, line=line,
                                source="dlmspec.cli.generate")])


class Settings:
    """The resolved ``GenerateConfig`` keyword arguments and where each came from.

    Attributes:
        values: field -> value (every ``GenerateConfig`` field).
        origins: field -> ``"default"``, ``"model"`` (the checkpoint's record / tokenizer),
            ``"checkpoint"`` (its spec.lock.toml ``[generate]``), ``"spec"`` (``--spec``) or ``"flag"``.
        where: field -> ``(key, file, line)`` to name in an error about it.
    """

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.origins: dict[str, str] = {}
        self.where: dict[str, tuple[str, str | None, int | None]] = {}
        #: ``[generate] preset`` of the spec (else the checkpoint's), recorded with every output.
        self.preset: str | None = None

    def set(self, field: str, value: Any, origin: str, key: str, file: str | None = None,
            line: int | None = None) -> None:
        self.values[field] = value
        self.origins[field] = origin
        self.where[field] = (key, file, line)


def resolve_settings(*, kind: str, mask_token_id: Optional[int], eos_token_id: Optional[int],
                     pad_token_id: Optional[int], lock_table: Optional[dict[str, Any]] = None,
                     lock_file: Optional[str] = None, spec_table: Optional[dict[str, Any]] = None,
                     spec_locate: Optional[Callable[[str], tuple[Any, Any]]] = None,
                     flags: Optional[dict[str, Any]] = None) -> tuple[Any, Settings]:
    """Join the sources of the settings (module docstring) into a ``GenerateConfig``.

    Args:
        kind, mask_token_id, eos_token_id, pad_token_id: the model's (``LoadedModel``).
        lock_table: the checkpoint's ``[generate]`` table (raw TOML values; unknown keys ignored).
        lock_file: its file, for errors.
        spec_table: the keys ``--spec``'s ``[generate]`` sets.
        spec_locate: ``dotted key -> (file, line)`` of the ``--spec`` file.
        flags: field -> value of the flags given (``None`` = not given; ``eos_token_id = -1``: none).

    Returns:
        ``(GenerateConfig, Settings)``.

    Raises:
        SpecError: a value ``GenerateConfig`` refuses, named where it came from (the flag, or the
            spec key with file and line) with its fix.
    """
    from dlmspec.generate_settings import FOLLOW_GEN_LENGTH, GenerateConfig, GenerateConfigError

    s = Settings()
    defaults = GenerateConfig.__dataclass_fields__
    for field in TABLE_FIELDS:
        s.set(field, defaults[field].default, "default", flag(field))
    for field, value in (("kind", kind), ("mask_token_id", mask_token_id), ("eos_token_id", eos_token_id),
                         ("pad_token_id", pad_token_id)):
        s.set(field, value, "model", flag(field))
    for field, value in (lock_table or {}).items():
        if field == "preset" and isinstance(value, str):
            s.preset = value  # its settings are in the table already (filled in when the spec was validated)
        if field in TABLE_FIELDS:
            s.set(field, value, "checkpoint", f"generate.{field}", lock_file)
    for field, value in (spec_table or {}).items():
        if field == "preset":
            s.preset = value
            continue
        file, line = spec_locate(f"generate.{field}") if spec_locate else (None, None)
        s.set(field, value, "spec", f"generate.{field}", file, line)
    for field, value in (flags or {}).items():
        if value is None:
            continue
        if field == "eos_token_id" and value == -1:
            value = None
        s.set(field, value, "flag", flag(field))
    for field in FOLLOW_GEN_LENGTH:  # not given anywhere: follow a given gen_length (follow_gen_length)
        if s.origins[field] == "default" and s.origins["gen_length"] != "default":
            s.set(field, s.values["gen_length"], "default", flag(field))
    registered = objectives.find(s.values["kind"])  # an unregistered kind: refused by GenerateConfig below
    if registered is not None and not registered.diffusion:
        s.values["mask_token_id"] = None  # an AR model has none; a flag giving one changes nothing
    try:
        config = GenerateConfig(**s.values)
    except GenerateConfigError as exc:
        key, file, line = s.where.get(exc.field, (flag(exc.field), None, None))
        origin = s.origins.get(exc.field, "default")
        why, fix = _config_error_words(exc, key)
        if origin in ("default", "model"):
            why += f" (the {'default' if origin == 'default' else 'model'}'s value)"
        elif origin == "checkpoint" and any(v is not None for v in (flags or {}).values()):
            # the run's own [generate] against the flags given: the user fixes it with a flag, not its lock
            why += " (the checkpoint's value, beside the flags given)"
            fix = f"{_config_error_words(exc, flag(exc.field))[1]}: a flag overrides the checkpoint's [generate]"
        raise _issue(key, exc.value, why, fix, rule="generate-settings", file=file, line=line) from None
    return config, s


#: The kinds ``--kind`` names for a converted checkpoint: the sampler's (``load_model`` refuses
#: block-causal models, docs/generate.md).
LOAD_KINDS = ("mdm", "ar")


def load_flag_issues(device: str, dtype: Optional[str], kind: Optional[str]) -> list[SpecIssue]:
    """Issues of the flags that say how to load the model (``--device``, ``--dtype``, ``--kind``),
    found before it loads so they join the other flags' in one table. ``--device``: ``auto``,
    ``cpu``, ``cuda`` or ``cuda:N``; whether that device exists is known only once torch runs."""
    import re

    issues = []
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device or ""):
        issues.append(("--device", device, "not a device", "--device auto, cpu, cuda or cuda:N"))
    if dtype is not None and dtype not in ("bf16", "fp16", "fp32"):
        issues.append(("--dtype", dtype, "not a dtype", "--dtype bf16, fp16 or fp32"))
    if kind is not None and kind not in LOAD_KINDS:
        issues.append(("--kind", kind, "not a kind the sampler takes (block-causal models are refused)",
                       " or ".join(f"--kind {k}" for k in LOAD_KINDS)))
    return [_issue(key, value, why, fix).issues[0] for key, value, why, fix in issues]


def flag_value_issues(flags: dict[str, Any]) -> list[SpecIssue]:
    """Issues of the given flags whose values no model takes: each ``[generate]`` field given as a
    flag, checked alone against ``GenerateSpec``'s type and range (the ``--remasking`` names, a
    temperature >= 0, the ``--cache`` names, ...), so that ``generate`` reports them in the same pass
    as a missing run or a bad prompts file. What depends on the model or on other fields (token
    ids, block division) is :func:`resolve_settings`'s, once the model loads.

    Returns:
        One :class:`SpecIssue` per refused flag, on the command line, its fix the field's default.
    """
    from pydantic import ValidationError

    from dlmspec.spec.generate_models import GenerateSpec

    issues = []
    for field, value in flags.items():
        if value is None or field not in TABLE_FIELDS:
            continue
        try:
            GenerateSpec.model_validate({field: value})
        except ValidationError as exc:
            own = [e for e in exc.errors() if tuple(e.get("loc", ())) == (field,)]
            if not own:
                continue
            why, fix = _config_words(field, value)
            if why is None:
                default = GenerateSpec.model_fields[field].default
                why, fix = own[0]["msg"], f"use {flag(field)} {default}" if default is not None else f"leave out {flag(field)}"
            issues.append(SpecIssue(key=flag(field), value=value, message=why, hint=fix,
                                    rule="generate-settings", file=COMMAND_LINE, source="dlmspec.cli.generate"))
    return issues


def _config_words(field: str, value: Any) -> tuple[Optional[str], Optional[str]]:
    """``GenerateConfig``'s own why and fix for ``field = value`` given as a flag
    (:func:`_config_error_words`), or ``(None, None)`` when it refuses another field."""
    from dlmspec.generate_settings import GenerateConfig, GenerateConfigError

    try:
        GenerateConfig(kind="mdm", mask_token_id=0, **{field: value})
    except GenerateConfigError as exc:
        if exc.field == field:
            return _config_error_words(exc, flag(field))
    return None, None


def _config_error_words(exc: Any, key: str) -> tuple[str, str]:
    """A ``GenerateConfigError``'s why and ``"use FIX"``, the fix in the flag's spelling when ``key``
    is a flag (``"use --block-length 2"``), else as the spec key writes it."""
    why = str(exc).split(": ", 1)[-1].split("; use ")[0]
    if not key.startswith("--"):
        return why, f"use {exc.fix}"
    unset = f"{exc.field} = None"
    if exc.fix.startswith(unset):  # None is no flag value: "top_k = None (all tokens) or 50"
        rest = exc.fix[len(unset):].strip()
        note, _, other = rest.partition(" or ")
        if note and not note.startswith("("):
            note, other = "", rest.removeprefix("or ").strip()
        fix = f"leave out {key}" + (f" {note}" if note else "") + (f", or use {key} {other}" if other else "")
        return why.replace(" or None", "; or leave the flag out"), fix
    return why, f"use {exc.fix.replace(f'{exc.field} = ', f'{key} ')}"


def embedding_rows(model: Any) -> int:
    """How many token ids the model embeds: the record's ``model.padded_vocab_size`` (the mask
    token of a runtime model sits in the padding), else the logits' width ``model.vocab_size``."""
    padded = (getattr(model, "record", None) or {}).get("model.padded_vocab_size")
    return int(padded) if isinstance(padded, int) and not isinstance(padded, bool) else int(model.vocab_size)


def check_token_ids(model: Any, config: Any, settings: Settings) -> None:
    """Refuse a mask, EOS or padding id the model has no embedding for (``--mask-token-id
    1000000000000000000000000000000``), named where it came from, before the sampler writes it
    into a tensor.

    Raises:
        SpecError: the id, its flag or key, and the model's range.
    """
    rows = embedding_rows(model)
    for field in ("mask_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, field)
        if value is None or value < rows:
            continue
        key, file, line = settings.where.get(field, (flag(field), None, None))
        default = {"mask_token_id": model.mask_token_id, "eos_token_id": model.eos_token_id}.get(field)
        fix = f"{key} {default}" if key.startswith("--") and default is not None else f"an id in 0..{rows - 1}"
        raise _issue(key, value, f"the model embeds token ids 0..{rows - 1}: {value} is not one of them",
                     f"use {fix} (the model's own)" if default is not None else f"use {fix}", file=file, line=line)
