"""bench/gpu/te_matrix.py's rows (Transformer Engine, fp8, MegaDLMs' objective) on CPU: MegaDLMs' objective per micro-batch, a
small MoE (grouped GEMM on TE), ``checkpoint.init_from`` a Hugging Face model of the demo's shape
made on the spot, and the demo on megatron-core 0.19.2 (installed from a wheel into a site of its
own, recorded as not run without one)."""

from __future__ import annotations

import json
import sys
import textwrap
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
import te_matrix  # noqa: E402

NEW_ROWS = ("local-varlen-microbatch", "te-varlen-microbatch", "local-moe", "te-moe", "local-init-from-hf",
            "te-init-from-hf", "mc19-local-bf16")


def test_the_new_rows_and_their_references() -> None:
    for name in NEW_ROWS:
        assert name in te_matrix.CONFIGS, name
    refs = {n: te_matrix.CONFIGS[n][1] for n in NEW_ROWS}
    assert refs == {"local-varlen-microbatch": None, "te-varlen-microbatch": "local-varlen-microbatch",
                    "local-moe": None, "te-moe": "local-moe", "local-init-from-hf": None,
                    "te-init-from-hf": "local-init-from-hf", "mc19-local-bf16": "local-bf16"}
    assert te_matrix.MC19_ROWS == ("mc19-local-bf16", "mc19-local-qwen3")
    assert te_matrix.CONFIGS["mc19-local-qwen3"][1] == "local-qwen3"


def test_compiled_flags_of_the_new_rows(tmp_path: Path) -> None:
    # each compile ~0.5 s (no megatron-core import)
    for name in ("te-varlen-microbatch", "te-moe", "local-moe", "te-init-from-hf", "mc19-local-bf16"):
        code, text = te_matrix.compile_config(name, tmp_path)
        assert code == 0, (name, text[-2000:])
        train_py = (tmp_path / name / "train.py").read_text()
        assert te_matrix.check_flags(name, train_py) == [], name
    text = (tmp_path / "te-varlen-microbatch" / "train.py").read_text()
    # MegaDLMs' keys as specs/megadlms-1.7b-mdm.toml writes them reach train.py
    got = te_matrix.train_py_keywords(text)
    assert got["variable_length"] == "micro_batch" and got["loss_weighting"] == "realised"
    assert got["eps"] == 0.0 and got["min_masked_tokens"] == 1 and got["calculate_per_token_loss"] is False
    wrong = te_matrix.check_flags("te-varlen-microbatch", text.replace("variable_length='micro_batch'",
                                                                      "variable_length='sequence'"))
    assert wrong == ["variable_length: want 'micro_batch', got 'sequence'"]
    moe = te_matrix.train_py_keywords((tmp_path / "te-moe" / "train.py").read_text())
    assert moe["moe_grouped_gemm"] is True and moe["num_moe_experts"] == 4 and moe["use_transformer_engine"] is True
    assert te_matrix.check_flags("te-moe", (tmp_path / "local-moe" / "train.py").read_text())  # local is not TE


def test_the_hugging_face_models_match_the_compiled_demo(tmp_path: Path) -> None:
    dense = te_matrix.make_hf("dense", tmp_path / "dense", weights=False)
    moe = te_matrix.make_hf("moe", tmp_path / "moe", weights=False)
    assert dense["model_type"] == "qwen3" and moe["model_type"] == "qwen3_moe"
    config = json.loads((tmp_path / "dense" / "config.json").read_text())
    assert config["hidden_size"] == 768 and config["num_hidden_layers"] == 12 and config["vocab_size"] == 50257
    assert config["tie_word_embeddings"] is False and config["head_dim"] == 64
    for name in ("te-init-from-hf", "te-moe"):
        assert te_matrix.compile_config(name, tmp_path / "c")[0] == 0
    assert te_matrix.init_check(tmp_path / "c" / "te-init-from-hf" / "train.py", tmp_path / "dense") == \
        {"error": None, "warnings": []}
    assert te_matrix.init_check(tmp_path / "c" / "te-moe" / "train.py", tmp_path / "moe") == \
        {"error": None, "warnings": []}
    # the check is the runtime's: a model of another shape is named with the key to change
    bad = te_matrix.init_check(tmp_path / "c" / "te-init-from-hf" / "train.py", tmp_path / "moe")
    assert "model.num_experts" in bad["error"]


