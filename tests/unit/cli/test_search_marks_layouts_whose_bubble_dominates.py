"""`plan --search` shows each layout's microbatches per step and marks those with fewer than pipeline
stages (a first-time user saw the top pick warn of a 100 % pipeline bubble when planned alone, with
nothing in the search table to say why it still ranked first: the bubble is in its tokens/s)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

DEMO = Path(__file__).resolve().parents[3] / "specs" / "demo-dlm.toml"


def test_search_table_counts_microbatches_and_marks_a_bubble_bound_layout() -> None:
    result = CliRunner(env={"COLUMNS": "250"}).invoke(
        app, ["plan", str(DEMO), "--search", "--set", "cluster.gpus_per_node=8", "--set", 'cluster.gpu="h100"'])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "microbatches" in line)
    assert header.index("mbs") < header.index("microbatches") < header.index("recompute")
    rows = [line for line in result.output.splitlines() if line.startswith("│")]
    assert rows
    for row in rows:  # global batch 32 = mbs x DP x microbatches; a star where microbatches < PP
        cells = [c.strip() for c in row.strip("│").split("│")]
        pp, dp, mbs, micro = int(cells[2]), int(cells[6]), int(cells[7]), cells[8]
        count = int(micro.rstrip(" *"))
        assert mbs * dp * count == 32
        assert micro.endswith("*") == (count < pp)
    assert any(c.strip().endswith("*") for r in rows for c in r.split("│")[9:10])
    assert "fewer microbatches per step than pipeline stages" in result.output
