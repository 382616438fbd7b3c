"""Rules of the spec's strings: no secret in any of them, no character a path, an environment
variable or a UTF-8 file cannot carry, and no blank name or path."""

from __future__ import annotations

import re
from typing import Any, Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.check.tokenizer import TOKENIZER_NEEDS
from dlmspec.credentials import ENV_TABLES, ENVIRONMENT_FIX, HIDDEN, NEVER_WRITTEN, is_secret_name, spec_secrets, walk_strings


@rule(
    "secret-in-spec",
    "error",
    "dlmspec.credentials (every spec string reaches a generated file: train.py, launch.sh, launch.sbatch, "
    "spec.lock.toml, plan.json)",
    "no string of the spec holds a token, a key or a credential inside a URL",
)
def _secret_in_spec(ctx: Context) -> Iterator[Finding]:
    for key, what in spec_secrets(ctx.spec):
        table, _, name = key.rpartition(".")
        if table in ENV_TABLES and is_secret_name(name):
            continue  # a secret name: the slurm-secret rule (dlmspec.check.slurm) reports it
        fix = _without(ctx, key)
        hint = ENVIRONMENT_FIX.replace("remove it from the spec", f"remove it from the spec ({fix.text()})", 1)
        yield Finding(key, f"holds {what}; {NEVER_WRITTEN}", hint, value=HIDDEN, fix=fix)


#: A W&B API key as a whole value: 40 lowercase hex digits (``local-`` before them: a W&B
#: server's key). Matched in the ``[logging]`` W&B strings only: elsewhere 40 hex digits are
#: usually a git commit (``checkpoint.init_from`` revisions).
_WANDB_KEY = re.compile(r"(?:local-)?[0-9a-f]{40}")


@rule(
    "wandb-key-in-spec",
    "error",
    "wandb (the library reads its API key from WANDB_API_KEY or ~/.netrc); every spec string reaches a "
    "generated file",
    "no [logging] W&B setting holds a W&B API key",
)
def _wandb_key_in_spec(ctx: Context) -> Iterator[Finding]:
    lg = ctx.spec.logging
    values = [(f"logging.{name}", getattr(lg, name)) for name in
              ("wandb_project", "wandb_exp_name", "wandb_entity", "wandb_save_dir")]
    values += [(f"logging.wandb_tags.{i}", tag) for i, tag in enumerate(lg.wandb_tags or ())]
    for key, value in values:
        if isinstance(value, str) and _WANDB_KEY.fullmatch(value.strip()):
            fix = _without(ctx, key)
            yield Finding(key, f"holds a W&B API key (40 hex digits); {NEVER_WRITTEN}",
                          f"remove it from the spec ({fix.text()}) and export WANDB_API_KEY=<key> in the shell "
                          "you start the job from; the job inherits it", value=HIDDEN, fix=fix)


#: Tables whose strings :func:`_string_characters` leaves to others: ``[cluster.slurm]`` strings
#: are checked by :mod:`dlmspec.check.slurm` (stricter: no control character reaches an
#: ``#SBATCH`` line), and a spec's ``[lock]`` table is dropped by compile (it writes its own).
_STRINGS_CHECKED_ELSEWHERE = ("cluster.slurm", "lock")


@rule(
    "string-characters",
    "error",
    "POSIX (paths, names and environment variables end at NUL); generated files are UTF-8 "
    "(dlmspec.escape writes every other character)",
    "no spec string holds NUL or a lone surrogate",
)
def _string_characters(ctx: Context) -> Iterator[Finding]:
    for key, text in walk_strings(ctx.spec):
        if any(key == t or key.startswith(t + ".") for t in _STRINGS_CHECKED_ELSEWHERE):
            continue
        if "\x00" in text:
            fix = _cleaned(ctx, key)
            yield Finding(key, "holds a NUL character, which no path, name or environment variable can carry",
                          f"remove the NUL character (written \\u0000 in TOML): {fix.text()}", value=text, fix=fix)
        elif any("\ud800" <= ch <= "\udfff" for ch in text):
            fix = _cleaned(ctx, key)
            yield Finding(key, "holds a lone surrogate (half of a UTF-16 pair), which is not a character and "
                          "cannot be written into the UTF-8 files compile generates",
                          f"write the character itself (without it: {fix.text()})", value=text, fix=fix)


def _list_key(key: str) -> tuple[str, int | None]:
    """``("data.train", 0)`` for ``data.train.0.prefix`` (a string inside a list: the list's key
    and the entry's index); ``(key, None)`` for a key outside lists."""
    parts = key.split(".")
    index = next((i for i, p in enumerate(parts) if p.isdigit()), None)
    if index is None:
        return key, None
    return ".".join(parts[:index]), int(parts[index])


