"""bench/throughput: the HF baseline on a tiny model on CPU (runs, JSON keys, really
bidirectional), the loss-agreement helper, and run.py's commands, parsing and failure handling
(with fake processes: no GPU, no megatron run)."""

from __future__ import annotations

import ast
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import importlib.util


def load_script(path, name):
    """Execute a bench script as module ``name`` (registered in sys.modules for dataclasses and monkeypatch)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "throughput"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return load_script(BENCH / f"{name}.py", f"bench_throughput_{name}")


common = _load("throughput_common")
agreement = _load("loss_agreement")
run = _load("run")


# --------------------------------------------------------------------------- common


def test_presets_are_the_reference_scripts():
    tree = ast.parse((ROOT / "bench" / "runtime" / "train_reference.py").read_text())
    presets = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PRESETS":
            presets = {k.value: {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
                       for k, v in zip(node.value.keys, node.value.values)}
    assert presets is not None
    for name, ours in common.PRESETS.items():
        ref = presets[name]
        for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                    "kv_channels", "tokenizer_vocab", "mask_token_id"):
            assert ours[key] == ref[key], (name, key)
        assert ours["vocab_size"] == ref["padded_vocab"]
        assert ours["rope_theta"] == ref["rotary_base"]
        assert common.PRESET_SEQ_LENGTH[name] == ref["seq_length"]


def closed_form_flops_per_token(arch, seq_length: int) -> float:
    """By hand, for a dense gated model with bidirectional attention (Narayanan et al. 2021,
    sec. 5.1; every query attends all ``s`` keys): ``3 * (L*(2h(a+2g)d + 2adh + 4ads + 3*2hf) + 2hV)``."""
    L, h, f = arch["num_layers"], arch["hidden_size"], arch["ffn_hidden_size"]
    a, g, d = arch["num_attention_heads"], arch["num_query_groups"], arch["kv_channels"]
    V, s = arch["vocab_size"], seq_length
    return float(3 * (L * (2 * h * (a + 2 * g) * d + 2 * a * d * h + 4 * a * d * s + 3 * 2 * h * f) + 2 * h * V))


def test_flops_are_the_planners_and_agree_with_the_closed_form():
    from dlmspec.plan.compute import model_flops_per_token

    arch = common.QWEN3_1_7B
    got = common.flops_per_token(arch, 4096)
    assert got["flops_source"] == "dlmspec.flops.model_flops_per_token"
    assert got["flops_per_token"] == model_flops_per_token(28, 2048, 6144, 16, 8, 128, 151936, 4096)
    for preset in common.PRESETS.values():
        for seq in (128, 4096):
            assert closed_form_flops_per_token(preset, seq) == common.flops_per_token(preset, seq)["flops_per_token"]


def test_summarize_uses_the_median_step():
    s = common.summarize([1.0, 3.0, 2.0, 100.0, 2.0], tokens_per_step=4 * 4096, flops_per_token=1e10)
    assert s["median_step_time_s"] == 2.0
    assert s["tokens_per_s"] == pytest.approx(4 * 4096 / 2.0)
    assert s["tflops_per_gpu"] == pytest.approx(1e10 * 4 * 4096 / 2.0 / 1e12)
    assert s["mfu"] == pytest.approx(s["tflops_per_gpu"] / 989.0)
    two = common.summarize([2.0], tokens_per_step=10, flops_per_token=1e12, num_gpus=2)
    assert two["tflops_per_gpu"] == pytest.approx(2.5)
    with pytest.raises(ValueError):
        common.summarize([], tokens_per_step=1, flops_per_token=1.0)
    assert common.parse_int_list("6, 2,4") == [6, 2, 4]
    with pytest.raises(ValueError):
        common.parse_int_list("0,2")


# --------------------------------------------------------------------------- HF baseline


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    return _load("hf_baseline")


@pytest.mark.harness
def test_hf_baseline_runs_on_cpu_and_writes_the_json(hf, tmp_path):
    out, metrics = tmp_path / "hf.json", tmp_path / "hf.jsonl"
    rc = hf.main(["--preset", "tiny", "--seq-length", "32", "--micro-batch-sizes", "2,1", "--warmup", "1",
                  "--steps", "2", "--device", "cpu", "--json", str(out), "--metrics-jsonl", str(metrics),
                  "--variable-length-prob", "0.5"])
    assert rc == 0
    data = json.loads(out.read_text())
    for key in ("command", "command_line", "versions", "setup", "flops_per_token", "flops_source", "attempts", "best",
                "bidirectional_check", "parameters", "peak_tflops_per_gpu", "status"):
        assert key in data, key
    assert data["status"] == "ok" and data["bidirectional_check"]["bidirectional"]
    assert "transformers" in data["versions"] and "torch" in data["versions"] and "gpu" in data["versions"]
    assert data["setup"]["precision"] == "fp32" and data["setup"]["seq_length"] == 32
    assert data["flops_per_token"] == common.flops_per_token(common.TINY, 32)["flops_per_token"]
    assert [a["micro_batch_size"] for a in data["attempts"]] == [1, 2]
    for a in data["attempts"]:
        assert a["status"] == "ok" and len(a["step_times_s"]) == 2 and len(a["losses"]) == 3
        assert all(math.isfinite(x) and x > 0 for x in a["losses"])
        for key in ("median_step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_mem_gib"):
            assert key in a
        assert a["tokens_per_s"] == pytest.approx(a["micro_batch_size"] * 32 / a["median_step_time_s"])
    assert data["best"]["micro_batch_size"] in (1, 2)
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert len(lines) == 6 and lines[0]["event"] == "train"
    # the runs at micro batch 2 are readable by the loss-agreement helper
    assert len(agreement.read_losses(metrics, where=[("micro_batch_size", "2")])) == 3


def test_hf_attention_is_bidirectional_and_the_check_can_fail(hf, monkeypatch):
    import torch

    check = hf.check_bidirectional(torch.device("cpu"), "fp32")
    assert check["bidirectional"]
    assert check["early_logit_change"] > 1e-2 and check["masked_change"] == 0.0 and check["causal_change"] == 0.0
    # Without the patch transformers' sdpa path is causal: the same check must say so.
    monkeypatch.setattr(hf, "make_bidirectional", lambda model: 0)
    causal = hf.check_bidirectional(torch.device("cpu"), "fp32")
    assert not causal["bidirectional"] and causal["early_logit_change"] == 0.0


def test_hf_loss_is_the_runtimes_objective(hf):
    import torch

    from dlmspec.backends.megatron.objective import MaskedDiffusionObjective

    torch.manual_seed(0)
    obj = MaskedDiffusionObjective(9, variable_length_prob=0.0)
    tokens = torch.randint(0, 9, (2, 6))
    ob = obj.prepare({"tokens": tokens}, torch.Generator().manual_seed(3))
    logits = torch.randn(2, 6, 10, dtype=torch.bfloat16)
    expected = sum(
        float(-torch.log_softmax(logits[b, i].float(), -1)[tokens[b, i]]) * float(ob.loss_weights[b, i])
        for b in range(2) for i in range(6)
    ) / 12
    assert float(hf.mdm_loss(logits, ob)) == pytest.approx(expected, rel=1e-5)


# --------------------------------------------------------------------------- loss agreement


def _jsonl(path: Path, losses, **extra):
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "iteration": 0}) + "\n")
        for i, loss in enumerate(losses, 1):
            f.write(json.dumps({"event": "train", "iteration": i, "loss": loss, **extra}) + "\n")
    return path


def test_loss_agreement_on_synthetic_curves(tmp_path):
    base = [11.0 - 0.1 * i for i in range(60)]
    a = _jsonl(tmp_path / "a.jsonl", base)
    near = _jsonl(tmp_path / "b.jsonl", [x * (1 + 0.004 * (-1) ** i) for i, x in enumerate(base)])
    res = agreement.check_files(a, near)
    assert res["agree"] and res["compared"] == 50 and res["complete"]
    assert res["max_rel_diff"] == pytest.approx(0.004, rel=1e-6)  # the x * 0.996 steps
    assert agreement.main([str(a), str(near)]) == 0

    off = base.copy()
    off[29] *= 1.05
    far = _jsonl(tmp_path / "c.jsonl", off)
    res = agreement.check_files(a, far)
    assert not res["agree"] and res["worst_iteration"] == 30
    assert res["max_rel_diff"] == pytest.approx(0.05 / 1.05, rel=1e-6)
    assert agreement.main([str(a), str(far)]) == 1
    # ... but a difference after step 50 is not looked at
    late = base.copy()
    late[55] *= 2
    assert agreement.check_files(a, _jsonl(tmp_path / "d.jsonl", late))["agree"]


def test_loss_agreement_incomplete_nan_filters_and_bad_input(tmp_path):
    base = [10.0] * 50
    a = _jsonl(tmp_path / "a.jsonl", base)
    short = _jsonl(tmp_path / "short.jsonl", base[:20])
    res = agreement.check_files(a, short)
    assert not res["agree"] and not res["complete"] and res["only_in_a"][0] == 21
    assert agreement.check_files(short, short, allow_short=True)["agree"]
    nan = _jsonl(tmp_path / "nan.jsonl", base[:10] + [float("nan")] + base[11:])
    res = agreement.check_files(a, nan)
    assert not res["agree"] and res["nonfinite"] == [11] and math.isnan(res["max_rel_diff"])
    mixed = tmp_path / "mixed.jsonl"
    with open(mixed, "w") as f:
        for tag, loss in (("x", 10.0), ("y", 12.0)):
            for i in range(1, 51):
                f.write(json.dumps({"event": "train", "iteration": i, "loss": loss, "run": tag}) + "\n")
    assert agreement.check_files(a, mixed, where_b=["run=x"])["agree"]
    assert not agreement.check_files(a, mixed, where_b=["run=y"])["agree"]
    assert agreement.main([str(a), str(tmp_path / "missing.jsonl")]) == 2
    (tmp_path / "junk.jsonl").write_text("{not json\n")
    assert agreement.main([str(a), str(tmp_path / "junk.jsonl")]) == 2
    out = tmp_path / "res.json"
    assert agreement.main([str(a), str(a), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["max_rel_diff"] == 0.0


# --------------------------------------------------------------------------- run.py


def test_hf_gradient_accumulation_counts_every_microbatch(hf, tmp_path):
    out = tmp_path / "hf.json"
    rc = hf.main(["--preset", "tiny", "--seq-length", "32", "--micro-batch-sizes", "2", "--warmup", "1",
                  "--steps", "2", "--device", "cpu", "--grad-accum", "3", "--json", str(out)])
    assert rc == 0
    a = json.loads(out.read_text())["attempts"][0]
    assert a["status"] == "ok" and a["grad_accum"] == 3 and a["tokens_per_step"] == 3 * 2 * 32
    assert a["tokens_per_s"] == pytest.approx(3 * 2 * 32 / a["median_step_time_s"])
    assert all(math.isfinite(x) and x > 0 for x in a["losses"])


def test_run_microbatches_per_step_reaches_both_sides():
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry-run", "--megatron-variants", "reference", "--megatron-micro-batch-sizes", "4",
                           "--hf-micro-batch-sizes", "4", "--microbatches-per-step", "4", "--nproc", "2",
                           "--skip-import-check"],  # the same imports are tried in test_run_dry_run_prints_both_sides_commands
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(":")[0]: line for line in proc.stdout.splitlines() if not line.startswith("#")}
    assert "--global-batch-size 32" in lines["megatron mb4"]  # 4 microbatches x 4 x 2 GPUs
    assert "--grad-accum 4" in lines["hf mb4"]


@pytest.mark.harness
def test_run_dry_run_prints_both_sides_commands():
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry-run", "--megatron-variants", "reference", "--megatron-micro-batch-sizes", "4,8",
                           "--hf-micro-batch-sizes", "4", "--megatron-arg=--no-fusion"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert lines[-1].startswith("result: ") and "/bench/results/throughput/" in lines[-1]
    lines = lines[:-1]
    assert [line.split(":")[0] for line in lines] == ["megatron mb4", "hf mb4", "megatron mb8"]
    mega = lines[0]
    for part in ("bench/runtime/train_reference.py", "--preset qwen3-1.7b", "--objective mdm", "--seq-length 4096",
                 "--micro-batch-size 4", "--train-iters 8", "--log-interval 1", "--no-fusion"):
        assert part in mega, part
    for part in ("bench/throughput/hf_baseline.py", "--micro-batch-sizes 4", "--warmup 3", "--steps 5", "--device cuda"):
        assert part in lines[1], part
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in proc.stdout
    # the imports both sides' rows need, tried with this Python (the other dry runs here skip that: the same modules)
    for module, side in (("torch", "both sides"), ("transformers", "hf"), ("megatron.core", "megatron")):
        assert f"# import {module} ({side}): ok" in proc.stdout, proc.stdout
    torchrun = subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry-run", "--megatron-variants", "reference", "--sides", "megatron", "--nproc", "2",
                               "--megatron-micro-batch-sizes", "4", "--skip-import-check"], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
    assert "torch.distributed.run --standalone --nproc-per-node=2" in torchrun.stdout
    assert "hf_baseline" not in torchrun.stdout


def test_run_reads_the_runtimes_metrics(tmp_path):
    args = run.parse_args(["--warmup", "2", "--steps", "3"])
    metrics = tmp_path / "metrics.jsonl"
    with open(metrics, "w") as f:  # the records backends/megatron/training.py writes
        f.write(json.dumps({"event": "start", "time": 0, "model_flops_per_token": 123, "params_on_logging_rank": 7,
                            "layer_spec": "local"}) + "\n")
        for it, dt in enumerate([9.0, 5.0, 1.0, 1.2, 0.8], 1):
            f.write(json.dumps({"event": "train", "time": 0, "iteration": it, "loss": 12.0 - it, "grad_norm": 1.0,
                                "step_time_s": dt, "tokens_per_s": 1.0, "tflops_per_gpu": 1.0, "mfu": 0.1,
                                "peak_mem_gib": 80.0 + it, "peak_reserved_gib": 90.0}) + "\n")
        f.write("garbage\n")
    log = tmp_path / "job.log"
    log.write_text("fine\n")
    parsed = run.read_megatron_metrics(metrics)
    ok = run.megatron_attempt(args, 4, {"returncode": 0, "timed_out": False, "seconds": 30.0}, parsed, log, 1e10)
    assert ok["status"] == "ok" and ok["step_times_s"] == [1.0, 1.2, 0.8]
    assert ok["median_step_time_s"] == 1.0 and ok["tokens_per_s"] == pytest.approx(4 * 4096)
    assert ok["peak_mem_gib"] == 85.0 and ok["runtime_model_flops_per_token"] == 123 and len(ok["losses"]) == 5
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.5 GiB\n")
    oom = run.megatron_attempt(args, 8, {"returncode": 1, "timed_out": False, "seconds": 30.0}, parsed, log, 1e10)
    assert oom["status"] == "oom" and "out of memory" in oom["error_tail"]
    short = run.megatron_attempt(run.parse_args(["--warmup", "2", "--steps", "5"]), 4,
                                 {"returncode": 0, "timed_out": False, "seconds": 1.0}, parsed, log, 1e10)
    assert short["status"] == "error"


def _fake_python(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_run_records_failing_jobs_and_keeps_going(tmp_path):
    fake = _fake_python(tmp_path, 'echo "torch.OutOfMemoryError: CUDA out of memory."; exit 1')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--sides", "hf", "--hf-micro-batch-sizes", "4,6,8",
                           "--python", str(fake), "--out", str(out), "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, "OUT": ""})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [result] = list((out / "throughput").glob("*.json"))
    data = json.loads(result.read_text())["values"]
    assert "runs" not in data  # bench/plan/calibrate.py reads top-level "runs" lists
    statuses = [(a["micro_batch_size"], a["status"]) for a in data["hf"]["attempts"]]
    assert statuses == [(4, "oom"), (6, "skipped"), (8, "skipped")]
    assert data["hf"]["best"] is None and data["ratio_tokens_per_s"] is None and data["status"] == "done"
    assert "out of memory" in data["hf"]["attempts"][0]["error_tail"]
    assert result.with_suffix(".log").exists()
    assert json.loads(result.read_text())["status"] == "failed"
    # a second run the same day does not overwrite the first
    slow = _fake_python(tmp_path, "sleep 30")
    subprocess.run([sys.executable, str(BENCH / "run.py"), "--sides", "hf", "--hf-micro-batch-sizes", "4",
                    "--python", str(slow), "--out", str(out), "--work-dir", str(tmp_path / "work"), "--timeout-s", "1"],
                   capture_output=True, text=True, timeout=60, cwd=ROOT)
    results = sorted((out / "throughput").glob("*.json"))
    assert len(results) == 2
    newer = json.loads(next(p for p in results if p != result).read_text())["values"]
    assert newer["hf"]["attempts"][0]["status"] == "timeout"


FAKE_JOBS = r'''
import json, os, sys
argv = sys.argv[1:]
def arg(name):
    return argv[argv.index(name) + 1]
mbs = int(arg("--micro-batch-size") if "--micro-batch-size" in argv else arg("--micro-batch-sizes"))
if any(a.endswith("train_reference.py") for a in argv):
    if "--no-fusion" not in argv and os.environ.get("FAKE_FUSION_FAILS"):
        sys.exit("torch._dynamo failed")
    if mbs >= 8:
        print("torch.OutOfMemoryError: CUDA out of memory."); sys.exit(1)
    os.makedirs(arg("--run-dir"), exist_ok=True)
    with open(os.path.join(arg("--run-dir"), "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"event": "start", "model_flops_per_token": 1}) + "\n")
        for it in range(1, int(arg("--train-iters")) + 1):
            f.write(json.dumps({"event": "train", "iteration": it, "loss": 10.0, "step_time_s": 0.1 * mbs,
                                "peak_mem_gib": 10.0 * mbs}) + "\n")
else:
    step = 0.2 * mbs
    attempt = {"micro_batch_size": mbs, "status": "ok", "step_times_s": [step], "median_step_time_s": step,
               "tokens_per_s": mbs * 4096 / step, "tflops_per_gpu": 1.0, "mfu": 0.001, "peak_mem_gib": 1.0}
    with open(arg("--json"), "w") as f:
        json.dump({"attempts": [attempt], "bidirectional_check": {"bidirectional": True}}, f)
'''


def test_run_end_to_end_with_fake_jobs_ratio_and_fusion_fallback(tmp_path):
    script = tmp_path / "fake_jobs.py"
    script.write_text(FAKE_JOBS)
    fake = _fake_python(tmp_path, f'shift; exec "{sys.executable}" "{script}" "$@"')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--python", str(fake), "--out", str(out), "--megatron-variants", "reference",
                           "--megatron-micro-batch-sizes", "2,4,8,16", "--hf-micro-batch-sizes", "2,4",
                           "--work-dir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "FAKE_FUSION_FAILS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(next((out / "throughput").glob("*.json")).read_text())["values"]
    mega = [(a["micro_batch_size"], a["status"]) for a in data["megatron"]["attempts"]]
    assert mega == [(2, "error"), (2, "ok"), (4, "ok"), (8, "oom"), (16, "skipped")]
    assert data["megatron"]["attempts"][0]["retried_with"] == "--no-fusion"
    assert data["settings"]["megatron_extra_args"] == ["--no-fusion"]
    assert "--no-fusion" in data["megatron"]["attempts"][2]["command"]
    assert data["megatron"]["best"]["micro_batch_size"] in (2, 4)  # equal tokens/s in the fake
    assert data["megatron"]["best"]["tokens_per_s"] == pytest.approx(4096 / 0.1)
    assert data["hf"]["best"]["tokens_per_s"] == pytest.approx(4096 / 0.2)
    assert data["ratio_tokens_per_s"] == pytest.approx(2.0)
    assert data["ratio_at_equal_micro_batch"] == {"2": pytest.approx(2.0), "4": pytest.approx(2.0)}
    mfu = data["flops_per_token"] * 4096 / 0.1 / 1e12 / 989.0  # recomputed from the step times, not the runtime's
    assert data["megatron"]["best"]["mfu"] == pytest.approx(mfu)
    assert data["targets"]["ratio_met"] is True and data["targets"]["megatron_mfu_met"] is (mfu >= 0.5)


def test_loss_agreement_noise_floor_raises_the_tolerance_only_as_far_as_measured(tmp_path):
    base = [11.0 - 0.1 * i for i in range(50)]
    a = _jsonl(tmp_path / "a.jsonl", base)
    spike = base.copy()
    spike[22] *= 1.025  # 2.4% at iteration 23: above the fixed 5 bf16 units
    b = _jsonl(tmp_path / "b.jsonl", spike)
    assert not agreement.check_files(a, b)["agree"]
    rerun = base.copy()
    rerun[22] *= 0.97  # the baseline rerun differs by 3.0% there
    noise = _jsonl(tmp_path / "rerun.jsonl", rerun)
    res = agreement.check_files(a, b, noise=[noise])
    assert res["agree"] and res["noise_floor"] == pytest.approx(0.03, rel=1e-6)
    assert res["rtol"] == res["noise_floor"] and res["fixed_rtol"] == agreement.DEFAULT_RTOL
    assert res["noise"][0]["worst_iteration"] == 23
    assert agreement.main([str(a), str(b), "--noise", str(noise)]) == 0
    worse = base.copy()
    worse[22] *= 1.05  # beyond the measured floor: still a disagreement
    assert not agreement.check_files(a, _jsonl(tmp_path / "w.jsonl", worse), noise=[noise])["agree"]
    # a quiet noise run leaves the fixed tolerance in force
    assert not agreement.check_files(a, b, noise=[_jsonl(tmp_path / "q.jsonl", base)])["agree"]
    # a noise run that cannot set a floor is refused
    assert agreement.main([str(a), str(b), "--noise", str(_jsonl(tmp_path / "s.jsonl", base[:20]))]) == 2
