"""The fast-sampling suite's measurement code end to end on CPU, on a tiny LLaDA-compatible runtime
checkpoint: dlmspec's side (timing, held-out pass, LLaDA export), then, where Fast-dLLM's files and
the transformers it pins are at hand (bench/devbox/fetch_fast_dllm.sh), the peers' side on the export,
then the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_tests import fast_sampling_kit as kit

ROOT = Path(__file__).resolve().parents[2]
MEASURE = ROOT / "bench" / "sampling" / "fast_measure.py"
FAST_DLLM = ROOT / ".bench-peers" / "fast-dllm"
WHEELS = ROOT / ".bench-peers" / "wheels"
GEN = ["--device", "cpu", "--gen-length", "8", "--steps", "8", "--block-length", "4", "--batches", "1,2",
       "--repeats", "1", "--eval-prompts", "6", "--eval-batch", "4"]

pytestmark = [pytest.mark.harness,  # a harness end to end on CPU: the bench tier (CONTRIBUTING.md)
              pytest.mark.skipif(kit.shared_gpt2() is None, reason="the offline data kit's GPT-2 tokenizer is not found")]


@pytest.fixture(scope="module")
def dlmspec_run(tmp_path_factory):
    """The dlmspec side run once on the tiny checkpoint: ``(work, partial result, ids)``."""
    tmp = tmp_path_factory.mktemp("fast")
    with kit.megatron_cpu_world(tmp):
        ckpt = kit.write_llada_compatible_checkpoint(tmp / "run", kit.shared_gpt2())
    task = kit.write_task(tmp / "task", 6)
    work, partial = tmp / "work", tmp / "out" / "fast-sampling-dlmspec.json"
    work.mkdir()
    proc = subprocess.run([sys.executable, str(MEASURE), "dlmspec", "--work", str(work), "--partial", str(partial),
                           "--ckpt", str(ckpt), "--task-dir", str(task), "--llada-out", str(work / "llada-hf"), *GEN],
                          capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, json.loads(partial.read_text()), json.loads((work / "ids" / "dlmspec.json").read_text())


def test_dlmspec_side_times_each_batch_and_keeps_every_held_out_completion(dlmspec_run):
    work, partial, ids = dlmspec_run
    base = partial["configs"]["dlmspec/none/low_confidence"]
    for batch in ("1", "2"):
        t = base["timing"][batch]
        assert t["tokens"] == int(batch) * 8 and t["tokens_per_second"] > 0
        assert t["forward_passes"] == 8  # low-confidence: one pass per step, steps = 8
        # CUDA graphs are asked for (the default) and, on a CPU, recorded as not run, with the reason
        assert t["cuda_graph"] is True and "CUDA" in t["cuda_graph_fallback"], t
    assert base["eval"]["prompts"] == 6
    assert len(ids["dlmspec/none/low_confidence"]) == 6
    assert all(len(row) == 8 for row in ids["dlmspec/none/low_confidence"])
    thr = partial["configs"]["dlmspec/none/threshold"]["timing"]["1"]
    assert 2 <= thr["forward_passes"] <= 8  # threshold: at least one commit per pass, 2 blocks of 4
    # every dlmspec configuration is either measured or skipped with the reason (a sampler without caches)
    for name in ("dlmspec/prefix/threshold", "dlmspec/dual/threshold", "dlmspec/prefix/factor", "dlmspec/dual/factor"):
        entry = partial["configs"][name]
        assert entry.get("timing") or "has no" in entry["skipped"], entry
    heldout = json.loads((work / "heldout.json").read_text())
    assert len({len(p) for p in heldout["ids"]}) == 2 and heldout["mask"] == kit.MASK
    config = json.loads((work / "llada-hf" / "config.json").read_text())
    assert config["model_type"] == "llada" and config["mask_token_id"] == kit.MASK and config["n_layers"] == 1


def _peer_env(tmp_path: Path) -> dict:
    site = tmp_path / "peer-site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                    str(site), "--find-links", str(WHEELS), "transformers==4.49.0", "tokenizers<0.22", "huggingface-hub<1.0"],
                   check=True, capture_output=True, timeout=300)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(site), env.get("PYTHONPATH", "")) if x)
    return env


@pytest.mark.skipif(not (FAST_DLLM / "llada" / "generate.py").is_file() or not any(WHEELS.glob("transformers-4.49.0-*.whl")),
                    reason="Fast-dLLM's files / transformers 4.49.0 wheel not fetched (bash bench/devbox/fetch_fast_dllm.sh)")
def test_peers_loop_on_the_llada_export_gives_dlmspecs_no_cache_tokens_and_the_report_scores_both(dlmspec_run, tmp_path):
    work, _, ids = dlmspec_run
    partial = tmp_path / "fast-sampling-peers.json"
    proc = subprocess.run([sys.executable, str(MEASURE), "peers", "--work", str(work), "--partial", str(partial),
                           "--llada", str(work / "llada-hf"), "--fast-dllm", str(FAST_DLLM), *GEN],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_peer_env(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    peers = json.loads(partial.read_text())
    assert peers["transformers"] == "4.49.0" and peers["fast_dllm"]["commit"]
    assert peers["probe"]["max_abs_logit_diff"] < 1e-3  # the export is the same function in fp32
    for name in ("hf-loop/none/low_confidence", "fast-dllm/none/low_confidence", "fast-dllm/prefix/threshold",
                 "fast-dllm/dual/threshold"):
        assert peers["configs"][name]["timing"]["2"]["tokens_per_second"] > 0, name
    peer_ids = json.loads((work / "ids" / "peers.json").read_text())
    # the same algorithm on the same function: the LLaDA-style loop gives dlmspec's no-cache tokens
    assert peer_ids["hf-loop/none/low_confidence"] == ids["dlmspec/none/low_confidence"]
    out, table = tmp_path / "report.json", tmp_path / "table.md"
    dl = work.parent / "out" / "fast-sampling-dlmspec.json"
    proc = subprocess.run([sys.executable, str(MEASURE), "report", "--work", str(work), "--partials", str(dl), str(partial),
                           "--settings", json.dumps({"batches": [1, 2]}), "--out", str(out), "--table", str(table)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    values = json.loads(out.read_text())
    hf = values["configs"]["hf-loop/none/low_confidence"]
    assert hf["agreement"]["dlmspec/none/low_confidence"]["tokens"] == 1.0
    assert hf["accuracy"]["n"] == 6 and 0 <= hf["accuracy"]["interval_95"][0] <= hf["accuracy"]["interval_95"][1] <= 1
    assert "`hf-loop/none/low_confidence`" in table.read_text() and "| target |" in table.read_text()
