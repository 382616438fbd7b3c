"""Shards named in the spec: ``data.train`` / ``data.valid`` entries may be a glob of
dataset prefixes or a manifest of a sharded output (``*.manifest.json``), alone or with a weight
(the group's share, split over its shards by tokens). ``compile`` writes the resolved shards
into train.py's blend and spec.lock.toml; the rules ``data-glob-*`` / ``data-manifest-*`` /
``data-shard-missing`` / ``data-index-unreadable`` / ``data-tokenizer-mixed`` refuse what does not
resolve. The shards are tiny Megatron indexed datasets (tests/kits/blend_shards.py)."""

from __future__ import annotations

import ast
import copy
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
import tomli_w


from blend_shards import docs_of, manifest_text, null_tokenizer, write_shard  # noqa: E402

from dlmspec.check import RULES, load_for  # noqa: E402
from dlmspec.cli import main  # noqa: E402
from dlmspec.errors import SpecError  # noqa: E402
from dlmspec.render.compile import compile_spec  # noqa: E402

from blend_kit import (  # noqa: F401 (fixtures among them)
    BASE,
    spec,
)


#: Tokens of the three shards data/web-0000{0,1,2}_text_document.
TOKENS = (10, 20, 30)


def shard(i: int) -> str:
    return f"data/web-{i:05d}_text_document"