def _fake_wheel(path: Path, version: str) -> Path:
    wheel = path / f"megatron_core-{version}-py3-none-any.whl"
    dist = f"megatron_core-{version}.dist-info"
    files = {"megatron/__init__.py": "", "megatron/core/__init__.py": f"__version__ = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: megatron-core\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{k},,\n" for k in files) + f"{dist}/RECORD,,\n"
    path.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_mc19_install_and_no_wheel(tmp_path: Path) -> None:
    none = te_matrix.install_mc19(tmp_path / "empty", tmp_path / "site0")
    assert none["installed"] is False and none["not_run"] == "no wheel"
    _fake_wheel(tmp_path / "whl", "0.19.2")
    got = te_matrix.install_mc19(tmp_path / "whl", tmp_path / "site19")
    assert got["installed"], got
    assert got["megatron_core"].startswith("0.19.2 ") and str(tmp_path / "site19") in got["megatron_core"]
    assert got["env"]["PYTHONPATH"].split(":")[0] == str(tmp_path / "site19")
    # a wheel of another version is not taken for 0.19
    _fake_wheel(tmp_path / "whl16", "0.16.1")
    assert te_matrix.install_mc19(tmp_path / "whl16", tmp_path / "site16")["installed"] is False


FAKE = textwrap.dedent('''\
    import json, os, sys
    name, runs = sys.argv[1], sys.argv[2]
    scale = float(os.environ.get("FAKE_SCALE", "1"))
    run = os.path.join(runs, name)
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"event": "start", "layer_spec": "local", "weights": {"from": "random"},
                            "provenance": {"versions": {"megatron_core": os.environ.get("FAKE_MCORE", "0.16.1")}}})
                + "\\n")
        for i in range(1, 41):
            f.write(json.dumps({"event": "train", "iteration": i, "loss": scale * 10 / (1 + 0.1 * i)}) + "\\n")
    ''')


def test_launch_loop_gives_mc19_its_environment_and_skips_rows_not_run(tmp_path: Path, monkeypatch) -> None:
    runs, dest, out = tmp_path / "runs", tmp_path / "dest", tmp_path / "out"
    out.mkdir()
    (tmp_path / "fake.py").write_text(FAKE)
    names = ["local-bf16", "mc19-local-bf16", "te-moe"]
    for n in names:
        (dest / n).mkdir(parents=True)
        (dest / n / "launch.sh").write_text(f"{sys.executable} {tmp_path / 'fake.py'} {n} {runs}\n")
    monkeypatch.setattr(te_matrix, "RUNS", runs)
    results = {n: {"config": n, "compile_exit": 0} for n in names}
    results["te-moe"]["not_run"] = "for the test"
    t0 = time.time()
    te_matrix.run_matrix(results, dest, out, deadline=time.time() + 60, width=2,
                         envs={"mc19-local-bf16": {"FAKE_SCALE": "1.5", "FAKE_MCORE": "0.19.2"}})
    assert time.time() - t0 < 30
    assert not (out / "te-moe.json").exists() and "launches" not in results["te-moe"]
    row = json.loads((out / "mc19-local-bf16.json").read_text())
    assert row["launches"]["mc19-local-bf16"]["command"].startswith("env FAKE_SCALE=1.5 FAKE_MCORE=0.19.2 bash ")
    assert row["megatron_core"] == "0.19.2" and row["trains"] is True
    assert json.loads((out / "local-bf16.json").read_text())["megatron_core"] == "0.16.1"
    assert row["agreement"]["against"] == "local-bf16" and not row["agreement"]["agree"]  # 1.5x: the env reached it
    assert abs(row["first_step"]["max_rel_diff"] - 0.5 / 1.5) < 1e-9 and row["first_step"]["compared"] == 1
    assert row["start"]["weights"] == {"from": "random"} and row["start"]["layer_spec"] == "local"


def test_dry_checks_the_mc19_rows_keywords_against_0_19_2(tmp_path: Path) -> None:
    assert te_matrix.compile_config("mc19-local-bf16", tmp_path)[0] == 0
    text = (tmp_path / "mc19-local-bf16" / "train.py").read_text()
    assert te_matrix.mc19_unknown_keywords(text) == []
    # a keyword 0.19.2 lacks is named with its class, also one spread in from PARALLEL_SIZES
    bad = text.replace("num_layers=", "num_layerz=", 1).replace("tensor_model_parallel_size=", "tp_size=", 1)
    assert te_matrix.mc19_unknown_keywords(bad) == ["TransformerConfig.num_layerz", "TransformerConfig.tp_size"]
    assert te_matrix.mc19_unknown_keywords(text, tmp_path / "absent.json") is None
