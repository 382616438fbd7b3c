"""The rule that looks at files on this machine: the data, tokenizer and checkpoints the job
opens (scope ``paths``: a warning, since those files usually live on the cluster)."""

from __future__ import annotations

import os
import re
from typing import Iterator

from dlmspec.check.hints import join
from dlmspec.check.registry import Context, Finding, rule
from dlmspec.resolve import blend_kind


#: A Hugging Face hub id (``org/name``): a tokenizer that loads from the hub, not a local path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*")


def _exists(path: str) -> bool:
    try:
        return os.path.exists(path)
    except (OSError, ValueError):  # NUL bytes, names too long
        return False


def _near_miss(prefix: str) -> str | None:
    """What a data prefix that is not a dataset here names instead, when it is something
    ``dlmspec data prepare`` wrote: a sharded output's manifest (``PREFIX.manifest.json``), the
    prefix of a ``.bin`` / ``.idx`` name, or a file that is no prefix (a record, the progress file)."""
    if _exists(prefix + ".manifest.json"):
        return (f"{prefix!r} is a sharded output: name its manifest, prefix = {prefix + '.manifest.json'!r} "
                "(or a glob of its shards)")
    for ext in (".bin", ".idx"):
        stem = prefix[: -len(ext)]
        if prefix.endswith(ext) and _exists(stem + ".bin") and _exists(stem + ".idx"):
            return f"a prefix is written without {ext}: prefix = {stem!r}"
    if os.path.isfile(prefix):
        return (f"{prefix!r} is a file, not a dataset prefix (PREFIX of PREFIX.bin / PREFIX.idx, or a "
                "*.manifest.json)")
    return None


def _similar(path: str) -> str:
    """``"; did you mean 'NAME'?"`` when a file or folder beside ``path`` has a close name (a typo:
    ``reward.py`` for ``rewards.py``; :func:`difflib.get_close_matches`), else ``""``. Reads only the
    listing of ``path``'s folder, when it exists and holds at most 2,000 entries."""
    import difflib

    folder, name = os.path.split(path)
    try:
        with os.scandir(folder or ".") as entries:
            names = [e.name for _, e in zip(range(2001), entries)]
    except OSError:
        return ""
    if len(names) > 2000:
        return ""
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return f"; did you mean {os.path.join(folder, close[0])!r}?" if close else ""


#: The bundled demos' datasets -> the command (from the repository root) that writes them.
DEMO_DATA = {
    ".data/demo-sft-train_text_document": "python bench/sft_conversations.py --run",
    ".data/demo-sft-heldout_text_document": "python bench/sft_conversations.py --run",
}


def _writer(missing: list[str]) -> str:
    """What writes the missing prefixes: a demo's own command (:data:`DEMO_DATA`), else
    ``dlmspec data prepare``."""
    demo = sorted({DEMO_DATA[m] for m in missing if m in DEMO_DATA})
    if demo:
        return (f"`{'`, `'.join(demo)}` writes them (the SFT demo's conversations, from the data kit "
                "../shared/data or, without it, from Python's own docstrings; run from the repository root)")
    return "`dlmspec data prepare` writes them"


_ELSEWHERE = ("fine if it exists where the job runs (relative paths are read from the directory the job "
              "is launched in); else fix the path")


@rule(
    "path-not-found",
    "warning",
    "the launched job opens these: megatron-core IndexedDataset (PREFIX.bin, PREFIX.idx), Megatron-LM "
    "build_tokenizer (tokenizer files), checkpoint loading (checkpoint.load, checkpoint.init_from), the RL "
    "stage (stage.rl.prompts, reward files), the generation eval (eval.generation.prompts)",
    "data prefixes, tokenizer files and checkpoints to load exist on this machine",
    scope="paths",
)
def _paths(ctx: Context) -> Iterator[Finding]:
    d, tok, ck = ctx.spec.data, ctx.spec.data.tokenizer, ctx.spec.checkpoint
    if not d.mock:
        for key in ("train", "valid"):
            # globs and manifests are resolved on this machine: the data-glob-* / data-manifest-* rules report them
            missing = [e.prefix for e in getattr(d, key) if blend_kind(e.prefix) == "prefix"
                       and not (_exists(e.prefix + ".bin") and _exists(e.prefix + ".idx"))]
            if missing:
                near = [n for n in (_near_miss(m) for m in missing) if n]
                yield Finding(
                    f"data.{key}",
                    f"not on this machine: {join([repr(m) for m in missing], 3)} (PREFIX.bin / PREFIX.idx)"
                    + (f"; {'; '.join(near)}" if near else ""),
                    f"{_ELSEWHERE}; {_writer(missing)}",
                    value=missing,
                )
    for key in ("vocab_file", "merge_file"):
        value = getattr(tok, key)
        if value is not None and not _exists(value):
            yield Finding(f"data.tokenizer.{key}", "not on this machine" + _similar(value), _ELSEWHERE)
    hub = tok.type == "HuggingFaceTokenizer" and tok.model is not None and _HUB_ID.fullmatch(tok.model)
    if tok.model is not None and tok.type != "NullTokenizer" and not hub and not _exists(tok.model):
        yield Finding("data.tokenizer.model", "not on this machine", _ELSEWHERE)
    if ck.init_from is not None:
        kind, _, target = ck.init_from.partition(":")
        if kind in ("hf", "mcore") and target and not _exists(target):
            what = "a local Hugging Face model folder" if kind == "hf" else "a megatron-core checkpoint directory"
            yield Finding("checkpoint.init_from", f"not on this machine ({what} is read)", _ELSEWHERE)
    if ck.load is not None and ck.load != ck.save and not _exists(ck.load):
        yield Finding("checkpoint.load", "not on this machine", _ELSEWHERE)
    if ctx.spec.stage.kind == "rl":  # the RL stage's prompts and reward files (dlmspec/check/rl.py reads them)
        from dlmspec.check.rl import rl_files

        for key, path in rl_files(ctx.spec):
            if not _exists(path):
                yield Finding(key, f"{path}: not on this machine{_similar(path)}", _ELSEWHERE, value=path)
    generation = ctx.spec.eval.generation if ctx.spec.eval is not None else None
    if generation is not None and not _exists(generation.prompts):  # its rows: rule eval-generation-prompts
        yield Finding("eval.generation.prompts", "not on this machine" + _similar(generation.prompts),
                      f"{_ELSEWHERE}; `dlmspec task make` writes one")
