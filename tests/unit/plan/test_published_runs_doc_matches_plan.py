"""docs/published-runs.md against `dlmspec plan`: every command of its table is run and the planned
GPU-hours, MFU, ratios and step shares the page quotes must equal what the planner prints, so the
page cannot drift from the planner."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "published-runs.md"


def _rows(doc: Path) -> list[dict[str, str]]:
    """The rows of the page's *Planned against published* table, by header."""
    text = doc.read_text(encoding="utf-8")
    section = text.split("## Planned against published", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(header), ln
        rows.append(dict(zip(header, cells)))
    return rows


@lru_cache(maxsize=None)
def _plan(command: str) -> tuple[str, str]:
    """``command`` (``dlmspec plan ...``, run from the repository root): its printed text and its
    ``--json`` text."""
    import os

    args = command.split()
    assert args[:2] == ["dlmspec", "plan"], command
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        runner = CliRunner()
        text = runner.invoke(app, args[1:])
        js = runner.invoke(app, args[1:] + ["--json"])
    finally:
        os.chdir(here)
    assert text.exit_code == 0 and js.exit_code == 0, (text.stdout, js.stdout)
    return text.stdout, js.stdout


def mismatches(doc: Path) -> list[str]:
    """What ``doc`` quotes that ``dlmspec plan`` does not print: one line per figure."""
    out: list[str] = []
    text = " ".join(doc.read_text(encoding="utf-8").split())
    for row in _rows(doc):
        printed, js = _plan(row["command"].strip("`"))
        result = json.loads(js)["result"]
        hours = re.search(r"([\d,]+\.?\d*) GPU-hours", printed).group(1)
        mfu = re.search(r"MFU (\d+\.\d)%", printed).group(1) + "%"
        name = row["model"].split()[0]
        if row["planned GPU-hours (H100)"] != hours:
            out.append(f"{name}: planned GPU-hours {row['planned GPU-hours (H100)']} != {hours}")
        if row["planned MFU"] != mfu:
            out.append(f"{name}: planned MFU {row['planned MFU']} != {mfu}")
        published = row["published GPU-hours"]
        ratio = "-" if published == "-" else f"{result['gpu_hours'] / float(published.replace(',', '')):.2f}"
        if row["planned / published"] != ratio:
            out.append(f"{name}: planned / published {row['planned / published']} != {ratio}")
        if ratio != "-":
            implied = round(float(ratio) * float(mfu.rstrip("%")))
            if f"{ratio} x {mfu} = about {implied}%" not in text:
                out.append(f"{name}: the implied MFU '{ratio} x {mfu} = about {implied}%' is not in the prose")
        t = result["time"]
        share = {k: v / t["step_seconds"] for k, v in t["breakdown_seconds"].items()}
        if name == "Dream-7B" and f"spends {share['tp_communication']:.1%} of the planned step in TP collectives" not in text:
            out.append(f"Dream-7B: TP share {share['tp_communication']:.1%} is not in the prose")
        if name == "LLaDA-8B" and f"spends {share['dp_communication']:.1%} in exposed data-parallel" not in text:
            out.append(f"LLaDA-8B: DP share {share['dp_communication']:.1%} is not in the prose")
    return out


def test_the_page_lists_the_three_published_models_with_their_bundled_specs():
    rows = _rows(DOC)
    assert [r["model"].split()[0] for r in rows] == ["LLaDA-8B", "Dream-7B", "MegaDLMs"]
    for r in rows:
        spec = re.match(r"`([^`]+)`", r["spec"]).group(1)
        assert (ROOT / spec).is_file(), spec
        assert r["command"].strip("`").split()[2] == spec


def test_every_figure_of_the_page_is_what_plan_prints():
    assert mismatches(DOC) == []


def test_a_stale_figure_on_the_page_is_found(tmp_path):
    row = _rows(DOC)[1]
    stale_hours = f"{float(row['planned GPU-hours (H100)'].replace(',', '')) + 0.1:,.1f}"
    text = DOC.read_text(encoding="utf-8").replace(f"| {row['planned GPU-hours (H100)']} |", f"| {stale_hours} |")
    text = text.replace("spends 3.1%", "spends 3.9%")
    doc = tmp_path / "published-runs.md"
    doc.write_text(text, encoding="utf-8")
    found = mismatches(doc)
    assert any(f"Dream-7B: planned GPU-hours {stale_hours}" in m for m in found), found
    assert any(m.startswith("LLaDA-8B: DP share") for m in found), found
