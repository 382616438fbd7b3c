"""Rules of the training data: datasets or mock data, the train/valid/test split, and the
DataLoader workers per rank."""

from __future__ import annotations

import os
import re
from typing import Any, Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.errors import toml_text
from dlmspec.data.record import RecordError, file_sha256, read_record
from dlmspec.resolve import MANIFEST_KIND, BlendProblem, mixed_tokenizers


@rule(
    "data-required",
    "error",
    "megatron.core.datasets.blended_megatron_dataset_builder (a blend or mock data is needed)",
    "data.train names datasets, or data.mock = true",
)
def _data_required(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if not d.mock and not d.train:
        yield Finding("data.train", "no training data", "add data.train = [\"PREFIX\"] (PREFIX.bin/.idx), "
                      "or data.mock = true for random tokens", value=[], fix=Fix({"data.mock": True}))


@rule(
    "mock-ignores-data",
    "warning",
    "megatron.core.datasets.gpt_dataset.MockGPTDataset (random tokens; blends are not read)",
    "data.train / data.valid are not given with data.mock",
)
def _mock(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if d.mock:
        for key in ("train", "valid"):
            if getattr(d, key):
                yield Finding(f"data.{key}", "has no effect: data.mock = true reads no files",
                              f"remove data.{key}, or set data.mock = false",
                              value=[e.prefix for e in getattr(d, key)], fix=Fix(unset=(f"data.{key}",)))


_SPLIT = re.compile(r"\s*\d+(\.\d*)?\s*(,\s*\d+(\.\d*)?\s*){0,2}")


@rule(
    "split-format",
    "error",
    "megatron.core.datasets.blended_megatron_dataset_config.parse_and_normalize_split (at most 3 "
    "non-negative weights; dlmspec also requires them comma-separated)",
    "data.split is up to three non-negative weights with a positive train share",
)
def _split(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if d.mock or d.valid or not d.train:
        return
    fix = Fix({"data.split": "99,1,0"})
    if not _SPLIT.fullmatch(d.split):
        yield Finding("data.split", "not a train,valid,test list of weights", 'use e.g. split = "99,1,0"', fix=fix)
    elif float(d.split.split(",")[0]) <= 0:
        yield Finding("data.split", "gives no share of data.train to training", 'use e.g. split = "99,1,0"', fix=fix)


#: DataLoader workers per GPU rank above which a node cannot start them (processes and memory).
_MAX_WORKERS = 1024


#: More workers per GPU rank than a node has CPU cores per GPU (a DGX H100 has 14).
_MANY_WORKERS = 64


@rule(
    "num-workers-range",
    "error",
    "torch.utils.data.DataLoader (num_workers processes per GPU rank, each with torch and the dataset index: "
    "about 0.1-0.5 GiB of host memory)",
    f"data.num_workers is at most {_MAX_WORKERS}",
)
def _workers_range(ctx: Context) -> Iterator[Finding]:
    n, per_node = ctx.spec.data.num_workers, ctx.spec.cluster.gpus_per_node
    if n > _MAX_WORKERS:
        yield Finding("data.num_workers", f"{n:,} DataLoader processes per GPU rank ({n * per_node:,} per node) "
                      "cannot start: each holds torch and the dataset index, far beyond a node's memory and "
                      "process limits", "use num_workers = 2 (the default; a few per rank keep up with training)",
                      fix=Fix({"data.num_workers": 2}))


@rule(
    "num-workers-implausible",
    "warning",
    "torch.utils.data.DataLoader (num_workers processes per GPU rank); GPU nodes have 8-16 CPU cores per GPU "
    "(a DGX H100: 14)",
    f"data.num_workers is at most {_MANY_WORKERS}",
)
def _workers_implausible(ctx: Context) -> Iterator[Finding]:
    n, per_node = ctx.spec.data.num_workers, ctx.spec.cluster.gpus_per_node
    if _MANY_WORKERS < n <= _MAX_WORKERS:
        yield Finding("data.num_workers", f"{n} DataLoader processes per GPU rank ({n * per_node:,} per node) are "
                      "more than a node has CPU cores per GPU: the extra workers only take memory",
                      "use num_workers = 2 (the default; a few per rank keep up with training)",
                      fix=Fix({"data.num_workers": 2}))


# --------------------------------------------------------------------------------------------
# Globs and manifests of shards (dlmspec.resolve.resolve_blend): compile writes the shards they
# resolve to on this machine into train.py and spec.lock.toml, so what keeps them from
# resolving is an error (scope ``paths``: the verdict depends on the files here).

_BLEND_RULES: dict[str, tuple[str, str]] = {
    "data-glob-empty": (
        "glob.glob of PATTERN.bin / PATTERN.idx (or of manifests), sorted: the shards compile writes into the blend",
        "a glob in data.train / data.valid matches at least one dataset that holds tokens"),
    "data-manifest-missing": (
        "the manifest `dlmspec data prepare` writes beside a sharded output (PREFIX_KEY_document.manifest.json)",
        "a manifest named in data.train / data.valid exists"),
    "data-manifest-unreadable": (
        "the manifest layout {\"kind\", \"version\", \"shards\": [{\"path\", \"documents\", \"tokens\"}], \"tokenizer\"}",
        "a manifest is readable JSON listing its shards with their token counts"),
    "data-manifest-kind": (
        f"the manifest's kind {MANIFEST_KIND!r} and a version this dlmspec reads",
        "a manifest path names a dlmspec dataset manifest"),
    "data-shard-missing": (
        "megatron-core IndexedDataset opens PREFIX.bin and PREFIX.idx of every shard of the blend",
        "every shard a glob or manifest names has both files"),
    "data-index-unreadable": (
        "megatron-core indexed_dataset._IndexReader (the MMIDIDX header, version 1, sequence lengths)",
        "every shard's .idx is a readable Megatron index"),
    "data-manifest-tokens": (
        "the shard's .idx (the sum of its sequence lengths): the blend's weights come from the manifest's counts",
        "the tokens a manifest lists for a shard are the tokens in its .idx"),
    "data-tokenizer-mixed": (
        "the dataset records (PREFIX.dlmspec.json, dlmspec/data/record.py): the tokenizer each dataset was written with",
        "every dataset of data.train and data.valid was written by the same tokenizer"),
}


def _blend_problems(ctx: Context) -> list[BlendProblem]:
    """The resolution problems of both blends and the mixed-tokenizer ones, computed once per
    check run (several rules read them)."""
    if "blend_problems" not in ctx.cache:
        d = ctx.spec.data
        problems: list[BlendProblem] = []
        if not d.mock:
            train, valid = ctx.r.train_blend, ctx.r.valid_blend
            problems = [*train.problems, *valid.problems,
                        *mixed_tokenizers([("data.train", train), ("data.valid", valid)])]
        ctx.cache["blend_problems"] = problems
    return ctx.cache["blend_problems"]


def _blend_rule(rule_id: str) -> None:
    source, summary = _BLEND_RULES[rule_id]

    def check(ctx: Context) -> Iterator[Finding]:
        for p in _blend_problems(ctx):
            if p.rule == rule_id:
                yield Finding(p.key, f"{p.message} (in {p.path})" if p.path != p.entry else p.message,
                              p.hint, value=p.entry)

    check.__name__ = check.__qualname__ = "_" + rule_id.replace("-", "_")
    check.__doc__ = f"``{rule_id}``: {summary}."
    rule(rule_id, "error", source, summary, scope="paths")(check)


for _rule_id in _BLEND_RULES:
    _blend_rule(_rule_id)


#: A record's tokenizer file keys (dlmspec/data/record.py) -> the [data.tokenizer] key naming that file.
_RECORD_FILE_KEYS = {"tokenizer_model": "model", "vocab_file": "vocab_file", "merge_file": "merge_file"}


def _written_tokenizer(prefix: str) -> dict[str, Any] | None:
    """The tokenizer section of ``PREFIX.dlmspec.json`` (:mod:`dlmspec.data.record`), or None
    without a readable record (an unreadable one is left to the rules that read it)."""
    try:
        record = read_record(prefix)
    except (RecordError, OSError):
        return None
    return _record_tokenizer(record)


def _record_tokenizer(record: Any) -> dict[str, Any] | None:
    """A read record's tokenizer section, or None."""
    section = record.get("tokenizer") if isinstance(record, dict) else None
    return section if isinstance(section, dict) else None


def tokenizer_difference(spec_tokenizer: Any, written: dict[str, Any],
                         digests: dict[str, str] | None = None) -> str | None:
    """Why a dataset written with the record's tokenizer section ``written`` does not fit the
    spec's ``[data.tokenizer]`` (:class:`~dlmspec.spec.models.TokenizerSpec`), or None when
    nothing tells them apart: another type, or a file (``--tokenizer-model``, ``--vocab-file``,
    ``--merge-file``) whose SHA-256 differs from the one recorded. Files that are not here (a
    path of the job's machine, a hub name) and records without digests are not compared.
    ``digests`` (path -> SHA-256) keeps each spec file's digest across calls, so the shards of a
    manifest cost one hash of each tokenizer file, not one per shard."""
    kind = written.get("type")
    if kind != spec_tokenizer.type:
        return f"by {kind}, the spec's data.tokenizer.type is {spec_tokenizer.type!r}"
    files = written.get("files") if isinstance(written.get("files"), dict) else {}
    for record_key, spec_key in _RECORD_FILE_KEYS.items():
        entry, mine = files.get(record_key), getattr(spec_tokenizer, spec_key, None)
        if not isinstance(entry, dict) or not entry.get("sha256") or not mine or not os.path.isfile(mine):
            continue
        try:
            if digests is None:
                digest = file_sha256(mine)
            else:
                digest = digests[mine] if mine in digests else digests.setdefault(mine, file_sha256(mine))
            same = digest == entry["sha256"]
        except OSError:
            continue
        if not same:
            return (f"by {kind} with {record_key} {entry.get('path')!r}, whose contents (SHA-256) differ from "
                    f"the spec's data.tokenizer.{spec_key} {mine!r}")
    return None


@rule(
    "data-tokenizer-spec",
    "error",
    "the dataset records (PREFIX.dlmspec.json, dlmspec/data/record.py): the tokenizer `data prepare` wrote "
    "each dataset with, against [data.tokenizer] (megatron-core reads the ids with the spec's tokenizer)",
    "the datasets of data.train and data.valid have readable records and were written by the spec's tokenizer "
    "(type and files)",
    scope="paths",
)
def _tokenizer_spec(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if d.mock:
        return
    want = d.tokenizer
    digests: dict[str, str] = {}  # each spec tokenizer file hashed once
    for key, resolution in (("data.train", ctx.r.train_blend), ("data.valid", ctx.r.valid_blend)):
        seen: set[str] = set()
        for shard in resolution.shards:
            if shard.prefix in seen:  # a manifest may list a shard many times: its record is read once
                continue
            seen.add(shard.prefix)
            try:
                record = read_record(shard.prefix)
            except RecordError as exc:  # a FIFO, /dev/zero, 100,000 nested brackets, not JSON, ...
                yield Finding(key, f"{shard.prefix!r}: its record {exc.path} cannot be read ({exc.reason}), so "
                              "the tokenizer it was written with is unknown",
                              f"move {exc.path} away (the dataset is then used without a record), or prepare "
                              "the data again with `dlmspec data prepare`", value=shard.entry)
                break  # one per blend
            written = _record_tokenizer(record)
            why = tokenizer_difference(want, written, digests) if written is not None else None
            if why is None:
                continue
            files = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                             (("tokenizer_model", want.model), ("vocab_file", want.vocab_file),
                              ("merge_file", want.merge_file)) if v)
            yield Finding(key, f"{shard.prefix!r} was written {why} (its record {shard.prefix}.dlmspec.json): "
                          "the model would read its ids as other tokens",
                          f"prepare the data again with the spec's tokenizer (`dlmspec data prepare "
                          f"--tokenizer-type {want.type}{' ' + files if files else ''} ...`), or set "
                          f"[data.tokenizer] to the one the data was written with (type = {written.get('type')!r} "
                          "and its files)", value=shard.entry)
            break  # one per blend


# --------------------------------------------------------------------------------------------
# Unique-token caps and repetition (dlmspec.data.repetition: the arithmetic and its sources).

def _entries(entries: Any, drop_cap_at: int | None = None) -> list[dict[str, Any]]:
    """``entries`` as TOML-ready tables, without the cap of entry ``drop_cap_at`` (every cap when None)."""
    out = []
    for i, e in enumerate(entries):
        table: dict[str, Any] = {"prefix": e.prefix, "weight": e.weight}
        if e.max_unique_tokens is not None and drop_cap_at is not None and i != drop_cap_at:
            table["max_unique_tokens"] = e.max_unique_tokens
        out.append(table)
    return out


@rule(
    "data-cap-kind",
    "error",
    "dlmspec.backends.megatron.data.CappedGPTDataset: the cap cuts the training split of one megatron-core "
    "GPTDataset (an indexed dataset read by a pre-training stage)",
    "data.train[].max_unique_tokens is set only on a dataset prefix of data.train, of a pre-training stage, "
    "without mock data",
)
def _cap_kind(ctx: Context) -> Iterator[Finding]:
    from dlmspec.resolve import blend_kind

    d = ctx.spec.data
    for i, e in enumerate(d.valid):
        if e.max_unique_tokens is not None:
            yield Finding("data.valid", f"{e.prefix!r} sets max_unique_tokens: the cap applies to training data "
                          "only (validation reads its whole split, so capped runs are compared on the same data)",
                          f"remove its max_unique_tokens: set data.valid = {toml_text(_entries(d.valid))}",
                          value=e.prefix, fix=Fix({"data.valid": _entries(d.valid)}))
    capped = [(i, e) for i, e in enumerate(d.train) if e.max_unique_tokens is not None]
    if not capped:
        return
    if d.mock:
        yield Finding("data.train", "max_unique_tokens with data.mock = true: mock data has no documents to cap",
                      "remove data.train (mock data reads no files), or set data.mock = false to train on the "
                      "capped datasets", value=[e.prefix for _, e in capped], fix=Fix(unset=("data.train",)))
        return
    if ctx.spec.stage.kind != "pretrain":
        fixed = _entries(d.train)
        yield Finding("data.train", f"max_unique_tokens with stage.kind = {ctx.spec.stage.kind!r}: only a "
                      "pre-training stage reads data.train through megatron-core's GPT datasets, which the cap "
                      "cuts", f"remove the caps: set data.train = {toml_text(fixed)}",
                      value=[e.prefix for _, e in capped], fix=Fix({"data.train": fixed}))
        return
    for i, e in capped:
        kind = blend_kind(e.prefix)
        if kind != "prefix":
            fixed = _entries(d.train, drop_cap_at=i)
            yield Finding("data.train", f"{e.prefix!r} is a {kind} of shards: max_unique_tokens caps one dataset "
                          "prefix (a prefix of its documents in file order)",
                          f"name one dataset prefix (a shard's PREFIX) with the cap, or remove the cap: set "
                          f"data.train = {toml_text(fixed)}", value=e.prefix, fix=Fix({"data.train": fixed}))


def _repetition(ctx: Context) -> Any:
    """:func:`dlmspec.data.repetition.repetition` of the spec, computed once per check run."""
    if "repetition" not in ctx.cache:
        from dlmspec.data.repetition import repetition

        ctx.cache["repetition"] = repetition(ctx.spec, ctx.r)
    return ctx.cache["repetition"]


@rule(
    "data-cap-tokens",
    "error",
    "dlmspec.data.repetition.capped_documents over the dataset's .idx (megatron-core sequence_lengths of its "
    "training split)",
    "each data.train[].max_unique_tokens is at most its dataset's training tokens and keeps at least one document",
    scope="paths",
)
def _cap_tokens(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if d.mock or ctx.spec.stage.kind != "pretrain" or not any(e.max_unique_tokens for e in d.train):
        return
    rep = _repetition(ctx)
    if rep is None:
        return
    known = {r.data.prefix: r.data for r in rep.datasets if r.data.cap is not None}
    for i, e in enumerate(d.train):
        data = known.get(e.prefix)
        if data is None or e.max_unique_tokens is None:
            continue
        key = f"data.train.{i}.max_unique_tokens"
        if data.split_tokens is None:  # no readable .idx: the record's count of the whole dataset bounds the split
            if data.tokens is not None and e.max_unique_tokens > data.tokens:
                yield Finding("data.train", f"{e.prefix!r}: max_unique_tokens {e.max_unique_tokens:,} is more than "
                              f"the {data.tokens:,} tokens its record gives for the whole dataset: the cap caps "
                              "nothing", f"set {key} = {data.tokens} (at most), or remove it",
                              value=e.prefix, fix=Fix({key: data.tokens}))
            continue
        if e.max_unique_tokens > data.split_tokens:
            yield Finding("data.train", f"{e.prefix!r}: max_unique_tokens {e.max_unique_tokens:,} is more than the "
                          f"{data.split_tokens:,} tokens of its training split ({data.source}): the cap caps nothing",
                          f"set {key} = {data.split_tokens} (the whole split), or remove it",
                          value=e.prefix, fix=Fix({key: data.split_tokens}))
        elif data.kept_documents == 0:
            yield Finding("data.train", f"{e.prefix!r}: max_unique_tokens {e.max_unique_tokens:,} keeps no whole "
                          f"document (the first document of its training split holds {data.first_document:,} "
                          "tokens)", f"set {key} = {data.first_document} (one document) or more",
                          value=e.prefix, fix=Fix({key: data.first_document}))


@rule(
    "data-repetition",
    "warning",
    "Muennighoff et al. 2023 (arXiv:2305.16264): AR returns diminish past ~4 epochs (R*_D ~ 15.4); Prabhudesai "
    "et al. 2025 (arXiv:2507.15857) and Ni et al. 2025, 'Diffusion Language Models are Super Data Learners' "
    "(arXiv:2511.03276): masked diffusion LMs use repeated data well up to ~100 epochs",
    "no training dataset is repeated for more epochs than the literature reports as useful for the objective "
    "(AR: 4, diffusion: 100); a note, not an error",
    scope="paths",
)
def _repetition_note(ctx: Context) -> Iterator[Finding]:
    import math

    if ctx.spec.data.mock or ctx.spec.stage.kind != "pretrain":
        return
    rep = _repetition(ctx)
    if rep is None or not rep.over:
        return
    t = ctx.spec.train
    per_step = t.global_batch_size * t.seq_length
    # the most steps that keep every dataset at or below the threshold: weight x iters x per_step / U <= E
    iters = min(math.floor(rep.threshold * r.data.unique_tokens / (r.weight * per_step)) for r in rep.over)
    for r in rep.over:
        what = "a diffusion" if rep.diffusion else "an AR"
        message = (f"{r.data.prefix!r} is repeated {r.epochs:,.1f} epochs ({r.drawn_tokens:,.0f} tokens drawn from "
                   f"{r.data.unique_tokens:,} unique), past the ~{rep.threshold:g} epochs {what} objective is "
                   f"reported to use well ({rep.source})")
        if iters < 1:
            yield Finding("data.train", message, "use more unique data (a larger dataset or a higher "
                          "max_unique_tokens), or fewer steps", value=r.data.entry)
        elif ctx.is_set("train.train_tokens") and t.train_iters is None:
            yield Finding("data.train", message, f"if that is not the study's intent, set train.train_tokens = "
                          f"{iters * per_step} (or use more unique data)", value=r.data.entry,
                          fix=Fix({"train.train_tokens": iters * per_step}))
        else:
            yield Finding("data.train", message, f"if that is not the study's intent, set train.train_iters = "
                          f"{iters} (or use more unique data)", value=r.data.entry,
                          fix=Fix({"train.train_iters": iters}))
