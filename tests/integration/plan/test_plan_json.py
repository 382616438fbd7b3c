"""``Plan.to_dict()``: stable keys, deterministic output, no torch; and the memory rules of dlmspec.check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dlmspec.check import find
from dlmspec.errors import SpecIssue
from dlmspec.spec.load import load_text
from dlmspec.plan import SCHEMA, make_plan, memory_fits
from dlmspec.plan.memory import ALLOCATED_TERMS, RESERVED_TERMS
from dlmspec.plan.time import TIME_TERMS
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"

TOP_KEYS = {
    "schema", "name", "gpu", "layout", "parameters", "memory", "flops", "time", "throughput", "mfu",
    "gpu_hours", "runtime", "calibration", "provenance", "sft",
}


def _demo():
    from dlmspec.spec.load import load

    return resolve(load(DEMO).spec)


def test_keys_are_stable():
    d = make_plan(_demo()).to_dict()
    assert set(d) == TOP_KEYS
    assert d["schema"] == SCHEMA
    assert {"total", "active"} <= set(d["parameters"])
    assert {"peak_bytes", "peak_allocated_bytes", "breakdown", "per_stage", "peak_stage", "peak_phase"} <= set(d["memory"])
    assert list(d["memory"]["breakdown"]) == list(ALLOCATED_TERMS + RESERVED_TERMS)
    assert {"step_seconds", "to_train_seconds", "breakdown_seconds"} <= set(d["time"])
    assert list(d["time"]["breakdown_seconds"]) == list(TIME_TERMS)
    assert {"tokens_per_second", "model_tflops_per_gpu"} <= set(d["throughput"])
    # the demo cuts sequences to random lengths (variable_length_prob), so auto takes the local layers
    assert d["runtime"]["transformer_impl"].startswith("local+sdpa")
    assert "objective.variable_length_prob" in d["runtime"]["transformer_impl"]
    assert all(isinstance(v, int) for v in d["memory"]["breakdown"].values())
    assert d["parameters"]["total"] == 152712960  # the demo's description: 153M parameters


def test_output_is_deterministic_json():
    a = json.dumps(make_plan(_demo()).to_dict(), sort_keys=True)
    b = json.dumps(make_plan(_demo()).to_dict(), sort_keys=True)
    assert a == b
    json.loads(a)


def test_transformer_impl_paths():
    spec = Spec.model_validate({"model": {"preset": "qwen3-0.6b"}, "train": {"global_batch_size": 8, "seq_length": 1024},
                                "cluster": {"gpu": "h100", "gpus_per_node": 8}})
    auto = make_plan(resolve(spec)).to_dict()["runtime"]
    assert auto["modelled_as"] == "local+sdpa" and auto["spec_transformer_impl"] == "auto"
    fp8 = make_plan(resolve(spec.replace(**{"precision.fp8": "hybrid"}))).to_dict()["runtime"]
    assert fp8["modelled_as"] == "transformer_engine" and "precision.fp8" in fp8["transformer_impl"]
    te = make_plan(resolve(spec.replace(**{"model.transformer_impl": "transformer_engine"}))).to_dict()
    assert te["runtime"]["modelled_as"] == "transformer_engine"


def test_plan_imports_no_torch():
    code = (
        "import sys\n"
        "import dlmspec.check, dlmspec.plan, dlmspec.plan.search, dlmspec.plan.report, dlmspec.plan.megatron_formula, dlmspec.cli.plan\n"
        "from dlmspec.spec.load import load\nfrom dlmspec.resolve import resolve\n"
        f"p = dlmspec.plan.make_plan(resolve(load({str(DEMO)!r}).spec))\n"
        "dlmspec.check.find(('memory',), load(" + repr(str(DEMO)) + "))\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'megatron', 'transformer_engine'))]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == ""


BIG = """
name = "too-big"
[model]
preset = "llama-3-8b"
[train]
micro_batch_size = 8
global_batch_size = 8
seq_length = 8192
[cluster]
gpu = "h100"
gpus_per_node = 1
"""


def test_memory_rule_fails_with_breakdown_and_advice():
    loaded = load_text(BIG, name="big.toml")
    issues = find(("memory",), loaded)
    assert len(issues) == 1
    issue = issues[0]
    assert isinstance(issue, SpecIssue)
    assert issue.rule == "memory-fits" and issue.severity == "error" and issue.key == "cluster.gpu"
    assert "exceeds" in issue.message and "weights" in issue.message and "GiB" in issue.message
    assert issue.file == "big.toml" and issue.line == 10  # the `gpu = "h100"` line
    assert issue.hint


def test_memory_fits_advice_fits_when_it_says_so():
    spec = Spec.model_validate({"model": {"preset": "qwen3-8b"},
                                "train": {"micro_batch_size": 8, "global_batch_size": 64, "seq_length": 4096},
                                "cluster": {"gpu": "h100", "gpus_per_node": 8}})
    plan = make_plan(resolve(spec))
    fits, advice = memory_fits(plan)
    assert not fits and advice and all(line.startswith("--set ") for line in advice)
    # Apply the first piece of advice: the new spec must plan under the GPU's memory.
    changes = {}
    for part in advice[0].split(" (")[0].split("--set ")[1:]:
        key, _, value = part.strip().partition("=")
        changes[key] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    fixed = make_plan(resolve(spec.replace(**changes)))
    assert fixed.fits


def test_memory_rules_quiet_when_it_fits():
    assert find(("memory",), _demo().spec, _demo()) == []


def test_memory_advice_names_the_largest_smaller_micro_batch_that_fits():
    """A smaller micro batch means the largest one that divides the global batch and fits, not
    micro batch 1: at fp8 micro batch 14 (global batch 14) on one H200, micro batch 7 (two
    microbatches) leaves the headroom and is faster than full recomputation."""
    import dataclasses

    from dlmspec.plan import HEADROOM_WARNING
    from dlmspec.spec.load import load

    root = Path(__file__).resolve().parents[3]
    loaded = load(root / "bench" / "throughput" / "qwen3-1.7b-mdm.toml",
                  ['precision.fp8="hybrid"', "train.micro_batch_size=14", "train.global_batch_size=14"])
    plan = make_plan(resolve(loaded.spec))
    assert plan.fits and plan.peak_bytes > HEADROOM_WARNING * plan.gpu.memory_bytes
    within = dataclasses.replace(plan.gpu, memory_bytes=int(HEADROOM_WARNING * plan.gpu.memory_bytes))
    fits, advice = memory_fits(dataclasses.replace(plan, gpu=within))
    assert not fits
    micro = [line for line in advice if line.startswith("--set train.micro_batch_size=") and "recompute" not in line]
    assert len(micro) == 1 and micro[0].startswith("--set train.micro_batch_size=7 ("), advice
    assert advice[0] == micro[0]  # the fastest of the changes that fit
    full = next(line for line in advice if "recompute.granularity=full" in line and "micro_batch" not in line)
    tokens = lambda line: float(line.rsplit(", ", 1)[1].split(" tokens/s")[0].replace(",", ""))
    assert tokens(micro[0]) > tokens(full)