def _at(node: Any, key: str) -> Any:
    """The value at dotted ``key`` under ``node``, through spec tables, free-form dicts and lists
    (indices), as :func:`dlmspec.credentials.walk_strings` names them; None past a missing part."""
    for part in key.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, (list, tuple)):
            node = node[int(part)] if part.isdigit() and int(part) < len(node) else None
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _plain(value: Any) -> Any:
    """A spec value as the data a spec file writes: tables as dicts of their set keys."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "model_fields_set"):
        return {k: _plain(getattr(value, k)) for k in sorted(value.model_fields_set)}
    return value


def _clean_text(text: str) -> str:
    return "".join(ch for ch in text if ch != "\x00" and not "\ud800" <= ch <= "\udfff")


def _cleaned(ctx: Context, key: str) -> Fix:
    """The fix that drops NUL characters and lone surrogates from the string at ``key`` (the
    whole list rewritten when the string is inside one)."""
    top, index = _list_key(key)
    if index is None:
        return Fix({key: _clean_text(_at(ctx.spec, key) or "")})

    def clean(node: Any) -> Any:
        if isinstance(node, str):
            return _clean_text(node)
        if isinstance(node, list):
            return [clean(v) for v in node]
        if isinstance(node, dict):
            return {k: clean(v) for k, v in node.items()}
        return node

    return Fix({top: clean(_plain(_at(ctx.spec, top)))})


def _without(ctx: Context, key: str) -> Fix:
    """The fix that removes the string at ``key`` (its entry, when it is inside a list)."""
    top, index = _list_key(key)
    if index is None:
        return Fix(unset=(key,))
    rest = [v for i, v in enumerate(_plain(_at(ctx.spec, top)) or []) if i != index]
    return Fix({top: rest}) if rest else Fix(unset=(top,))


#: Spec strings that name a run, a file, a directory or a key: None (unset) is fine, blank never
#: is. -> (what a blank one breaks, the fix).
_NAMED_STRINGS: dict[str, tuple[str, str]] = {
    "name": ("the run's folders (runs/<name>) and job name", 'give the run a name, e.g. name = "my-run"'),
    # the fix of each: the value after `= ` in the hint (quoted), else removing the key
    "checkpoint.save": ("the checkpoint directory", "remove checkpoint.save (unset: no checkpoints), or give a directory"),
    "checkpoint.load": ("the directory to load from", "remove checkpoint.load (unset: it loads from checkpoint.save)"),
    "logging.run_dir": ("the run directory", "remove logging.run_dir (unset: runs/<name>)"),
    "logging.tensorboard_dir": ("the TensorBoard directory", "remove logging.tensorboard_dir (unset: no TensorBoard)"),
    "logging.wandb_project": ("the wandb project", "remove logging.wandb_project (unset: no wandb)"),
    "logging.wandb_exp_name": ("the wandb run name", "remove logging.wandb_exp_name (unset: the run's name)"),
    "logging.wandb_save_dir": ("the W&B save directory", "remove logging.wandb_save_dir (unset: <run_dir>/wandb)"),
    "logging.wandb_entity": ("the W&B entity", "remove logging.wandb_entity (unset: the API key's own)"),
    "stage.sft.prompt_key": ("the JSON key of prompts", 'use prompt_key = "prompt"'),
    "stage.sft.response_key": ("the JSON key of responses", 'use response_key = "response"'),
    "stage.rl.prompts": ("the prompts file", 'use prompts = "prompts.jsonl"'),
}


#: What each tokenizer file key is, for the blank-value hint.
_TOKENIZER_FILE_HINTS = {
    "model": "set data.tokenizer.model to a tokenizer.json, a folder or a .model file",
    "vocab_file": "set data.tokenizer.vocab_file (GPT-2 vocab.json)",
    "merge_file": "set data.tokenizer.merge_file (GPT-2 merges.txt)",
}


def _blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


@rule(
    "blank-value",
    "error",
    "the runtime opens these paths and names these folders (megatron-core IndexedDataset, Megatron-LM "
    "build_tokenizer, checkpointing, logging): an empty or blank string names nothing (or the current directory)",
    "names and paths are not empty or blank",
)
def _blank_value(ctx: Context) -> Iterator[Finding]:
    for key, (what, hint) in _NAMED_STRINGS.items():
        if _blank(ctx.value(key)):
            named = hint.partition(' = "')[2].partition('"')[0]
            yield Finding(key, f"is empty or blank, but names {what}", hint,
                          fix=Fix({key: named}) if named else Fix(unset=(key,)))
    d = ctx.spec.data
    for key in ("train", "valid"):
        blank = [e.prefix for e in getattr(d, key) if _blank(e.prefix)]
        if blank:
            rest = [_plain(e) for e in getattr(d, key) if not _blank(e.prefix)]
            # with no entry left, training data is the user's to name (no fix of keys); validation
            # data may go (the split of data.train gives it)
            fix = Fix({f"data.{key}": rest}) if rest else Fix(unset=(f"data.{key}",)) if key == "valid" else None
            yield Finding(f"data.{key}", f"{len(blank)} entr{'y' if len(blank) == 1 else 'ies'} with an empty or blank "
                          "prefix, which names no dataset", "give each entry an indexed-dataset PREFIX (PREFIX.bin and "
                          "PREFIX.idx, written by `dlmspec data prepare`), or remove it"
                          + (f": {fix.text()}" if fix else ""), value=blank,
                          fix=fix)
    tok = d.tokenizer
    for key, hint in _TOKENIZER_FILE_HINTS.items():
        if _blank(getattr(tok, key)):
            needed = key in TOKENIZER_NEEDS[tok.type]
            # a file the tokenizer reads is the user's to name: no fix of keys
            yield Finding(f"data.tokenizer.{key}", "is empty or blank, which names no file",
                          hint if needed else f"remove data.tokenizer.{key} ({tok.type} does not read it)",
                          fix=None if needed else Fix(unset=(f"data.tokenizer.{key}",)))
