"""Hostile files never crash, hang, blow up, run code, write through links or leak secrets.

A seeded subset of the hostile-file corpus (tests/hostile/hostile_corpus.py: every file dlmspec reads
besides the spec loader) with at least one case per surface and per hostile class, each drawn among
the cheapest that cover it (by the wall times of the corpus's committed run,
bench/results/hostile_corpus.json: no 100,000-member sweep where a 100-million-character prompt
covers ``huge``), plus a benign control per surface (which must exit 0, so a command line the CLI rejects cannot pass by exiting
2). Each case runs its commands as subprocesses of the venv's console script under a 2 GiB
address-space limit and a 20 s timeout, in a folder of its own, and must: print no traceback,
exit 0 or 2, finish in time, stay under 2 GiB, change no file outside its declared outputs (the
victim file behind planted links unchanged), run no hostile code (no canary file), and print or
write no planted secret (tests/hostile/hostile_driver.py). The whole corpus runs with
``python bench/hostile/run_corpus.py --out FILE``.

``DLMSPEC_HOSTILE_SEED`` draws another subset (default 0); ``DLMSPEC_HOSTILE_ALL=1`` runs every
case. A failure lists each failing case with its verdicts and keeps its folder under the pytest
temporary directory.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CORPUS = ROOT / "tests" / "hostile"
sys.path[:0] = [p for p in (str(CORPUS), str(ROOT / "tests" / "kits")) if p not in sys.path]

from hostile_corpus import SURFACES, all_cases, build_base, subset  # noqa: E402
from hostile_driver import run_cases, summary  # noqa: E402
from hostile_data import CLASSES  # noqa: E402
from shared_kit import PRESENT  # noqa: E402

pytestmark = pytest.mark.shared_data  # the GPT-2 tokenizer of the offline data kit

SEED = int(os.environ.get("DLMSPEC_HOSTILE_SEED", "0"))
RUN_ALL = os.environ.get("DLMSPEC_HOSTILE_ALL") == "1"
#: Cases run at once: the hang cases wait idle (a FIFO), so more than the two cores pays; under
#: pytest-xdist another worker shares the cores, so two (a case is judged hung by its wall time).
JOBS = int(os.environ.get("DLMSPEC_HOSTILE_JOBS", "2" if os.environ.get("PYTEST_XDIST_WORKER") else "4"))


#: Files the base material is built from: the cache of a previous run is reused while they are unchanged.
BASE_SOURCES = ("tests/hostile/hostile_corpus.py", "tests/hostile/build_checkpoints.py", "tests/hostile/hostile_data.py",
                "tests/kits/tiny_ckpt.py", "backends/megatron/checkpointing.py", "backends/convert/mcore_io.py",
                "backends/convert/tiny.py", "dlmspec/data/prepare.py", "dlmspec/data/shards.py", "dlmspec/data/record.py")


def _base_key() -> str:
    sha = hashlib.sha256(sys.executable.encode())
    for rel in BASE_SOURCES:
        path = ROOT / rel
        sha.update(rel.encode() + (path.read_bytes() if path.exists() else b"-"))
    return sha.hexdigest()[:16]


@pytest.fixture(scope="module")
def base(request) -> Path:
    """The benign material (dataset, manifest, tokenizer folder, run folder, tiny checkpoints),
    kept in pytest's cache folder (.pytest_cache) while the files it is built from are unchanged:
    building it costs ~1-2 min of a busy machine. Under pytest-xdist it is built in a temporary
    folder of the worker (the cache folder is shared by the workers)."""
    if not PRESENT:
        pytest.skip("the offline data kit is missing")
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if os.environ.get("PYTEST_XDIST_WORKER"):  # workers share .pytest_cache: build in this worker's own folder
        cache = None
    folder = (cache.mkdir(f"hostile-base-{_base_key()}") if cache is not None
              else request.getfixturevalue("tmp_path_factory").mktemp("hostile-base"))
    return build_base(folder, checkpoints=True, seed=SEED)


def test_subset_covers_every_surface_and_hostile_class(base):
    cases = all_cases(base, SEED)
    chosen = subset(cases, SEED, extra_controls=True)
    assert {c.surface for c in chosen} == set(SURFACES)
    assert {c.hostile for c in chosen} - {"control"} == set(CLASSES)
    assert [c.id for c in subset(all_cases(base, SEED), SEED, extra_controls=True)] == [c.id for c in chosen]


def test_hostile_files_are_refused_without_harm(base, tmp_path, request):
    cases = all_cases(base, SEED)
    chosen = cases if RUN_ALL else subset(cases, SEED, extra_controls=True)
    started = time.monotonic()
    lines: list[str] = []
    records = run_cases(chosen, tmp_path, base, jobs=JOBS, report=lambda r: lines.append(
        f"{'ok  ' if r['ok'] else 'FAIL'} {r['id']} ({r.get('wall_s', 0):.1f} s)"))
    total = time.monotonic() - started
    totals = summary(records)
    head = (f"hostile files: {len(records)} cases (seed {SEED}, {JOBS} at a time) in {total:.1f} s: "
            f"{totals['passed']} passed, {totals['failed']} failed")
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None:  # printed whether or not pytest captures the output
        terminal.write_line("")
        terminal.write_line(head)
    print(head + "\n" + "\n".join(lines))
    failed = [r for r in records if not r["ok"]]
    report = "\n".join(f"{r['id']}: {'; '.join(r['failures'])}  [{r.get('folder', '')}]" for r in failed)
    assert not failed, f"{len(failed)} of {len(records)} hostile cases failed (seed {SEED}, {total:.0f} s):\n{report}"
