"""A manifest that lists one shard again (100,000 times, say) is refused at once by
:func:`dlmspec.resolve.resolve_blend` (rule ``data-manifest-unreadable``, naming both entries):
the blend would read the shard twice, and `dlmspec data prepare` never writes such a manifest.
Resolving stays linear in the number of entries."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace


from blend_shards import docs_of, manifest_text, null_tokenizer, write_shard  # noqa: E402

from dlmspec.resolve import resolve_blend  # noqa: E402


def test_a_shard_listed_again_is_refused_quickly(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_shard("sh-00000_text_document", docs_of(40), null_tokenizer())
    write_shard("sh-00001_text_document", docs_of(40), null_tokenizer())
    shards = [("sh-00000_text_document", 10, 40), ("sh-00001_text_document", 10, 40)]
    body = json.loads(manifest_text(shards))
    body["shards"].extend([dict(body["shards"][0])] * 100_000)
    Path("sh_text_document.manifest.json").write_text(json.dumps(body))
    started = time.process_time()
    found = resolve_blend([SimpleNamespace(prefix="sh_text_document.manifest.json", weight=1.0)])
    assert time.process_time() - started < 5.0
    assert [p.rule for p in found.problems] == ["data-manifest-unreadable"]
    assert "shards[2] lists 'sh-00000_text_document' again (shards[0]" in found.problems[0].message
    assert found.shards == ()


def test_a_manifest_of_distinct_shards_still_resolves(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    names = [f"sh-{i:05d}_text_document" for i in range(3)]
    for name in names:
        write_shard(name, docs_of(40), null_tokenizer())
    Path("sh_text_document.manifest.json").write_text(manifest_text([(n, 10, 40) for n in names]))
    found = resolve_blend([SimpleNamespace(prefix="sh_text_document.manifest.json", weight=1.0)])
    assert found.problems == ()
    assert [s.prefix for s in found.shards] == names
