"""bench/attention/flex_vs_sdpa.py end to end in its --dry mode (tiny float32 shapes on the CPU):
every mask's kernel rows for SDPA and FlexAttention, the layer rows, FlexAttention's output equal to
SDPA's, and the JSON written where --out says."""

import json

import pytest

from bench_scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/attention/flex_vs_sdpa.py", "bench_attention_flex_vs_sdpa")


def test_dry_run_writes_rows_for_every_mask_and_flex_matches_sdpa(bench, tmp_path):
    out = tmp_path / "deep" / "flex.json"
    assert bench.main(["--dry", "--out", str(out), "--layer-masks", "bidirectional", "document"]) == 0
    result = json.loads(out.read_text())
    assert result["dry"] is True and result["dtype"] == "float32"
    rows = result["rows"]
    kernel = {(r["mask"], r["backend"]): r for r in rows if r["measure"] == "kernel"}
    assert set(kernel) == {(m, b) for m in bench.MASKS for b in ("sdpa", "flex")}
    for (mask, backend), row in kernel.items():
        assert row["status"] == "ok", row
        assert row["forward_ms"] > 0 and row["forward_backward_ms"] > 0
        if backend == "flex":
            assert row["max_abs_diff_vs_sdpa"] < 1e-5, (mask, row)
    assert kernel[("block_diffusion", "flex")]["query_length"] == 2 * result["shape"]["seq_length"]
    assert kernel[("causal", "sdpa")]["density"] == pytest.approx((64 + 1) / 128)
    layer = {(r["mask"], r["backend"]) for r in rows if r["measure"] == "layer" and r["status"] == "ok"}
    assert layer == {("bidirectional", "sdpa"), ("bidirectional", "flex"), ("document", "sdpa"), ("document", "flex")}


def test_out_that_is_a_folder_is_refused(bench, tmp_path, capsys):
    assert bench.main(["--dry", "--out", str(tmp_path), "--masks", "causal", "--no-layer"]) == 2
    assert "is not a file" in capsys.readouterr().err
