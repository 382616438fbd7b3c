"""bench/throughput: the strong HF peers of hf_baseline.py (--impl liger, liger-compile,
liger-compile-fp8) and run.py's compiled megatron variants and ratios, on CPU.

Liger Kernel imports Triton, which a CPU machine lacks: its masked-row fused linear cross entropy
is tested through hf_baseline's pure-torch stand-in of the same signature (checked against Liger's
own source in the wheel), and Liger's import chain and module patches through a permissive Triton
stand-in in a subprocess (the wheels are read from .whl/peer, here or in /work/main; skipped without them).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import stat
import subprocess
import sys
import zipfile
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
WHEEL_DIRS = [ROOT / ".whl" / "peer", Path("/work/main/.whl/peer")]


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return load_script(BENCH / f"{name}.py", f"bench_throughput_{name}")


run = _load("run")


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    return _load("hf_baseline")


def _wheel(prefix: str) -> Path:
    for folder in WHEEL_DIRS:
        found = sorted(folder.glob(f"{prefix}-*.whl")) if folder.is_dir() else []
        if found:
            return found[-1]
    pytest.skip(f"no {prefix} wheel in {', '.join(map(str, WHEEL_DIRS))}")


# --------------------------------------------------------------------------- the masked-row loss


def _tiny_batch(hf, torch, *, mbs=3, seq=24, variable_length_prob=0.0, seed=5):
    from throughput_common import TINY

    from dlmspec.backends.megatron.objective import MaskedDiffusionObjective

    obj = MaskedDiffusionObjective(TINY["mask_token_id"], eps=1e-3, loss_weighting="llada",
                                   variable_length_prob=variable_length_prob)
    tokens = torch.randint(0, TINY["tokenizer_vocab"], (mbs, seq), generator=torch.Generator().manual_seed(seed))
    return obj.prepare({"tokens": tokens}, torch.Generator().manual_seed(seed + 1))


@pytest.mark.parametrize("reduction", ["none", "grouped"])
@pytest.mark.parametrize("vlp", [0.0, 1.0])
def test_masked_row_flce_loss_and_gradients_equal_the_plain_loops(hf, reduction, vlp):
    """The Liger loops' loss (final hidden states of the masked rows only, the fused linear cross
    entropy with the objective's 1/t weights) is the plain loop's LLaDA loss over the full logits:
    same value, same gradient of every parameter (fp32, CPU, the stand-in of Liger's function);
    ``vlp = 1.0``: every sequence truncated (key-padding mask, zero-weight tail)."""
    import torch
    from throughput_common import TINY

    torch.manual_seed(0)
    model = hf.build_model(TINY, 24, device=torch.device("cpu"), param_dtype=torch.float32, initializer_range=0.2)
    ob = _tiny_batch(hf, torch, variable_length_prob=vlp)
    assert (ob.attention_mask is not None) == (vlp == 1.0)
    assert len(set(ob.loss_weights[ob.loss_weights != 0].tolist())) > 1  # several weights: grouping matters

    plain = hf.plain_loss(model, ob)
    plain.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    calls = []

    def flce(*args, **kwargs):
        calls.append((args[0].shape[0], kwargs["reduction"]))
        return hf.torch_fused_linear_cross_entropy(*args, **kwargs)

    strong = hf.make_flce_loss(flce, reduction)(model, ob)
    strong.backward()
    assert float(strong) == pytest.approx(float(plain), rel=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)
    masked_rows = int((ob.loss_weights != 0).sum())
    assert sum(n for n, _ in calls) == masked_rows < ob.loss_weights.numel()  # only the masked rows reach it
    if reduction == "none":
        assert calls == [(masked_rows, "none")]
    else:  # one call per distinct weight (LLaDA: per sequence), each summed
        assert len(calls) == len(set(ob.loss_weights[ob.loss_weights != 0].tolist())) and {r for _, r in calls} == {"sum"}


def test_masked_row_flce_loss_with_nothing_masked_is_a_differentiable_zero(hf):
    import torch

    ob = _tiny_batch(hf, torch)
    ob.loss_weights.zero_()
    hidden = torch.randn(3, 24, 8, requires_grad=True)
    loss = hf.masked_flce_loss(hidden, torch.randn(16, 8), ob, hf.torch_fused_linear_cross_entropy)
    loss.backward()
    assert float(loss) == 0.0 and hidden.grad is not None
    with pytest.raises(ValueError, match="reduction"):
        hf.masked_flce_loss(hidden, torch.randn(16, 8), _tiny_batch(hf, torch), hf.torch_fused_linear_cross_entropy,
                            reduction="mean")


def test_the_stand_in_has_ligers_signature_and_refuses_what_it_does_not_implement(hf):
    import torch

    source = zipfile.ZipFile(_wheel("liger_kernel")).read("liger_kernel/transformers/functional.py").decode()
    [fn] = [n for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.FunctionDef) and n.name == "liger_fused_linear_cross_entropy"]
    liger = [a.arg for a in fn.args.args]
    liger_defaults = [ast.literal_eval(d) if not isinstance(d, ast.Name) else d.id for d in fn.args.defaults]
    params = inspect.signature(hf.torch_fused_linear_cross_entropy).parameters
    assert list(params) == liger
    ours = [p.default for p in params.values() if p.default is not inspect.Parameter.empty]
    assert [None if d is None else d for d in ours] == [None if d == "None" else d for d in liger_defaults]
    x, w, y = torch.randn(4, 8), torch.randn(16, 8), torch.randint(0, 16, (4,))
    per = hf.torch_fused_linear_cross_entropy(x, w, y, reduction="none")
    assert per.shape == (4,) and float(hf.torch_fused_linear_cross_entropy(x, w, y, reduction="sum")) == pytest.approx(float(per.sum()))
    with pytest.raises(NotImplementedError):
        hf.torch_fused_linear_cross_entropy(x, w, y, label_smoothing=0.1)


def test_hf_impl_names_agree_between_run_and_hf_baseline(hf):
    assert list(run.HF_IMPLS) == list(hf.IMPLS)
    assert {v for v in run.HF_IMPLS.values()} == {"bf16", "fp8"} and run.HF_IMPLS["liger-compile-fp8"] == "fp8"


@pytest.mark.harness
def test_liger_impl_runs_end_to_end_on_cpu_with_the_stand_in(hf, tmp_path):
    """hf_baseline.main --impl liger-compile (stand-in, eager backend): bidirectional check, the
    masked-row loss, the JSON's impl record; same losses as the plain loop of the same seed."""
    rows = {}
    for impl in ("plain", "liger-compile"):
        out = tmp_path / f"{impl}.json"
        rc = hf.main(["--preset", "tiny", "--seq-length", "16", "--micro-batch-sizes", "2", "--warmup", "0", "--steps", "2",
                      "--device", "cpu", "--json", str(out), "--impl", impl, "--liger-standin", "--compile-backend", "eager"])
        assert rc == 0
        rows[impl] = json.loads(out.read_text())
    data = rows["liger-compile"]
    assert data["setup"]["impl"] == "liger-compile" and data["bidirectional_check"]["bidirectional"]
    assert data["impl_setup"]["compiled"] == {"what": "each decoder layer, nn.Module.compile", "backend": "eager", "layers": 2}
    assert "masked rows only" in data["setup"]["loss"] and data["setup"]["flce_reduction"] == "none"
    assert "stand-in" in data["setup"]["liger"]
    assert data["impl_setup"]["truncated_path_compiled"]["key_padding_mask"] is True  # before any timed step
    assert data["attempts"][0]["losses"] == pytest.approx(rows["plain"]["attempts"][0]["losses"], rel=1e-5)


def test_impl_without_liger_is_recorded_not_a_traceback(hf, tmp_path, monkeypatch):
    def missing(standin=False):
        raise ModuleNotFoundError("No module named 'triton'")

    monkeypatch.setattr(hf, "load_liger", missing)
    out = tmp_path / "x.json"
    assert hf.main(["--preset", "tiny", "--device", "cpu", "--impl", "liger", "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["status"] == "import_failed" and "triton" in data["error"]


TRITON_STANDIN = r'''
import importlib.abc, importlib.machinery, sys, types
class Dummy:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k):
        return a[0] if len(a) == 1 and callable(a[0]) and not k else Dummy()
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Dummy()
    def __getitem__(self, k): return Dummy()
    def __mro_entries__(self, bases): return (object,)
    def __or__(self, o): return Dummy()
    __ror__ = __or__
    def __iter__(self): return iter(())
    def __bool__(self): return False
class Mod(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Dummy()
class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = Mod(spec.name); m.__path__ = []; m.__version__ = "3.5.0"; return m
    def exec_module(self, module): pass
sys.meta_path.insert(0, Finder())
'''

WIRING = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import hf_baseline as hb
from throughput_common import TINY
liger = hb.load_liger()  # the real import path: liger_kernel.transformers (Triton stood in)
liger["apply"]()
model = hb.build_model(TINY, 16, device=torch.device("cpu"), param_dtype=torch.float32)
# the stand-in goes before torch.compile imports its backends (they must see no Triton); nothing runs forward here
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "Finder"]
for name in [m for m in sys.modules if m == "triton" or m.startswith("triton.")]:
    del sys.modules[name]
info = hb.finish_impl(model, "liger-compile-fp8", compile_backend="eager", fp8_emulate=True)
from transformers.models.qwen3 import modeling_qwen3 as mq
print(json.dumps({"modules": info["modules"], "float8": info["float8"], "rope": mq.apply_rotary_pos_emb.__module__,
                  "q_norm": type(model.model.layers[0].self_attn.q_norm).__name__,
                  "final_norm": type(model.model.norm).__name__, "lm_head": type(model.lm_head).__name__,
                  "flce": liger["flce"].__module__ + "." + liger["flce"].__name__, "version": liger["version"]}))
'''


def test_liger_patches_and_float8_conversion_through_the_real_import_path(tmp_path):
    """With the wheels unpacked (a wheel is a zip) and Triton stood in: hf_baseline.load_liger()
    imports Liger's real modules, apply_liger_kernel_to_qwen3 swaps Qwen3's RMSNorm (q/k norms and
    the final norm too), MLP and RoPE function before the model is built, and torchao converts the 7
    linears of each decoder layer to Float8Linear but not lm_head."""
    site = tmp_path / "site"
    for prefix in ("liger_kernel", "torchao"):
        zipfile.ZipFile(_wheel(prefix)).extractall(site)
    (site / "triton_standin.py").write_text(TRITON_STANDIN)
    # torch and torchao first: they must see no Triton (as on any CPU machine); then Liger sees the stand-in
    code = f"import sys; sys.path[:0] = [{str(site)!r}]; import torch, torchao.float8, triton_standin\n" + WIRING
    proc = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == {"norm": "LigerRMSNorm", "mlp": "LigerSwiGLUMLP", "attention": "Qwen3Attention"}
    assert got["q_norm"] == got["final_norm"] == "LigerRMSNorm" and got["rope"] == "liger_kernel.transformers.rope"
    assert got["flce"] == "liger_kernel.transformers.functional.liger_fused_linear_cross_entropy"
    assert got["float8"]["converted_linears"] == 7 * 2 and got["lm_head"] == "Linear"
    assert all("lm_head" not in n for n in got["float8"]["converted_example"]) and got["version"] == "0.8.5"


# --------------------------------------------------------------------------- run.py


def test_run_rejects_unknown_impls_and_variants_naming_the_flag():
    for flags, name in ((["--hf-impls", "liger,fast"], "--hf-impls"), (["--megatron-variants", "te-fp4"], "--megatron-variants"),
                        (["--hf-impl-micro-batch-sizes", "plain"], "--hf-impl-micro-batch-sizes"),
                        (["--preset", "tiny", "--megatron-variants", "te-bf16"], "--megatron-variants")):
        proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry-run", *flags], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert proc.returncode == 2 and name in proc.stderr and "Traceback" not in proc.stderr, (flags, proc.stderr)


def test_job_order_alternates_sides_in_the_given_order_with_per_impl_micro_batches():
    args = run.parse_args(["--megatron-variants", "te-fp8,te-bf16", "--megatron-micro-batch-sizes", "8,12",
                           "--hf-impls", "liger,liger-compile-fp8,liger-compile,plain", "--hf-micro-batch-sizes", "12",
                           "--hf-impl-micro-batch-sizes", "plain=6"])
    assert [run.job_name(*j) for j in run.job_order(args)] == [
        "megatron-te-fp8_mb8", "hf-liger_mb12", "megatron-te-fp8_mb12", "hf-liger-compile-fp8_mb12",
        "megatron-te-bf16_mb8", "hf-liger-compile_mb12", "megatron-te-bf16_mb12", "hf_mb6"]
    sets = run.compiled_sets(args, "te-fp8", 12, Path("/tmp/r"))
    assert sets["precision.fp8"] == "hybrid" and sets["model.transformer_impl"] == "transformer_engine"
    assert sets["train.global_batch_size"] == 12 and sets["train.train_iters"] == 8


@pytest.mark.harness
def test_run_dry_run_compiles_the_te_variants_and_checks_their_train_py(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry-run", "--megatron-variants", "te-fp8,te-bf16",
                           "--megatron-micro-batch-sizes", "12", "--hf-impls", "liger", "--hf-micro-batch-sizes", "12",
                           "--microbatches-per-step", "2", "--work-dir", str(tmp_path), "--skip-import-check"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = [line for line in proc.stdout.splitlines() if not line.startswith(("#", "result: ")) and ": " in line and not line.startswith(" ")]
    labels = [line.split(":")[0] for line in jobs]
    assert labels == ["megatron-te-fp8 mb12", "hf-liger mb12", "megatron-te-bf16 mb12"]
    assert proc.stdout.count("keywords as expected") == 2
    assert "--impl liger" in jobs[1] and "torch.distributed.run" in jobs[0]
    text = (tmp_path / "megatron-te-fp8_mb12.compiled" / "train.py").read_text()
    kw = run.train_py_keywords(text)
    assert kw["fp8"] == "hybrid" and kw["use_transformer_engine"] is True and kw["global_batch_size"] == 24
    # the import check: the imports the rows need, and the masked-row loss wiring through the stand-in
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--dry-run", "--sides", "hf", "--hf-impls", "liger",
                           "--hf-micro-batch-sizes", "12", "--work-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    # without liger-kernel (no CUDA machine) the dry run exits 2 naming it (bench/common.py missing_peers)
    liger_missing = "# import liger_kernel.transformers (hf liger* impls): ok" not in proc.stdout
    assert proc.returncode == (2 if liger_missing else 0), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not liger_missing or "liger_kernel.transformers (needed by hf liger* impls" in proc.stderr
    assert "# masked-row loss (stand-in) = plain loss (hf liger* impls): ok" in proc.stdout
    assert "# import liger_kernel.transformers" in proc.stdout and "megatron" not in proc.stdout.split("# import")[1]


def _summary(tps, **extra):
    return {"micro_batch_size": 8, "status": "ok", "tokens_per_s": tps, "median_step_time_s": 1.0, "tflops_per_gpu": 1.0,
            "mfu": 0.4, "peak_mem_gib": 100.0, "peak_reserved_gib": 110.0, **extra}


def test_peer_ratios_name_their_rows_and_targets():
    results = {"megatron": {"attempts": [_summary(50.0, variant="te-fp8"), _summary(40.0, variant="te-bf16"),
                                         _summary(45.0, variant="te-bf16", micro_batch_size=12)]},
               "hf": {"attempts": [_summary(30.0, impl="liger"), _summary(36.0, impl="liger-compile"),
                                   _summary(20.0, impl="plain"), _summary(42.0, impl="liger-compile-fp8"),
                                   {"micro_batch_size": 12, "status": "oom", "impl": "plain"}]}}
    run.finish(results)
    r = results["ratios"]
    assert r["te_fp8_over_strongest_hf_bf16"]["hf"] == "liger-compile"
    assert r["te_fp8_over_strongest_hf_bf16"]["ratio"] == pytest.approx(50 / 36) and r["te_fp8_over_strongest_hf_bf16"]["met"] is False
    assert r["te_fp8_over_hf_fp8"]["ratio"] == pytest.approx(50 / 42) and r["te_fp8_over_hf_fp8"]["met"] is True
    bf16 = r["megatron_bf16_over_fastest_hf_bf16"]
    assert (bf16["megatron"], bf16["hf"], bf16["ratio"]) == ("te-bf16", "liger-compile", pytest.approx(45 / 36))
    assert len(r["by_pair"]) == 2 * 4 and r["by_pair"]["te-fp8/plain"] == pytest.approx(2.5)
    best = results["megatron"]["best_by_variant"]["te-bf16"]
    assert best["micro_batch_size"] == 12 and best["peak_reserved_gib"] == 110.0
    # a side without a row: the ratio is None, not an error
    results = {"megatron": {"attempts": [_summary(50.0, variant="te-fp8")]}, "hf": {"attempts": [_summary(30.0, impl="liger")]}}
    run.finish(results)
    assert results["ratios"]["te_fp8_over_hf_fp8"] is None and results["ratios"]["megatron_bf16_over_fastest_hf_bf16"] is None


FAKE = r'''
import json, os, re, sys
argv = sys.argv[1:]
if "torch.distributed.run" in argv:  # a compiled train.py: its run_dir and micro batch from the file
    text = open(argv[-1]).read()
    run_dir = re.search(r"run_dir='([^']+)'", text).group(1)
    mbs = int(re.search(r"micro_batch_size=(\d+)", text).group(1))
    fast = 0.5 if "fp8='hybrid'" in text else 1.0
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        for it in range(1, int(re.search(r"train_iters=(\d+)", text).group(1)) + 1):
            f.write(json.dumps({"event": "train", "iteration": it, "loss": 10.0, "step_time_s": 0.1 * mbs * fast,
                                "peak_mem_gib": 90.0, "peak_reserved_gib": 100.0}) + "\n")
else:
    mbs = int(argv[argv.index("--micro-batch-sizes") + 1])
    impl = argv[argv.index("--impl") + 1] if "--impl" in argv else "plain"
    step = 0.1 * mbs * {"plain": 2.0, "liger": 1.25, "liger-compile-fp8": 0.8}[impl]
    attempt = {"micro_batch_size": mbs, "status": "ok", "step_times_s": [step], "median_step_time_s": step,
               "tokens_per_s": mbs * 4096 / step, "tflops_per_gpu": 1.0, "mfu": 0.001, "peak_mem_gib": 1.0,
               "peak_reserved_gib": 2.0}
    with open(argv[argv.index("--json") + 1], "w") as f:
        json.dump({"attempts": [attempt], "bidirectional_check": {"bidirectional": True},
                   "impl_setup": {"impl": impl, "dynamo": {"unique_graphs": 1}}}, f)
'''


def test_run_end_to_end_compiles_runs_and_reports_the_peer_ratios(tmp_path):
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    fake = tmp_path / "fake-python"
    fake.write_text(f'#!/bin/sh\nshift\nexec "{sys.executable}" "{script}" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(BENCH / "run.py"), "--python", str(fake), "--out", str(out),
                           "--work-dir", str(tmp_path / "work"), "--megatron-variants", "te-fp8,te-bf16",
                           "--megatron-micro-batch-sizes", "8", "--hf-impls", "liger,liger-compile-fp8,plain",
                           "--hf-micro-batch-sizes", "12", "--hf-impl-micro-batch-sizes", "plain=6", "--tag", "peers"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ, "OUT": ""})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(next((out / "throughput").glob("*.json")).read_text())["values"]
    assert [a["status"] for a in data["megatron"]["attempts"] + data["hf"]["attempts"]] == ["ok"] * 5
    assert data["megatron"]["attempts"][0]["variant"] == "te-fp8" and "compile_command" in data["megatron"]["attempts"][0]
    r = data["ratios"]
    # megatron: 8*4096/(0.8*0.5) = 81920 (fp8), 40960 (bf16); HF: liger 12*4096/1.5 = 32768, fp8 51200, plain 20480
    assert r["te_fp8_over_strongest_hf_bf16"]["ratio"] == pytest.approx(81920 / 32768)
    assert r["te_fp8_over_hf_fp8"]["ratio"] == pytest.approx(81920 / 51200)
    assert r["megatron_bf16_over_fastest_hf_bf16"]["ratio"] == pytest.approx(40960 / 32768)
    assert data["hf"]["best_by_impl"]["plain"]["micro_batch_size"] == 6
    assert [a["impl_setup"]["impl"] for a in data["hf"]["attempts"]] == ["liger", "liger-compile-fp8", "plain"]
    assert "te_fp8_over_hf_fp8: te-fp8 / liger-compile-fp8 = 1.600" in proc.stdout
