"""Rules of the training data: datasets or mock data, the train/valid/test split, and the
DataLoader workers per rank."""

from __future__ import annotations

import os
import re
from typing import Any, Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
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
