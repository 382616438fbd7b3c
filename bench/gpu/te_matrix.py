"""The Transformer Engine path of the compiled demo, configuration by configuration.

Each configuration is ``specs/demo-dlm.toml`` with ``--set`` overrides (:data:`CONFIGS`), 40 steps
logged every step, in run and checkpoint directories of its own (``runs/te/NAME``): bf16 on the
local layers (the reference, and again for the noise floor), bf16 on Transformer Engine (its
fused layer-norm + linear modules), fp8 with delayed, current per-tensor (``tensorwise``) and
blockwise scaling, selective and full recomputation, variable-length sequences
(``objective.variable_length_prob = 0.5``, TE's padding mask) against the same on the local
layers, and a save at step 20 killed and resumed to step 40 against the uninterrupted TE run.
Then, each TE row against the same on the local layers: MegaDLMs' objective (``te-varlen-microbatch``: eps 0 with one forced mask,
realised-ratio weights, one cut per micro-batch, the loss normalised per micro-batch, as
specs/megadlms-1.7b-mdm.toml; cut probability 0.5 so that cuts happen in 40 steps); a small MoE
(``te-moe``: 4 experts of 1024, top-2, grouped GEMM on TE, the experts one by one on the local
layers, where validate refuses grouped GEMM); ``checkpoint.init_from`` a Hugging Face Qwen3 of the
demo's shape made on the spot (``te-init-from-hf``; random bf16 weights, ``save_pretrained``; the MoE
pair starts from a Qwen3-MoE made the same way, so both expert modules hold the same weights); and
``mc19-local-bf16``: local-bf16 on megatron-core 0.19.2, installed from ``.whl/mc19/*.whl`` into
/tmp/site19 (first on the launch's PYTHONPATH, the rest kept), against local-bf16 on 0.16.1
(recorded as not run when the wheel is absent).

    python3 bench/gpu/te_matrix.py --dry [--dest DIR] [--only A,B]   # CPU: compile, check the flags
    python3 bench/gpu/te_matrix.py OUT [--dest DIR] [--budget-s S]    # GPU: the same, then run them
    python3 bench/gpu/te_matrix.py --rescore DIR                      # compare DIR's records again

``--dry`` (no GPU needed) makes the demo's data from the offline kit when missing
(bench/gpu/prepare.py ``demo_inputs``), compiles every configuration into ``--dest`` (default
``.device/te``), checks in each train.py the keywords its overrides must produce (:func:`check_flags`)
and runs its ``build_configs()`` and ``build_run()`` (megatron-core's config checks); for the
init_from rows it writes the Hugging Face models' ``config.json`` (under ``runs/te-hf``) and checks
them against the compiled model as the runtime does before converting (:func:`init_check`). Without
``--dry`` the Hugging Face models get their weights, megatron-core 0.19.2 is installed, and the
configurations then run (several at once on the one GPU; each launch is killed at the budget) and
``OUT/NAME.json`` records per configuration: the command, the flags, the exit code, the per-step
losses, peak allocated / reserved memory, the comparison of its first 40 losses (and of its first
alone) with its reference (:func:`agreement`), whether it trains (last loss below the first), and
the start record's layers, weights and versions; ``OUT/te_matrix.json`` the summary, the versions
and the noise criterion; ``OUT/te-bf16.json`` also the TE layer spec's modules. When ``.whl/mc19/``
holds a megatron-core wheel, its config fields go to ``OUT/mcore_fields.json`` (bench/gpu/mcore_fields.py).
Exit code 0 when every configuration compiled (and ran), 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "throughput"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

# train_py_keywords: the tests' (and readers') te_matrix.train_py_keywords
from compiled_runs import (call_train_py, compile_in_process, flags_wrong, kill_tree,  # noqa: E402,F401
                           train_py_keywords, versions)

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402  (bench/common.py: read_metrics)

SPEC = "specs/demo-dlm.toml"
#: The configurations' run directories (``logging.run_dir = "runs/te/NAME"``).
RUNS = ROOT / "runs" / "te"
#: Steps each configuration trains and compares: 40 (the committed te_matrix_h200.json), or
#: $TE_MATRIX_STEPS (an earlier GPU run's 50-step fp8 agreement: the "first 50 steps" target); set it alike
#: for --dry and the GPU run.
STEPS = int(os.environ.get("TE_MATRIX_STEPS", "40"))
#: What every configuration sets: STEPS steps logged one by one, no evaluation, no checkpoint.
COMMON = {"train.train_iters": STEPS, "train.lr_warmup_iters": 10, "train.eval_interval": 1000,
          "logging.log_interval": 1, "checkpoint.save_at_end": False, "checkpoint.save_interval": 1000}
TE = {"model.transformer_impl": "transformer_engine", "objective.variable_length_prob": 0.0}
LOCAL = {"model.transformer_impl": "local", "objective.variable_length_prob": 0.0}
FP8 = {**TE, "precision.fp8": "hybrid"}
#: MegaDLMs' objective and loss normalisation, as specs/megadlms-1.7b-mdm.toml writes them.
MEGADLMS = {"objective.eps": 0.0, "objective.min_masked_tokens": 1, "objective.loss_weighting": "realised",
            "objective.variable_length": "micro_batch", "objective.variable_length_prob": 0.5,
            "train.loss_normalization": "micro_batch", "train.micro_batch_size": 16}
MEGADLMS_FLAGS = {"eps": 0.0, "min_masked_tokens": 1, "loss_weighting": "realised", "variable_length": "micro_batch",
                  "variable_length_prob": 0.5, "loss_normalization": "micro_batch", "calculate_per_token_loss": False,
                  "micro_batch_size": 16}
#: The small MoE: 4 experts of width 1024, top-2 routing, every layer.
MOE = {"model.num_experts": 4, "model.moe_router_topk": 2, "model.moe_ffn_hidden_size": 1024}
MOE_FLAGS = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024, "moe_layer_freq": 1}
#: The Qwen3-1.7B architecture (bench/throughput/qwen3-1.7b-mdm.toml's model) at sequence 4096 on mock
#: data, micro batch 1: what the mc19 pair runs.
QWEN3 = {"model.preset": "qwen3-1.7b", "model.num_layers": 28, "model.hidden_size": 2048, "model.ffn_hidden_size": 6144,
         "model.num_attention_heads": 16, "model.num_query_groups": 8, "model.kv_channels": 128,
         "model.vocab_size": 151936, "model.max_position_embeddings": 4096,
         "model.untie_embeddings_and_output_weights": True, "data.mock": True, "data.train": [], "data.valid": [],
         "data.tokenizer.type": "NullTokenizer", "data.tokenizer.vocab_size": 151934, "objective.mask_token_id": 151935,
         "train.seq_length": 4096, "train.micro_batch_size": 1, "train.global_batch_size": 1}
QWEN3_FLAGS = {"num_layers": 28, "hidden_size": 2048, "seq_length": 4096, "micro_batch_size": 1}
#: Where the Hugging Face checkpoints of the init_from rows are made (relative to the repository root).
HF_DIR = "runs/te-hf"

#: name -> (overrides, reference run, what train.py must say: keyword -> value).
CONFIGS: Dict[str, tuple] = {
    "local-bf16": ({"model.transformer_impl": "local", "objective.variable_length_prob": 0.0}, None,
                   {"use_transformer_engine": False, "variable_length_prob": 0.0}),
    "local-bf16-again": ({"model.transformer_impl": "local", "objective.variable_length_prob": 0.0}, None,
                         {"use_transformer_engine": False}),
    "te-bf16": (TE, "local-bf16", {"use_transformer_engine": True, "fp8": None, "variable_length_prob": 0.0}),
    "te-fp8-delayed": ({**FP8, "precision.fp8_recipe": "delayed"}, "local-bf16",
                       {"use_transformer_engine": True, "fp8": "hybrid", "fp8_recipe": "delayed"}),
    "te-fp8-tensorwise": ({**FP8, "precision.fp8_recipe": "tensorwise"}, "local-bf16",
                          {"use_transformer_engine": True, "fp8": "hybrid", "fp8_recipe": "tensorwise"}),
    "te-fp8-blockwise": ({**FP8, "precision.fp8_recipe": "blockwise"}, "local-bf16",
                         {"use_transformer_engine": True, "fp8": "hybrid", "fp8_recipe": "blockwise"}),
    "te-recompute-selective": ({**TE, "recompute.granularity": "selective", "recompute.modules": ["core_attn", "mlp"]},
                               "local-bf16", {"use_transformer_engine": True, "recompute_granularity": "selective",
                                              "recompute_modules": ["core_attn", "mlp"]}),
    "te-recompute-full": ({**TE, "recompute.granularity": "full", "recompute.method": "uniform",
                           "recompute.num_layers": 1}, "local-bf16",
                          {"use_transformer_engine": True, "recompute_granularity": "full",
                           "recompute_method": "uniform", "recompute_num_layers": 1}),
    "local-varlen": ({"model.transformer_impl": "local", "objective.variable_length_prob": 0.5}, None,
                     {"use_transformer_engine": False, "variable_length_prob": 0.5}),
    "te-varlen": ({**TE, "objective.variable_length_prob": 0.5}, "local-varlen",
                  {"use_transformer_engine": True, "variable_length_prob": 0.5}),
    "te-resume": ({**TE, "checkpoint.save_interval": 20}, "te-bf16",
                  {"use_transformer_engine": True, "save_interval": 20}),
    # MegaDLMs' objective (specs/megadlms-1.7b-mdm.toml): t ~ U(0, 1) with one forced mask, the
    # realised-ratio weight, one cut per micro-batch, the loss normalised per micro-batch (two
    # micro-batches of 16 per step, so the normalisation matters); the cut probability 0.5 (the
    # recipe's 0.01 would cut no step of 40).
    "local-varlen-microbatch": ({**LOCAL, **MEGADLMS}, None, {"use_transformer_engine": False, **MEGADLMS_FLAGS}),
    "te-varlen-microbatch": ({**TE, **MEGADLMS}, "local-varlen-microbatch",
                             {"use_transformer_engine": True, **MEGADLMS_FLAGS}),
    # the same with MegaDLMs' 2,049-token window (objective.unshift), on both layer paths
    "local-megadlms-window": ({**LOCAL, **MEGADLMS, "objective.unshift": True}, None,
                              {"use_transformer_engine": False, **MEGADLMS_FLAGS, "unshift": True}),
    "te-megadlms-window": ({**TE, **MEGADLMS, "objective.unshift": True}, "local-megadlms-window",
                           {"use_transformer_engine": True, **MEGADLMS_FLAGS, "unshift": True}),
    # A small MoE (4 experts of 1024, top-2, every layer): grouped GEMM on TE (TEGroupedMLP), the
    # experts one by one on the local layers (validate refuses grouped GEMM there:
    # grouped-GEMM experts need TE). Both start from the same Hugging Face Qwen3-MoE weights
    # (make_hf("moe")): from random weights the two expert modules would differ (TEGroupedMLP draws
    # every expert's fc1, then fc2; SequentialMLP expert by expert).
    "local-moe": ({**LOCAL, **MOE, "model.moe_grouped_gemm": False, "checkpoint.init_from": "hf:" + HF_DIR + "/moe"},
                  None, {"use_transformer_engine": False, **MOE_FLAGS, "moe_grouped_gemm": False,
                         "init_from": "hf:" + HF_DIR + "/moe"}),
    "te-moe": ({**TE, **MOE, "model.moe_grouped_gemm": True, "checkpoint.init_from": "hf:" + HF_DIR + "/moe"},
               "local-moe", {"use_transformer_engine": True, **MOE_FLAGS, "moe_grouped_gemm": True,
                             "init_from": "hf:" + HF_DIR + "/moe"}),
    # An earlier GPU run: te-moe's curve left local-moe's by up to 7% at one step (step 1 agreed to 1e-5).
    # The same local command run twice is the MoE noise floor; TE's layers with the experts one by one
    # (TE's SequentialMLP) separate grouped GEMM from the rest of the TE path.
    "local-moe-again": ({**LOCAL, **MOE, "model.moe_grouped_gemm": False, "checkpoint.init_from": "hf:" + HF_DIR + "/moe"},
                        "local-moe", {"use_transformer_engine": False, **MOE_FLAGS, "moe_grouped_gemm": False}),
    "te-moe-sequential": ({**TE, **MOE, "model.moe_grouped_gemm": False, "checkpoint.init_from": "hf:" + HF_DIR + "/moe"},
                          "local-moe", {"use_transformer_engine": True, **MOE_FLAGS, "moe_grouped_gemm": False}),
    # checkpoint.init_from a Hugging Face Qwen3 of the demo's shape (make_hf("dense"), random
    # weights made on the spot with save_pretrained): the first losses are that model's, on both paths.
    "local-init-from-hf": ({**LOCAL, "checkpoint.init_from": "hf:" + HF_DIR + "/dense"}, None,
                           {"use_transformer_engine": False, "init_from": "hf:" + HF_DIR + "/dense"}),
    "te-init-from-hf": ({**TE, "checkpoint.init_from": "hf:" + HF_DIR + "/dense"}, "local-init-from-hf",
                        {"use_transformer_engine": True, "init_from": "hf:" + HF_DIR + "/dense"}),
    # local-bf16 on megatron-core 0.19.2 (MC19_SITE first on PYTHONPATH), against 0.16.1's.
    "mc19-local-bf16": (LOCAL, "local-bf16", {"use_transformer_engine": False, "variable_length_prob": 0.0}),
    # the Qwen3-1.7B architecture at sequence 4096 (mock data), local layers, on 0.16.1 and on 0.19.2:
    # the issue's "the Qwen3-1.7B spec trains on 0.19.2 as on 0.16.1"
    "local-qwen3": ({**LOCAL, **QWEN3}, None, {"use_transformer_engine": False, **QWEN3_FLAGS}),
    "mc19-local-qwen3": ({**LOCAL, **QWEN3}, "local-qwen3", {"use_transformer_engine": False, **QWEN3_FLAGS}),
}
RESUME_AT = 20
#: Rows whose launch runs on megatron-core 0.19.2 (installed from ``.whl/mc19`` into MC19_SITE).
MC19_ROWS = ("mc19-local-bf16", "mc19-local-qwen3")
MC19_SITE = Path("/tmp/site19")
#: Rows that start from a Hugging Face checkpoint: name -> its :func:`make_hf` kind.
HF_ROWS = {"local-moe": "moe", "te-moe": "moe", "local-moe-again": "moe", "te-moe-sequential": "moe",
           "local-init-from-hf": "dense", "te-init-from-hf": "dense"}

#: bf16 keeps 8 significant bits: 5 units of its rounding (bench/throughput/loss_agreement.py).
BF16_RTOL = 5 * 2.0 ** -8
#: fp8 (e4m3) GEMM inputs keep 4 significant bits against bf16's 8: 4x the bf16 tolerance, set
#: before any fp8 run was measured.
FP8_RTOL = 4 * BF16_RTOL
CRITERION = (f"the first {STEPS} losses agree with the reference run's (same seed) when every relative difference "
             "|a - b| / max(|a|, |b|) is at most max(rtol, noise floor); noise floor = the largest relative "
             "difference between local-bf16 and local-bf16-again (the same command run twice); rtol = "
             f"{BF16_RTOL:.4g} (5 bf16 units) for bf16 runs and {FP8_RTOL:.4g} (4x that) for fp8 runs. te-resume "
             f"compares steps {RESUME_AT + 1}..{STEPS} (after the resume) with te-bf16.")


def overrides(name: str) -> List[str]:
    """The ``--set`` strings of a configuration (TOML values)."""
    run = f"runs/te/{name}"
    sets = {**COMMON, **CONFIGS[name][0], "logging.run_dir": run, "logging.tensorboard_dir": f"{run}/tensorboard",
            "checkpoint.save": f"{run}/checkpoints"}
    return [f"{k}={json.dumps(v)}" for k, v in sets.items()]


def compile_config(name: str, dest: Path) -> tuple[int, str]:
    """``dlmspec compile`` of one configuration into ``dest/name`` (in this process); (exit code, output)."""
    return compile_in_process(SPEC, dest / name, overrides(name))


def check_flags(name: str, text: str) -> List[str]:
    """What the configuration's train.py says wrongly: ``["keyword: want X, got Y", ...]`` ([] = right).
    A keyword wanted as ``None`` must be absent (e.g. no ``fp8`` without fp8)."""
    return flags_wrong(CONFIGS[name][2], text)


#: megatron-core 0.19.2's config fields, read from its wheel by bench/gpu/mcore_fields.py (committed).
MC19_FIELDS = ROOT / "bench" / "results" / "mcore_0.19.2_fields.json"
#: The megatron-core config classes train.py builds with keywords.
MCORE_CLASSES = ("TransformerConfig", "DistributedDataParallelConfig", "OptimizerConfig")


def mc19_unknown_keywords(text: str, record: Path = MC19_FIELDS) -> Optional[List[str]]:
    """The keywords a train.py passes to megatron-core's config classes (``TransformerConfig``, with
    ``**PARALLEL_SIZES`` expanded; ``DistributedDataParallelConfig``; ``OptimizerConfig``) that are no
    field of those classes in megatron-core 0.19.2 (``record``): ``["Class.keyword", ...]``
    ([] = all known; ``None`` when the record is absent)."""
    try:
        fields = json.loads(record.read_text())["classes"]
    except (OSError, ValueError, KeyError):
        return None
    tree = ast.parse(text)
    sizes = [n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
             and getattr(n.targets[0], "id", None) == "PARALLEL_SIZES"]
    unknown = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in MCORE_CLASSES:
            cls = node.func.id
            for kw in node.keywords:
                names = [kw.arg] if kw.arg else [s.arg for v in sizes for s in v.keywords]
                unknown += [f"{cls}.{k}" for k in names if k not in fields.get(cls, [])]
    return sorted(set(unknown))


def build_objects(train_py: Path) -> Optional[str]:
    """Run the compiled file's ``build_configs()`` and ``build_run()`` (megatron-core's config checks,
    no CUDA); ``None`` when both build, else the error."""
    try:
        call_train_py(train_py, f"te_matrix_{train_py.parent.name.replace('-', '_')}", "build_configs", "build_run")
    except Exception as exc:  # reported, not raised: the matrix goes on
        return f"{type(exc).__name__}: {exc}"
    return None


def spec_model() -> Dict[str, Any]:
    """The ``[model]`` table of :data:`SPEC` (the demo's architecture)."""
    import tomllib

    return tomllib.loads((ROOT / SPEC).read_text())["model"]


def hf_config_kwargs(kind: str) -> tuple[str, Dict[str, Any]]:
    """``(transformers model_type, config keys)`` of a Hugging Face model of the demo's shape
    (:data:`SPEC`'s ``[model]``: RMSNorm, SwiGLU and qk-norm make it a Qwen3): ``"dense"`` is a
    ``qwen3``; ``"moe"`` a ``qwen3_moe`` with :data:`MOE`'s experts in every layer (top-k
    probabilities renormalised, as megatron-core's softmax over the chosen experts).

    Raises:
        KeyError: ``kind`` is neither.
    """
    m = spec_model()
    base = dict(vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
                num_hidden_layers=m["num_layers"], num_attention_heads=m["num_attention_heads"],
                num_key_value_heads=m.get("num_query_groups", m["num_attention_heads"]),
                head_dim=m.get("kv_channels", m["hidden_size"] // m["num_attention_heads"]),
                max_position_embeddings=m["max_position_embeddings"], rope_theta=float(m.get("rotary_base", 10000)),
                rms_norm_eps=float(m.get("layernorm_epsilon", 1e-5)),
                tie_word_embeddings=not m.get("untie_embeddings_and_output_weights", False),
                attention_bias=False)
    if kind == "dense":
        return "qwen3", base
    if kind == "moe":
        return "qwen3_moe", {**base, "num_experts": MOE["model.num_experts"],
                             "num_experts_per_tok": MOE["model.moe_router_topk"],
                             "moe_intermediate_size": MOE["model.moe_ffn_hidden_size"], "norm_topk_prob": True,
                             "decoder_sparse_step": 1, "mlp_only_layers": []}
    raise KeyError(f"unknown Hugging Face model kind {kind!r}: 'dense' or 'moe'")


#: The seed of the Hugging Face models' random weights.
HF_SEED = 1234


def make_hf(kind: str, path: Path, *, weights: bool = True) -> Dict[str, Any]:
    """Write a Hugging Face checkpoint of the demo's shape (:func:`hf_config_kwargs`) to ``path``:
    ``config.json`` only when ``weights`` is false (``--dry``: enough for the dimension check),
    else also random bf16 weights (``transformers``' own initialisation, seed :data:`HF_SEED`)
    with ``save_pretrained`` (about 0.3 GB dense, 0.4 GB MoE). Returns what was written and its seconds."""
    import shutil

    from transformers import AutoConfig

    t0 = time.time()
    model_type, kwargs = hf_config_kwargs(kind)
    shutil.rmtree(path, ignore_errors=True)
    config = AutoConfig.for_model(model_type, **kwargs)
    if not weights:
        config.save_pretrained(path)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(HF_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(path)
        del model
    return {"kind": kind, "path": str(path), "model_type": model_type, "config": kwargs, "weights": weights,
            "seed": HF_SEED if weights else None, "seconds": round(time.time() - t0, 1)}


def init_check(train_py: Path, hf_path: Path) -> Dict[str, Any]:
    """Check a Hugging Face folder against a compiled configuration's model, as the runtime does before
    it converts (``backends/megatron/init_from.py``: ``hf_dims``, ``check_dims``; CPU, no weights read).
    Returns ``{"error": None or the mismatch, "warnings": [...]}``."""
    try:
        config, model_kwargs = call_train_py(train_py, f"te_matrix_init_{train_py.parent.name.replace('-', '_')}",
                                             "build_configs")[0][:2]
        from dlmspec.backends.megatron.init_from import check_dims, hf_dims

        dims = hf_dims(str(hf_path), padded_vocab_size=model_kwargs["vocab_size"])
        return {"error": None, "warnings": check_dims(dims, config, model_kwargs)}
    except Exception as exc:  # reported, not raised: the matrix goes on
        return {"error": f"{type(exc).__name__}: {exc}", "warnings": []}


def install_mc19(wheel_dir: Optional[Path] = None, site: Optional[Path] = None) -> Dict[str, Any]:
    """Install the megatron-core wheel of ``wheel_dir`` (default ``.whl/mc19``) into ``site`` (default
    :data:`MC19_SITE`, emptied first) without its dependencies (``pip install --no-deps --no-index
    --target``; where pip cannot, the wheel's files unzipped), and ask that site which version imports.

    Returns:
        ``installed`` (a 0.19 version imports from ``site``), ``not_run`` ("no wheel" when there is
        none), ``wheel``, ``wheel_bytes``, ``install`` (the command), ``megatron_core`` (what the
        import printed: version and file, or its error) and ``env`` (the PYTHONPATH the rows get).
    """
    import shutil
    import zipfile

    wheel_dir = wheel_dir or ROOT / ".whl" / "mc19"
    site = site or MC19_SITE
    wheels = sorted(wheel_dir.glob("megatron_core-*.whl"))
    if not wheels:
        return {"installed": False, "not_run": "no wheel", "wheel_dir": str(wheel_dir)}
    wheel = wheels[-1]
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    how = shlex.join(cmd)
    if r.returncode != 0:  # a wheel is a zip of its importable files
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        how = f"unzip {wheel} -d {site} (pip failed: {(r.stderr or r.stdout).strip()[-300:]})"
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}
    v = subprocess.run([sys.executable, "-c", "import megatron.core as m; print(m.__version__, m.__file__)"],
                       env={**os.environ, **env}, capture_output=True, text=True)
    got = v.stdout.strip() or (v.stderr.strip()[-500:])
    ok = v.returncode == 0 and got.startswith("0.19") and str(site) in got
    return {"installed": ok, "not_run": None if ok else f"megatron-core 0.19 does not import from {site}",
            "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size, "install": how, "megatron_core": got, "env": env}


def start_record(name: str) -> Optional[Dict[str, Any]]:
    """What the run's last ``start`` record says about its layers and weights (``layer_spec``,
    ``attention``, ``weights``, ``provenance``), or ``None``."""
    rec = common.last(common.read_metrics(RUNS / name), "start")
    if rec is None:
        return None
    return {k: rec.get(k) for k in ("layer_spec", "attention", "weights", "provenance")}


def find_key(tree: Any, key: str) -> Any:
    """The first value of ``key`` in nested dicts / lists (depth first), or ``None``."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            found = find_key(item, key)
            if found is not None:
                return found
    return None


def agreement(a: Dict[int, float], b: Dict[int, float], *, rtol: float, floor: float = 0.0,
              first: int = 1, last: int = STEPS) -> Dict[str, Any]:
    """Compare two ``{iteration: loss}`` curves over iterations ``first..last``.

    Returns:
        ``compared`` (iterations in both), ``missing`` (in ``first..last`` but not in both),
        ``max_abs_diff``, ``max_rel_diff`` (``|a - b| / max(|a|, |b|)``), ``worst_iteration``,
        ``tolerance`` (``max(rtol, floor)``), ``finite`` and ``agree`` (complete, finite, within it).
    """
    steps = range(first, last + 1)
    both = [i for i in steps if i in a and i in b]
    finite = all(math.isfinite(a[i]) and math.isfinite(b[i]) for i in both)
    abs_d = {i: abs(a[i] - b[i]) for i in both}
    rel_d = {i: abs_d[i] / max(abs(a[i]), abs(b[i]), 1e-30) for i in both}
    worst = max(rel_d, key=rel_d.get) if rel_d else None
    tol = max(rtol, floor)
    return {"compared": len(both), "missing": [i for i in steps if i not in both],
            "max_abs_diff": max(abs_d.values()) if abs_d else None,
            "max_rel_diff": rel_d[worst] if worst is not None else None, "worst_iteration": worst,
            "tolerance": tol, "finite": finite,
            "agree": bool(both) and len(both) == len(steps) and finite and rel_d[worst] <= tol}


def metric(name: str, key: str = "loss") -> Dict[int, float]:
    """The run's ``{iteration: key}`` of its train records (runs/te/NAME/metrics.jsonl; {} when
    there is none; a resumed run's last record per iteration)."""
    from loss_agreement import MetricsError, read_losses

    try:
        return read_losses(RUNS / name / "metrics.jsonl", key=key)
    except MetricsError:
        return {}


def losses(name: str) -> Dict[int, float]:
    """The run's ``{iteration: loss}`` (:func:`metric`)."""
    return metric(name)


def reused_curve(row: Dict[str, Any]) -> Dict[int, float]:
    """``{iteration: loss}`` of a ``--reuse``d row's earlier record (its ``losses``, as written to
    ``NAME.json``); ``{}`` for a row not reused. A row run on another machine (a committed record)
    has no run directory here, so its curve comes from the record."""
    record = (row.get("reused") or {}).get("record") or {}
    return {int(i): float(v) for i, v in (record.get("losses") or {}).items()}


class Lanes:
    """Launches of compiled configurations, at most ``width`` at once, each killed (with its process
    group) at the deadline."""

    def __init__(self, dest: Path, out: Path, deadline: float, width: int,
                 envs: Optional[Dict[str, Dict[str, str]]] = None) -> None:
        self.dest, self.out, self.deadline, self.width = dest, out, deadline, width
        self.envs = envs or {}  # name -> environment variables its launches get (mc19: PYTHONPATH)
        self.running: Dict[str, tuple] = {}
        self.done: Dict[str, Dict[str, Any]] = {}

    def start(self, name: str, tag: str = "") -> subprocess.Popen:
        log = open(self.out / f"{name}{tag}.log", "w")
        path = self.dest / name / "launch.sh"
        cmd = ["bash", str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)]
        extra = self.envs.get(name, {})
        if extra:
            cmd = ["env"] + [f"{k}={v}" for k, v in extra.items()] + cmd
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.running[name + tag] = (proc, time.time(), log, cmd)
        return proc

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a launch's process group and every process below it (:func:`kill_tree`)."""
        kill_tree(self.running[key][0].pid, sig)

    def poll(self) -> None:
        for key, (proc, t0, log, cmd) in list(self.running.items()):
            if proc.poll() is None and time.time() > self.deadline:
                self.kill(key)
                proc.wait()
            if proc.poll() is not None:
                log.close()
                self.done[key] = {"exit": proc.returncode, "wall_s": round(time.time() - t0, 1), "command": shlex.join(cmd),
                                  "killed_at_deadline": time.time() > self.deadline}
                del self.running[key]

    def wait_slot(self) -> None:
        while len(self.running) >= self.width:
            self.poll()
            time.sleep(0.5)


class Resume:
    """The resume check, stepped by the launch loop: launch ``te-resume``, SIGKILL it (its process
    group) once ``latest`` names step 20's checkpoint, then launch it again to the end."""

    def __init__(self, lanes: Lanes, name: str = "te-resume") -> None:
        self.lanes, self.name, self.phase = lanes, name, 0
        self.latest = RUNS / name / "checkpoints" / "latest"
        self.info: Dict[str, Any] = {"killed_after": None, "launch1_last_iteration": None}

    def step(self) -> bool:
        """Advance; True while the check is not finished."""
        key1, key2 = self.name + ".launch1", self.name + ".launch2"
        if self.phase == 0:
            self.lanes.start(self.name, ".launch1")
            self.phase = 1
        elif self.phase == 1:
            if key1 in self.lanes.running:
                if self.latest.is_file() and self.latest.read_text().strip() == f"iter_{RESUME_AT:07d}":
                    self.info["killed_after"] = self.latest.read_text().strip()
                    self.lanes.kill(key1)
            else:
                first = losses(self.name)
                self.info["launch1_last_iteration"] = max(first) if first else None
                if time.time() < self.lanes.deadline:
                    self.lanes.start(self.name, ".launch2")
                self.phase = 2
        elif self.phase == 2 and key2 not in self.lanes.running:
            self.phase = 3
        return self.phase < 3


def run_matrix(results: Dict[str, Dict[str, Any]], dest: Path, out: Path, *, deadline: float, width: int,
               envs: Optional[Dict[str, Dict[str, str]]] = None) -> float:
    """Launch every compiled configuration of ``results`` (``dest/NAME/launch.sh``, from the
    repository root; ``envs[NAME]`` added to its environment) except those marked ``not_run``,
    compare the losses, write ``out/NAME.json``; the rows of ``results`` get ``launches``,
    ``losses``, ``agreement``, ``first_step`` (iteration 1 alone), ``start`` (the start record's
    layers and weights) (and ``resume``, ``layer_modules``). Returns the noise floor."""
    runnable = [n for n in results if results[n]["compile_exit"] == 0 and not results[n].get("not_run")]
    lanes = Lanes(dest, out, deadline, width, envs)
    for n in runnable:
        if not results[n].get("reused"):
            subprocess.run(["rm", "-rf", str(RUNS / n)], check=False)
    order = [n for n in runnable if n != "te-resume" and not results[n].get("reused")]
    if order:  # the first builds megatron-core's index cache beside the data; the others once it trains
        lanes.start(order[0])
        metrics = RUNS / order[0] / "metrics.jsonl"
        while order[0] in lanes.running and not (metrics.is_file() and '"train"' in metrics.read_text()):
            lanes.poll()
            time.sleep(0.5)
    resume = Resume(lanes) if "te-resume" in runnable else None
    if resume:
        lanes.width += 1  # the resume's two launches hold a lane of their own
    pending = order[1:]
    while pending or lanes.running or (resume and resume.phase < 3):
        lanes.poll()
        if resume and resume.phase < 3:
            resume.step()
        if pending and time.time() >= deadline:  # not started: recorded with no launches
            for n in pending:
                results[n]["skipped_at_deadline"] = True
            pending = []
        if pending and len(lanes.running) < lanes.width:
            lanes.start(pending.pop(0))
        time.sleep(0.3)
    resume_info = resume.info if resume else None

    # a reused row's curve is its earlier record's when its run directory is not on this machine
    curves = {n: losses(n) or reused_curve(results[n]) for n in runnable}
    floor = 0.0
    if "local-bf16" in curves and "local-bf16-again" in curves:
        noise = agreement(curves["local-bf16"], curves["local-bf16-again"], rtol=BF16_RTOL)
        floor = noise["max_rel_diff"] or 0.0
        results["local-bf16-again"]["noise_floor"] = noise
    for n in runnable:
        row = results[n]
        if row.get("reused"):  # launched by an earlier invocation (--reuse): its curve, not relaunched
            row["launches"] = row["reused"]["launches"]
        else:
            row["launches"] = {key: v for key, v in lanes.done.items() if key.split(".launch")[0] == n}
        row["losses"] = {str(i): v for i, v in sorted(curves[n].items())}
        earlier = (row.get("reused") or {}).get("record") if not losses(n) else None
        if earlier is not None:  # run elsewhere (--reuse of a committed record): its measurements as recorded
            for key in ("memory_gib", "median_step_time_s", "start"):
                row[key] = earlier.get(key)
        else:
            row["memory_gib"] = {k: max(metric(n, k).values(), default=None) for k in ("peak_mem_gib", "peak_reserved_gib")}
            times = sorted(v for i, v in metric(n, "step_time_s").items() if i > 10)
            row["median_step_time_s"] = times[len(times) // 2] if times else None  # lanes share the GPU: not a speed
            row["start"] = start_record(n)
        row["megatron_core"] = find_key((row["start"] or {}).get("provenance"), "megatron_core")
        c = curves[n]
        row["trains"] = (bool(c) and 1 in c and max(c) > 1 and math.isfinite(c[max(c)])
                         and c[max(c)] < c[1])  # the last loss logged below the first
        ref = CONFIGS[n][1] if n in CONFIGS else None
        if ref and ref in curves:
            fp8 = CONFIGS[n][0].get("precision.fp8", "none") != "none"
            first = RESUME_AT + 1 if n == "te-resume" else 1
            rtol = FP8_RTOL if fp8 else BF16_RTOL
            row["agreement"] = {"against": ref, "rtol": rtol, "noise_floor": floor,
                                **agreement(curves[n], curves[ref], rtol=rtol, floor=floor, first=first)}
            if n != "te-resume":
                row["first_step"] = agreement(curves[n], curves[ref], rtol=rtol, floor=floor, first=1, last=1)
        if n == "te-resume":
            row["resume"] = resume_info
        if n == "te-bf16":
            row["layer_modules"] = layer_modules(dest / n / "train.py")
        subprocess.run(["rm", "-rf", str(RUNS / n / "checkpoints")], check=False)
        written = {**row, "reused": {k: v for k, v in row["reused"].items() if k != "record"}} if row.get("reused") else row
        (out / f"{n}.json").write_text(json.dumps(written, indent=1) + "\n")
    return floor


def rescore(folder: Path) -> List[str]:
    """Compare again, from the records alone, each ``folder/NAME.json`` whose reference's record
    (``CONFIGS[NAME][1]``) is in ``folder`` too: ``agreement`` and ``first_step`` as :func:`run_matrix`
    computes them (the noise floor of ``local-bf16-again.json`` when present, else 0), written back
    into ``NAME.json`` with ``"rescored": true``. For rows whose reference ran in another invocation
    (e.g. a ``--reuse`` whose curve did not reach the comparison). Returns the rows rescored.
    te-resume is left as it is (its comparison starts after the resume)."""
    rows = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.stem in CONFIGS}
    curve = {n: {int(i): float(v) for i, v in (r.get("losses") or {}).items()} for n, r in rows.items()}
    noise = (rows.get("local-bf16-again") or {}).get("noise_floor") or {}
    floor = noise.get("max_rel_diff") or 0.0
    done = []
    for n, row in rows.items():
        ref = CONFIGS[n][1]
        if n == "te-resume" or not ref or ref not in rows:
            continue
        rtol = FP8_RTOL if CONFIGS[n][0].get("precision.fp8", "none") != "none" else BF16_RTOL
        row["agreement"] = {"against": ref, "rtol": rtol, "noise_floor": floor,
                            **agreement(curve[n], curve[ref], rtol=rtol, floor=floor)}
        row["first_step"] = agreement(curve[n], curve[ref], rtol=rtol, floor=floor, first=1, last=1)
        row["rescored"] = True
        (folder / f"{n}.json").write_text(json.dumps(row, indent=1) + "\n")
        done.append(n)
    return done


def layer_modules(train_py: Path) -> Dict[str, Any]:
    """The TE layer spec's modules (TE's fused layer-norm + linear, the key-padding attention)."""
    spec = importlib.util.spec_from_file_location("te_matrix_layers", train_py)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        layer = module.build_layer()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    attn = layer.submodules.self_attention.submodules

    def name(m: Any) -> str:
        m = getattr(m, "module", m)
        return getattr(m, "__name__", type(m).__name__)

    return {"linear_qkv": name(attn.linear_qkv), "input_layernorm": name(layer.submodules.input_layernorm),
            "core_attention": name(attn.core_attention), "linear_fc1": name(layer.submodules.mlp.submodules.linear_fc1),
            "pre_mlp_layernorm": name(layer.submodules.pre_mlp_layernorm),
            "fused_layernorm_linear": name(attn.linear_qkv) == "TELayerNormColumnParallelLinear"
            and name(layer.submodules.input_layernorm) == "IdentityOp"}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="results folder ($OUT); not with --dry")
    p.add_argument("--dry", action="store_true", help="compile and check only (CPU)")
    p.add_argument("--dest", default=".device/te", help="compiled configurations (default .device/te)")
    p.add_argument("--only", default=None, help="comma-separated configuration names")
    p.add_argument("--rescore", metavar="DIR", default=None,
                   help="compare again each DIR/NAME.json with its reference's DIR/REF.json (no launch)")
    p.add_argument("--budget-s", type=float, default=450, help="kill every launch after this many seconds")
    p.add_argument("--lanes", type=int, default=4, help="launches at once on the GPU")
    p.add_argument("--reuse", default=None, metavar="DIR:A,B",
                   help="rows an earlier invocation ran (their runs/te/NAME and DIR/NAME.json are kept): "
                   "references for this one's rows, not launched again")
    p.add_argument("--no-data", action="store_true", help="--dry without making the demo's data (.data)")
    p.add_argument("--mc19-site", default=str(MC19_SITE),
                   help=f"where the mc19 rows' megatron-core 0.19.2 is installed (emptied first; default {MC19_SITE})")
    args = p.parse_args(argv)
    if args.rescore:
        done = rescore(Path(args.rescore))
        for n in done:
            a = json.loads((Path(args.rescore) / f"{n}.json").read_text())["agreement"]
            print(f"{n} against {a['against']}: compared {a['compared']}, max relative difference "
                  f"{a['max_rel_diff']}, agree {a['agree']}")
        return 0 if done else 1
    if not args.dry and not args.out:
        p.error("give OUT (the results folder), or --dry")
    names = list(CONFIGS) if not args.only else [n for n in args.only.split(",") if n]
    reuse_dir, reused = None, []
    if args.reuse:
        reuse_dir, _, listed = args.reuse.rpartition(":")
        reused = [n for n in listed.split(",") if n]
        if not reuse_dir:
            p.error("--reuse: give DIR:A,B (DIR holds the earlier invocation's NAME.json)")
        names += [n for n in reused if n not in names]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"--only: unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    t_start = time.time()
    os.chdir(ROOT)
    dest = (ROOT / args.dest).resolve()
    out = Path(args.out).resolve() if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    if not args.no_data and not (ROOT / ".data" / "demo-train_text_document.bin").is_file():
        try:
            from prepare import demo_inputs

            for line in demo_inputs():
                print(line)
        except SystemExit as exc:
            print(f"te_matrix: the demo's data is missing and cannot be made here ({exc}); carry .data", file=sys.stderr)
            return 1
    # the Hugging Face checkpoints of the init_from rows, made on the spot (--dry: config.json only)
    hf_made = {kind: make_hf(kind, ROOT / HF_DIR / kind, weights=not args.dry)
               for kind in sorted({HF_ROWS[n] for n in names if n in HF_ROWS})}
    for kind, made in hf_made.items():
        print(f"Hugging Face {made['model_type']} ({kind}) written to {made['path']} in {made['seconds']} s"
              + ("" if made["weights"] else " (config.json only)"), flush=True)
    results: Dict[str, Dict[str, Any]] = {}
    for name in names:
        code, text = compile_config(name, dest)
        row: Dict[str, Any] = {"config": name, "spec": SPEC, "overrides": overrides(name),
                               "reference": CONFIGS[name][1], "compile_exit": code}
        if code != 0:
            row["compile_output"] = text[-4000:]
        else:
            train_py = dest / name / "train.py"
            row["flags_wrong"] = check_flags(name, train_py.read_text())
            row["mc19_unknown_keywords"] = mc19_unknown_keywords(train_py.read_text())
            row["build_error"] = build_objects(train_py)
            if name in HF_ROWS:
                row["hf_model"] = hf_made[HF_ROWS[name]]
                row["init_check"] = init_check(train_py, ROOT / HF_DIR / HF_ROWS[name])
        results[name] = row
        state = "compiled" if code == 0 else f"refused (exit {code})"
        init_error = (row.get("init_check") or {}).get("error")
        print(f"{name}: {state}" + (f"; flags wrong: {row.get('flags_wrong')}" if row.get("flags_wrong") else "")
              + (f"; build: {row['build_error']}" if row.get("build_error") else "")
              + (f"; init_from: {init_error}" if init_error else "")
              + (f"; not in megatron-core 0.19.2: {row['mc19_unknown_keywords']}" if row.get("mc19_unknown_keywords")
                 else ""), flush=True)
    # a row run on 0.19.2 passes only keywords 0.19.2 has (the others are told, and run on 0.16.1)
    ok = all(r["compile_exit"] == 0 and not r.get("flags_wrong") and not r.get("build_error")
             and not (r.get("init_check") or {}).get("error")
             and not (n in MC19_ROWS and r.get("mc19_unknown_keywords")) for n, r in results.items())
    for n in reused:  # not compiled again to run: the earlier invocation's record says how it ran
        try:
            earlier = json.loads((Path(reuse_dir) / f"{n}.json").read_text())
        except (OSError, ValueError) as exc:
            if args.dry:
                continue
            print(f"te_matrix: --reuse {n}: no earlier record in {reuse_dir} ({exc})", file=sys.stderr)
            return 1
        results[n]["reused"] = {"from": str(Path(reuse_dir) / f"{n}.json"), "launches": earlier.get("launches", {}),
                                "record": {k: earlier.get(k) for k in ("losses", "memory_gib", "median_step_time_s", "start")}}
    mc19_rows = [n for n in names if n in MC19_ROWS and n not in reused]
    if args.dry:
        if mc19_rows:
            wheels = sorted((ROOT / ".whl" / "mc19").glob("megatron_core-*.whl"))
            print(f"{', '.join(mc19_rows)}: megatron-core wheel "
                  + (f"{wheels[-1].name} ({wheels[-1].stat().st_size} bytes)" if wheels
                     else "absent from .whl/mc19 (the row will be recorded as not run: no wheel)"))
        print(f"te_matrix --dry: {len(results)} configuration(s) {'all right' if ok else 'NOT all right'} "
              f"({time.time() - t_start:.1f}s)")
        return 0 if ok else 1

    mc19 = install_mc19(site=Path(args.mc19_site)) if mc19_rows else None
    envs: Dict[str, Dict[str, str]] = {}
    for n in mc19_rows:
        results[n]["mc19"] = mc19
        if mc19["installed"]:
            envs[n] = mc19["env"]
        else:
            results[n]["not_run"] = mc19["not_run"]
            (out / f"{n}.json").write_text(json.dumps(results[n], indent=1) + "\n")
    run_matrix(results, dest, out, deadline=t_start + args.budget_s, width=args.lanes, envs=envs)
    subprocess.run(["rm", "-rf", str(ROOT / HF_DIR)], check=False)  # 0.7 GB of random weights
    wheel = sorted((ROOT / ".whl" / "mc19").glob("megatron_core-*.whl"))
    if wheel:
        subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "mcore_fields.py"), str(wheel[-1]),
                        str(out / "mcore_fields.json")], check=False)
    summary = {
        "benchmark": "the compiled demo (specs/demo-dlm.toml) on the Transformer Engine path, "
                     f"{STEPS} steps per configuration, against the local-path bf16 loss of the same seed",
        "command": "bash bench/devbox/gpu/te_matrix.sh $OUT  (python3 bench/gpu/te_matrix.py $OUT --budget-s "
                   f"{args.budget_s:g} --lanes {args.lanes})",
        "date": time.strftime("%Y-%m-%d"), "versions": versions(), "criterion": CRITERION,
        "noise_floor": results.get("local-bf16-again", {}).get("noise_floor", {}).get("max_rel_diff"),
        "wall_s": round(time.time() - t_start, 1),
        "hf_models": hf_made, "mc19": mc19,
        "configs": {n: {"compile_exit": r["compile_exit"], "flags_wrong": r.get("flags_wrong"),
                        "not_run": r.get("not_run"),
                        "exits": {k: v["exit"] for k, v in r.get("launches", {}).items()},
                        "launch_wall_s": {k: v["wall_s"] for k, v in r.get("launches", {}).items()},
                        "first_step_rel_diff": (r.get("first_step") or {}).get("max_rel_diff"),
                        "first_step_agree": (r.get("first_step") or {}).get("agree"),
                        "trains": r.get("trains"), "megatron_core": r.get("megatron_core"),
                        "reused_from": (r.get("reused") or {}).get("from"),
                        "init_check": r.get("init_check"), "mc19_unknown_keywords": r.get("mc19_unknown_keywords"),
                        "steps_logged": len(r.get("losses", {})),
                        "agreement": {k: r["agreement"][k] for k in ("against", "agree", "max_abs_diff", "max_rel_diff",
                                                                      "worst_iteration", "tolerance")}
                        if "agreement" in r else None}
                    for n, r in results.items()},
    }
    (out / "te_matrix.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["configs"], indent=1))
    ran = all(r.get("launches") and all(v["exit"] == 0 for k, v in r["launches"].items() if not k.endswith(".launch1"))
              for r in results.values() if r["compile_exit"] == 0 and not r.get("not_run"))
    return 0 if ok and ran else 1


if __name__ == "__main__":
    raise SystemExit(main())
