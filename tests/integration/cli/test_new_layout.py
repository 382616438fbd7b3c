"""``dlmspec new`` writes the layout ``dlmspec plan --search`` ranks first among those that fit
with the planner's headroom, data parallel or not (README's command table), and stays fast.

The relation is tested, not a literal layout: the planner's ranking changes with its model."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.plan import HEADROOM_WARNING, make_plan
from dlmspec.plan.search import search
from dlmspec.resolve import resolve
from dlmspec.spec.load import load


def spec_value(spec: Any, key: str) -> Any:
    node = spec
    for part in key.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("preset, nodes", [("llada-8b", 64), ("llada-8b", 1), ("qwen3-0.6b", 1)])
def test_new_writes_the_fastest_layout_that_fits_with_headroom(preset: str, nodes: int, tmp_path: Path) -> None:
    out = tmp_path / "s.toml"
    result = CliRunner().invoke(app, ["new", str(out), "--preset", preset, "--nodes", str(nodes)])
    assert result.exit_code == 0, result.output
    written = resolve(load(out).spec)
    ranked = search(written, top=20)
    cap = HEADROOM_WARNING * written.gpu.memory_bytes
    best = next(c for c in ranked.top if c.peak_bytes <= cap)
    differs = {key: (spec_value(written.spec, key), value) for key, value in best.spec_changes().items()
               if spec_value(written.spec, key) != value}
    assert not differs, f"written (left) is not search's first layout with headroom (right): {differs}"
    plan = make_plan(written)
    assert plan.peak_bytes <= cap
    # never slower than the data-parallel starter the search started from
    dp = resolve(written.spec.replace(**{"parallel.tensor_model_parallel_size": 1,
                                         "parallel.pipeline_model_parallel_size": 1,
                                         "parallel.virtual_pipeline_model_parallel_size": None,
                                         "parallel.context_parallel_size": 1,
                                         "parallel.sequence_parallel": False}))
    dp_plan = make_plan(dp)
    if dp_plan.peak_bytes <= cap:
        assert plan.time.tokens_per_second >= dp_plan.time.tokens_per_second * 0.99


def test_new_stays_fast(tmp_path: Path) -> None:
    """The whole command in a fresh process, CPU seconds (not wall: the test machine is shared);
    the CLI's budget is about 1 s, this bound is loose."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "dlmspec.cli", "new", str(tmp_path / "l8.toml"), "--preset",
                           "llada-8b", "--nodes", "64"], capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 3.0, f"dlmspec new took {cpu:.2f} CPU seconds"