@pytest.fixture
def three(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three shards of 10, 20 and 30 tokens (with records of one NullTokenizer) under tmp_path/data,
    tmp_path the working directory (relative prefixes are read from it)."""
    monkeypatch.chdir(tmp_path)
    for i, tokens in enumerate(TOKENS):
        write_shard(str(tmp_path / shard(i)), docs_of(tokens), null_tokenizer())
    return tmp_path




def blend_of(train_py: Path, key: str = "blend") -> Any:
    """The literal of ``blend=`` (or ``valid_blend=``) in a compiled train.py."""
    for line in train_py.read_text().splitlines():
        if line.strip().startswith(key + "="):
            return ast.literal_eval(line.strip()[len(key) + 1:].rstrip(","))
    raise AssertionError(f"no {key}= in {train_py}")


def issues(path: Path) -> list[tuple[str, str, str]]:
    """(rule, key, severity) of what ``validate`` reports for ``path``."""
    try:
        found = load_for("validate", path, [])[2]
    except SpecError as exc:
        found = exc.issues
    return [(i.rule, i.key, i.severity) for i in found]


def issue(path: Path, rule: str) -> Any:
    found = load_for("validate", path, [])[2]
    (one,) = [i for i in found if i.rule == rule]
    return one


# ------------------------------------------------------------------------------------------
# Resolution and compile


def test_a_glob_compiles_to_its_shards_weighted_by_tokens(three: Path) -> None:
    compile_spec(spec(three), three / "out")
    blend = blend_of(three / "out" / "train.py")
    assert [p for p, _ in blend] == [shard(0), shard(1), shard(2)]
    total = sum(TOKENS)
    for (_, weight), tokens in zip(blend, TOKENS):
        assert weight == pytest.approx(tokens / total)
    # megatron-core's builder normalises the weights (megatron.core.datasets.utils.normalize): they sum to 1 already
    assert math.isclose(sum(w for _, w in blend), 1.0)


def test_the_same_spec_compiles_byte_identically_and_its_lock_to_the_same_blend(three: Path) -> None:
    compile_spec(spec(three), three / "a")
    compile_spec(spec(three), three / "b")
    names = ("train.py", "spec.lock.toml", "plan.json", "launch.sh", "launch.sbatch")
    assert all((three / "a" / n).read_bytes() == (three / "b" / n).read_bytes() for n in names)
    lock = tomllib.loads((three / "a" / "spec.lock.toml").read_text())
    assert [e["prefix"] for e in lock["data"]["train"]] == [shard(0), shard(1), shard(2)]
    # the lock holds the shards: it compiles to the same blend once more shards appear
    write_shard(str(three / shard(3)), docs_of(40), null_tokenizer())
    compile_spec(three / "a" / "spec.lock.toml", three / "c")
    assert blend_of(three / "c" / "train.py") == blend_of(three / "a" / "train.py")
    assert (three / "c" / "spec.lock.toml").read_bytes() == (three / "a" / "spec.lock.toml").read_bytes()
    # the spec itself now resolves to four shards
    compile_spec(spec(three), three / "d")
    assert len(blend_of(three / "d" / "train.py")) == 4


def test_a_weighted_manifest_shares_its_weight_by_tokens_beside_a_plain_prefix(three: Path) -> None:
    (three / "data" / "web_text_document.manifest.json").write_text(manifest_text(
        [("web-00001_text_document", 5, 20), ("web-00000_text_document", 3, 10)]))
    write_shard(str(three / "data" / "code_text_document"), docs_of(7), null_tokenizer())
    path = spec(three, [{"prefix": "data/web_text_document.manifest.json", "weight": 0.3},
                        {"prefix": "data/code_text_document", "weight": 0.7}])
    assert [i for i in issues(path) if i[2] == "error"] == []
    compile_spec(path, three / "out")
    blend = blend_of(three / "out" / "train.py")
    # the manifest's shards in its order, then the plain prefix with its own weight
    assert [p for p, _ in blend] == [shard(1), shard(0), "data/code_text_document"]
    assert [w for _, w in blend] == pytest.approx([0.3 * 20 / 30, 0.3 * 10 / 30, 0.7])


def test_a_glob_of_manifests_and_a_valid_glob(three: Path) -> None:
    for name, rel in (("a", "web-00000_text_document"), ("b", "web-00002_text_document")):
        (three / "data" / f"{name}.manifest.json").write_text(manifest_text([(rel, 3 if name == "a" else 8,
                                                                              10 if name == "a" else 30)]))
    path = spec(three, ["data/*.manifest.json"], valid=["data/web-00001_text_*"])
    compile_spec(path, three / "out")
    assert blend_of(three / "out" / "train.py") == [(shard(0), 0.25), (shard(2), 0.75)]
    assert blend_of(three / "out" / "train.py", "valid_blend") == [(shard(1), 1.0)]


def test_plain_prefixes_are_written_as_given(three: Path) -> None:
    """A blend without globs or manifests is not read or normalised (bundled specs compile as before)."""
    path = spec(three, [{"prefix": shard(0), "weight": 2.0}, {"prefix": "elsewhere/x_text_document", "weight": 3.0}])
    compile_spec(path, three / "out")
    assert blend_of(three / "out" / "train.py") == [(shard(0), 2.0), ("elsewhere/x_text_document", 3.0)]


def test_unfinished_prepare_files_and_empty_shards_are_left_out(three: Path) -> None:
    tmp = three / "data" / "web-00003_text_document.tmp-host-1-ab"
    write_shard(str(tmp), docs_of(5))
    write_shard(str(three / "data" / "web-00004_text_document"), [], null_tokenizer())
    compile_spec(spec(three, ["data/web-*"]), three / "out")
    assert [p for p, _ in blend_of(three / "out" / "train.py")] == [shard(0), shard(1), shard(2)]


def test_path_not_found_leaves_globs_to_the_blend_rules(three: Path) -> None:
    found = issues(spec(three, ["data/none-*_text_document"]))
    assert ("data-glob-empty", "data.train", "error") in found
    assert not [f for f in found if f[0] == "path-not-found"]


def test_path_not_found_says_what_a_near_miss_names(three: Path) -> None:
    """A prefix that is not a dataset but names something dlmspec wrote gets a warning that says
    what to write instead: the manifest beside a sharded output's prefix, the prefix of a .bin /
    .idx name, and a file (the progress file) that is no dataset prefix."""
    (three / "data" / "web_text_document.manifest.json").write_text(manifest_text(
        [(f"web-{i:05d}_text_document", 3, t) for i, t in enumerate(TOKENS)]))
    (three / "data" / "web.prepare-progress.json").write_text("{}")
    cases = [("data/web_text_document", "data/web_text_document.manifest.json"),
             ("data/web-00000_text_document.bin", "prefix = 'data/web-00000_text_document'"),
             ("data/web.prepare-progress.json", "is a file, not a dataset prefix")]
    for entry, said in cases:
        (found,) = [i for i in load_for("validate", spec(three, [entry]), [])[2] if i.rule == "path-not-found"]
        assert found.key == "data.train" and said in found.message + " " + found.hint, (entry, found)


# ------------------------------------------------------------------------------------------
# The rules: each fires with file, line, key, value, why and a fix


def _report(three: Path, rule: str, train: Any, **data: Any) -> Any:
    path = spec(three, train, **data)
    found = issue(path, rule)
    assert found.severity == "error" and found.key.startswith("data.")
    assert found.file == str(path) or Path(found.file).resolve() == path.resolve()
    assert found.line is not None and found.hint and found.message and found.value is not None
    assert RULES[rule].scope == "paths"
    assert main(["validate", str(path)]) == 2
    return found


def test_rule_glob_empty(three: Path) -> None:
    found = _report(three, "data-glob-empty", ["data/web-*_json_document"])
    assert found.value == "data/web-*_json_document" and "matches no dataset" in found.message


def test_rule_manifest_missing(three: Path) -> None:
    found = _report(three, "data-manifest-missing", ["data/gone.manifest.json"])
    assert "not found" in found.message and "data prepare" in found.hint


def test_rule_manifest_unreadable(three: Path) -> None:
    (three / "data" / "bad.manifest.json").write_text("{not json")
    _report(three, "data-manifest-unreadable", ["data/bad.manifest.json"])
    (three / "data" / "bad.manifest.json").write_text(manifest_text([]).replace('"shards": []',
                                                                                 '"shards": [{"path": 3}]'))
    _report(three, "data-manifest-unreadable", ["data/bad.manifest.json"])


def test_rule_manifest_kind(three: Path) -> None:
    (three / "data" / "x.manifest.json").write_text(manifest_text([("web-00000_text_document", 3, 10)], kind="other"))
    found = _report(three, "data-manifest-kind", ["data/x.manifest.json"])
    assert "'other'" in found.message
    (three / "data" / "x.manifest.json").write_text(manifest_text([("web-00000_text_document", 3, 10)], version=9))
    _report(three, "data-manifest-kind", ["data/x.manifest.json"])


def test_rule_shard_missing(three: Path) -> None:
    (three / "data" / "m.manifest.json").write_text(manifest_text(
        [("web-00000_text_document", 3, 10), ("web-00009_text_document", 1, 4)]))
    found = _report(three, "data-shard-missing", ["data/m.manifest.json"])
    assert "web-00009_text_document" in found.message
    # a glob that finds a .bin without its .idx
    (three / "data" / "web-00001_text_document.idx").unlink()
    found = _report(three, "data-shard-missing", ["data/web-*_text_document"])
    assert "web-00001_text_document.idx" in found.message


def test_rule_index_unreadable(three: Path) -> None:
    (three / "data" / "web-00001_text_document.idx").write_bytes(b"not an index")
    found = _report(three, "data-index-unreadable", ["data/web-*_text_document"])
    assert "MMIDIDX" in found.message


def test_rule_manifest_tokens(three: Path) -> None:
    (three / "data" / "m.manifest.json").write_text(manifest_text(
        [("web-00000_text_document", 3, 10), ("web-00001_text_document", 5, 21)]))
    found = _report(three, "data-manifest-tokens", ["data/m.manifest.json"])
    assert "21 tokens (its .idx: 20)" in found.message


def test_rule_tokenizer_mixed(three: Path) -> None:
    write_shard(str(three / shard(3)), docs_of(8), null_tokenizer(vocab_size=500))
    found = _report(three, "data-tokenizer-mixed", ["data/web-*_text_document"])
    assert "vocab_size 500" in found.message and "vocab_size 999" in found.message
    # train and valid feed one model: compared as one
    path = spec(three, [shard(0)], valid=[shard(3)])
    assert ("data-tokenizer-mixed", "data.valid", "error") in issues(path)


def test_rule_tokenizer_spec(three: Path) -> None:
    """Data written by another tokenizer than the spec's [data.tokenizer] is refused (a
    GPT2BPETokenizer spec on NullTokenizer shards trains on ids that mean other tokens)."""
    vocab = three / "vocab.json"
    vocab.write_text('{"a": 0}')
    merges = three / "merges.txt"
    merges.write_text("#version: 0.2\n")
    gpt2 = {"type": "GPT2BPETokenizer", "vocab_file": str(vocab), "merge_file": str(merges)}
    path = spec(three, ["data/web-*_text_document"], tokenizer=gpt2)
    found = issue(path, "data-tokenizer-spec")
    assert found.severity == "error" and found.key == "data.train" and found.value == "data/web-*_text_document"
    assert "NullTokenizer" in found.message and "GPT2BPETokenizer" in found.message
    assert "data prepare" in found.hint and "--tokenizer-type GPT2BPETokenizer" in found.hint
    assert RULES["data-tokenizer-spec"].scope == "paths" and main(["validate", str(path)]) == 2
    # the same type whose files differ (by SHA-256) from the ones the data was written with
    from dlmspec.data.record import file_sha256

    other = three / "other-vocab.json"
    other.write_text('{"b": 0}')
    written = {"type": "GPT2BPETokenizer", "vocab_size": 50257, "eod_id": 50256,
               "files": {"vocab_file": {"path": str(other), "sha256": file_sha256(str(other))},
                         "merge_file": {"path": str(merges), "sha256": file_sha256(str(merges))}}}
    write_shard(str(three / "data" / "gpt-00000_text_document"), docs_of(10), written)
    found = issue(spec(three, ["data/gpt-00000_text_document"], tokenizer=gpt2), "data-tokenizer-spec")
    assert "vocab_file" in found.message and str(vocab) in found.message
    # the spec's own tokenizer (the same files): no finding; datasets without a record are not compared
    assert "data-tokenizer-spec" not in {r for r, _, _ in issues(spec(three, ["data/web-*_text_document"]))}
    written["files"]["vocab_file"] = {"path": str(vocab), "sha256": file_sha256(str(vocab))}
    write_shard(str(three / "data" / "gpt-00000_text_document"), docs_of(10), written)
    assert "data-tokenizer-spec" not in {r for r, _, _ in issues(spec(three, ["data/gpt-00000_text_document"],
                                                                     tokenizer=gpt2))}


def test_every_blend_rule_is_registered() -> None:
    ids = {"data-glob-empty", "data-manifest-missing", "data-manifest-unreadable", "data-manifest-kind",
           "data-shard-missing", "data-index-unreadable", "data-manifest-tokens", "data-tokenizer-mixed",
           "data-tokenizer-spec"}
    assert ids <= set(RULES) and all(RULES[i].severity == "error" and RULES[i].scope == "paths" for i in ids)


def test_the_sft_plan_reads_the_records_of_the_resolved_shards(three: Path) -> None:
    """Planning uses the shards where it used the listed datasets: the SFT plan's mean sample
    length is the token-weighted mean of the shards' records (tokens / documents)."""
    from dlmspec.plan import make_plan
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load

    path = spec(three)
    body = tomllib.loads(path.read_text())
    body["stage"] = {"kind": "sft"}
    path.write_text(tomli_w.dumps(body))
    plan = make_plan(resolve(load(path).spec))
    docs = [len(docs_of(t)) for t in TOKENS]
    want = sum(t / d * t / sum(TOKENS) for t, d in zip(TOKENS, docs))
    assert plan.sft is not None and plan.sft.source == "record"
    assert plan.sft.mean_sample_tokens == pytest.approx(want)
    assert len(plan.sft.sources) == 3


def test_index_counts_read_in_pieces_and_refuse_a_truncated_index(three: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dlmspec.resolve.blend as resolve_module

    assert resolve_module.index_counts(shard(2)) == (30, 8)
    monkeypatch.setattr(resolve_module, "_LENGTHS_PER_READ", 3)
    write_shard(str(three / "data" / "p_text_document"), docs_of(29))
    assert resolve_module.index_counts("data/p_text_document") == (29, 8)
    idx = three / "data" / "p_text_document.idx"
    idx.write_bytes(idx.read_bytes()[:40])
    assert "truncated" in resolve_module.index_counts("data/p_text_document")
