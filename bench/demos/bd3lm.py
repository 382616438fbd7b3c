"""Block diffusion (BD3-LM) against masked diffusion on the demo model, in one GPU run of under ten
minutes: training at equal data tokens, validation NELBO with its standard error, training tokens/s
per data token and memory, and block-by-block generation with and without the exact prefix cache.

    python bench/demos/bd3lm.py                 # one GPU, ~6 minutes (two 300-step trainings, then eval)
    python bench/demos/bd3lm.py --dry           # print the commands and the result path (CPU)
    python bench/demos/bd3lm.py --prepare-data  # CPU, once: the shared kit's corpus into .data/ (then carry it)

Steps: ``dlmspec compile`` of ``specs/demo-dlm.toml`` (MDM, on the local layers with SDPA, no cut
sequences) and ``specs/demo-bd3lm.toml`` (blocks of 16, FlexAttention) with the same data, batch,
sequence, steps and learning rate, their ``launch.sh``, then ``--evaluate`` (this script again):
both last checkpoints loaded with ``dlmspec.backends.generate.load.load_model``; the NELBO per token
of ``--eval-windows`` validation windows of ``seq_length`` tokens (MDM: ``elbo_nll``'s ``"time"``
estimator; BD3: ``bd3_nelbo``, a t per block; ``--nelbo-samples`` samples each, standard error
over samples and windows); BD3 generation of ``--gen-length`` tokens after ``--prompt-length``-token
prompts, ``--steps-per-block`` steps a block, greedy, with the cache and without (tokens/s, and
whether the tokens are equal), and MDM's sampler at the same tokens and steps for reference. The
training values are read from each run's ``metrics.jsonl`` (loss curve, ``tokens_per_s``: data
tokens, ``peak_mem_gib``); the ratio BD3 / MDM of the median tokens/s after the first 50 steps is
the target's (at least 0.9). Beside each run's measured median step time and peak memory stand its
planned ones (``planned``, from the ``plan.json`` its compile wrote, planned for the GPU measured when
the planner's catalog has it; ``measured_over_planned``). The result:
``bench/results/demos/<date>-<gpu>-bd3lm-vs-mdm.json``.

``--kernel-control`` adds a third training, MDM on FlexAttention (``mdm-flex``: the BD3 run's kernel,
no mask), so the gap splits in two ratios: ``mdm-flex / mdm`` (FlexAttention against SDPA's
cuDNN / flash kernel on the same MDM step) and ``bd3lm / mdm-flex`` (the doubled ``x_t (+) x_0`` input
and its mask on the same kernel). The compute-bound bound of the second, from the planner's FLOPs,
is ``(6 N + 6 V h r) / (12 N + 6 V h r)`` per data token (``N`` the non-embedding parameters, ``V h``
the output layer, ``r`` its share of projected rows; attention aside): about 0.56 for the demo model,
so a ratio above it is launch/overhead-bound headroom, not lost work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

ROOT = common.ROOT
SPECS = {"mdm": ROOT / "specs" / "demo-dlm.toml", "bd3lm": ROOT / "specs" / "demo-bd3lm.toml"}
#: Both runs on the local layers, whole sequences: the same layer path, so tokens/s compare.
SAME = {"mdm": ['model.transformer_impl="local"', 'model.attention_backend="sdpa"', "objective.variable_length_prob=0.0"],
        "bd3lm": [],
        "mdm-flex": ['model.transformer_impl="local"', 'model.attention_backend="flex"',
                     "objective.variable_length_prob=0.0"]}
#: Each training's spec (``mdm-flex``: the MDM demo on the BD3 run's FlexAttention kernel).
SPEC_OF = {**SPECS, "mdm-flex": SPECS["mdm"]}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, precision=None)
    p.add_argument("--train-iters", type=int, default=300)
    p.add_argument("--data-dir", default=str(ROOT / ".data"), help="holds demo-{train,valid}_text_document and gpt2/")
    p.add_argument("--mock", action="store_true", help="random tokens instead of the corpus (no data needed)")
    p.add_argument("--timeout-s", type=float, default=240, help="limit of each training launch")
    p.add_argument("--eval-windows", type=int, default=16)
    p.add_argument("--nelbo-samples", type=int, default=32)
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--gen-length", type=int, default=128)
    p.add_argument("--steps-per-block", type=int, default=16)
    p.add_argument("--gen-batch", type=int, default=8)
    p.add_argument("--evaluate", default=None, help=argparse.SUPPRESS)  # the evaluation step (a work dir)
    p.add_argument("--prepare-data", action="store_true", help="prepare .data/ from the shared kit and exit")
    p.add_argument("--kernel-control", action="store_true",
                   help="also train MDM on FlexAttention (mdm-flex): the kernel's share of the tokens/s gap")
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"), help="the offline data kit")
    return p.parse_args(argv)


def data_sets(args) -> list[str]:
    if args.mock:
        return ["data.mock=true", "data.train=[]", "data.valid=[]",
                'data.tokenizer={type="NullTokenizer", vocab_size=50256}']
    d = Path(args.data_dir).resolve()
    return [f'data.train=["{d}/demo-train_text_document"]', f'data.valid=["{d}/demo-valid_text_document"]',
            f'data.tokenizer.vocab_file="{d}/gpt2/vocab.json"', f'data.tokenizer.merge_file="{d}/gpt2/merges.txt"']


def compile_cmd(args, work: Path, kind: str) -> list[str]:
    run_dir = work / kind
    n = args.train_iters
    sets = SAME[kind] + data_sets(args) + [
        f"train.train_iters={n}", f"train.lr_warmup_iters={max(1, n // 6)}", f"train.eval_interval={n}",
        "train.eval_iters=2", "logging.log_interval=5", f"checkpoint.save_interval={n}",
        f'checkpoint.save="{run_dir}/checkpoints"', f'logging.run_dir="{run_dir}"',
        f'logging.tensorboard_dir="{run_dir}/tensorboard"', f"cluster.gpus_per_node={args.gpus}",
    ] + ([f'cluster.gpu="{args.plan_gpu}"'] if getattr(args, "plan_gpu", None) else [])
    return [args.python, "-m", "dlmspec.cli", "compile", str(SPEC_OF[kind]), "-o", str(work / f"{kind}.compiled"),
            "--force"] + [a for s in sets for a in ("--set", s)]


def trainings(args) -> list[str]:
    """The runs trained: MDM and BD3-LM, and with ``--kernel-control`` MDM on FlexAttention."""
    return list(SPECS) + (["mdm-flex"] if getattr(args, "kernel_control", False) else [])


def plan(args, work: Path, raw: list[str]):
    launch = {"DLMSPEC_PYTHON": args.python}
    steps = [(f"compile-{k}", compile_cmd(args, work, k), {}) for k in trainings(args)]
    steps += [(f"train-{k}", ["bash", str(work / f"{k}.compiled" / "launch.sh")], launch) for k in trainings(args)]
    steps.append(("evaluate", [args.python, str(Path(__file__).resolve()), *raw, "--evaluate", str(work)], {}))
    return steps


def train_values(metrics: Path) -> dict:
    """Loss curve, median data tokens/s, step time and MFU after the first 50 steps (``mfu`` with the
    step's model FLOPs per data token; ``data_mfu``, block diffusion only, with the data tokens'
    own), peak memory, validation loss."""
    rows = common.read_metrics(metrics)
    train = common.events(rows, "train")
    scored = [r for r in common.events(rows, "valid", "eval") if "loss" in r]
    valid = scored[-1]["loss"] if scored else None
    later = [r for r in train if r["iteration"] > 50] or train

    def median(key: str):
        got = [r[key] for r in later if isinstance(r.get(key), (int, float))]
        return statistics.median(got) if got else None

    return {"loss_curve": [[r["iteration"], r["loss"]] for r in train],
            "tokens_per_s_median": median("tokens_per_s"), "step_time_s_median": median("step_time_s"),
            "mfu_median": median("mfu"), "data_mfu_median": median("data_mfu"),
            "peak_mem_gib": max((r["peak_mem_gib"] for r in train), default=None),
            "peak_reserved_gib": max((r.get("peak_reserved_gib") or 0 for r in train), default=None),
            "final_loss": train[-1]["loss"] if train else None, "valid_loss_in_training": valid}


def planned_values(compiled: Path) -> dict | None:
    """The plan ``dlmspec compile`` wrote beside the run (``plan.json``, by this checkout's planner, for
    the GPU of ``cluster.gpu``): step time, data tokens/s, MFU and peak memory, to set beside the
    measured ones; ``None`` without a plan."""
    try:
        plan = json.loads((compiled / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    gib = 2 ** 30
    return {"gpu": plan["gpu"]["id"], "step_time_s": plan["time"]["step_seconds"],
            "tokens_per_s": plan["throughput"]["tokens_per_second"], "mfu": plan["mfu"],
            "peak_allocated_gib": plan["memory"]["peak_allocated_bytes"] / gib,
            "peak_gib": plan["memory"]["peak_bytes"] / gib}


def planned_vs_measured(planned: dict | None, measured: dict) -> dict | None:
    """Measured over planned: median step time, peak allocated memory (``max_memory_allocated``)."""
    if not planned:
        return None

    def ratio(a, b):
        return a / b if a and b else None

    return {"step_time": ratio(measured.get("step_time_s_median"), planned["step_time_s"]),
            "peak_allocated": ratio(measured.get("peak_mem_gib"), planned["peak_allocated_gib"])}


def plan_gpu(args) -> str | None:
    """The GPU the runs are planned for: ``--gpu``, else this machine's when the planner's catalog has
    it (``nvidia-smi``'s family), else ``None`` (the spec's ``cluster.gpu``)."""
    if args.gpu:
        return args.gpu
    from dlmspec.gpus import GPUS

    family = common.hardware(0)["gpu"]
    return family if family in GPUS else None


def throughput_ratios(values: dict) -> dict:
    """``tokens_per_s_ratio_bd3lm_over_mdm`` (the target's), and with an ``mdm-flex`` run the split
    of it: ``..._mdm_flex_over_mdm`` (the kernel) and ``..._bd3lm_over_mdm_flex`` (the doubled input on
    the same kernel); ``None`` where a run has no tokens/s."""
    tps = {k: (v or {}).get("tokens_per_s_median") for k, v in values.items() if isinstance(v, dict)}

    def ratio(a: str, b: str):
        return tps[a] / tps[b] if tps.get(a) and tps.get(b) else None

    out = {"tokens_per_s_ratio_bd3lm_over_mdm": ratio("bd3lm", "mdm")}
    if "mdm-flex" in values:
        out["tokens_per_s_ratio_mdm_flex_over_mdm"] = ratio("mdm-flex", "mdm")
        out["tokens_per_s_ratio_bd3lm_over_mdm_flex"] = ratio("bd3lm", "mdm-flex")
    return out


def validation_windows(args, seq: int, count: int):
    """``[count, seq]`` ids: consecutive windows of the validation corpus (random ids with --mock)."""
    import numpy as np
    import torch

    if args.mock:
        return torch.randint(0, 50256, (count, seq), generator=torch.Generator().manual_seed(0))
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(str(Path(args.data_dir).resolve() / "demo-valid_text_document"))
    ids, need, i = [], count * seq, 0
    while sum(len(x) for x in ids) < need and i < len(ds):
        ids.append(np.asarray(ds[i], dtype=np.int64))
        i += 1
    flat = np.concatenate(ids)[:need]
    if flat.size < need:
        raise SystemExit(f"validation corpus holds {flat.size} tokens, fewer than {need}: lower --eval-windows")
    return torch.from_numpy(flat.reshape(count, seq).copy())


def evaluate(args) -> dict:
    import torch

    from dlmspec.backends.generate.block_diffusion import bd3_forward, bd3_generate
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.likelihood import bd3_nelbo, elbo_nll
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.generate.sampler import generate

    work, out = Path(args.evaluate), {}

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    models = {k: load_model(str(work / k / "checkpoints")) for k in SPECS}
    seq = int(models["bd3lm"].record["train.seq_length"])
    block = int(models["bd3lm"].record.get("objective.block_size") or 16)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    windows = validation_windows(args, seq, args.eval_windows).to(device)
    for kind, m in models.items():
        t0 = time.perf_counter()
        g = torch.Generator(device=device).manual_seed(0)
        if kind == "bd3lm":
            res = bd3_nelbo(bd3_forward(m.model), windows, block_size=block, mask_token_id=m.mask_token_id, generator=g,
                            num_samples=args.nelbo_samples, samples_per_forward=4)
        else:
            res = elbo_nll(m.logits_fn, windows, mask_token_id=m.mask_token_id, generator=g, estimator="time",
                           num_samples=args.nelbo_samples, samples_per_forward=4)
        out[f"{kind}_validation"] = {**res.total(), "seconds": round(time.perf_counter() - t0, 1)}
    prompts = windows[: args.gen_batch, : args.prompt_length]
    gen = {}
    bd3 = models["bd3lm"]
    for cache in (False, True):  # warm-up: FlexAttention compiles a kernel per shape
        bd3_generate(bd3.model, prompts, gen_length=2 * block, block_size=block, steps_per_block=args.steps_per_block,
                     mask_token_id=bd3.mask_token_id, cache=cache, vocab_size=bd3.vocab_size)
    for cache in (False, True):
        sync()
        t0 = time.perf_counter()
        seqs = bd3_generate(bd3.model, prompts, gen_length=args.gen_length, block_size=block,
                            steps_per_block=args.steps_per_block, mask_token_id=bd3.mask_token_id, cache=cache,
                            vocab_size=bd3.vocab_size)
        sync()
        dt = time.perf_counter() - t0
        gen["cache" if cache else "recompute"] = {"seconds": round(dt, 3),
                                                  "tokens_per_s": prompts.shape[0] * args.gen_length / dt,
                                                  "sequences": seqs[:, args.prompt_length:].tolist()}
    gen["cache_equals_recompute"] = gen["cache"]["sequences"] == gen["recompute"]["sequences"]
    gen["speedup"] = gen["cache"]["tokens_per_s"] / gen["recompute"]["tokens_per_s"]
    mdm = models["mdm"]
    cfg = GenerateConfig(gen_length=args.gen_length, steps=args.gen_length // block * args.steps_per_block,
                         block_length=block, mask_token_id=mdm.mask_token_id, eos_token_id=None)
    sync()
    t0 = time.perf_counter()
    generate(mdm.logits_fn, prompts, cfg)
    sync()
    gen["mdm_reference_tokens_per_s"] = prompts.shape[0] * args.gen_length / (time.perf_counter() - t0)
    for k in ("cache", "recompute"):
        gen[k].pop("sequences")
    out["generation"] = {**gen, "prompt_length": args.prompt_length, "gen_length": args.gen_length,
                         "steps_per_block": args.steps_per_block, "block_size": block, "batch": int(prompts.shape[0])}
    return out


def prepare_data(args) -> int:
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from prepare import demo_inputs  # bench/gpu/prepare.py: the kit's GPT-2 files and the docs corpus

    for line in demo_inputs(shared=Path(args.shared)):
        print(line)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    raw = [a for a in (sys.argv[1:] if argv is None else argv)]
    if args.prepare_data:
        return prepare_data(args)
    if args.evaluate:
        print(json.dumps(evaluate(args)))
        return 0
    name = (args.name or "bd3lm-vs-mdm" + ("-mock" if args.mock else "")).lower()
    work = common.work_dir(args, "demos")
    args.plan_gpu = args.gpu if args.dry else plan_gpu(args)  # compile (and plan) for the GPU measured
    steps = plan(args, work, raw)
    if args.dry:
        return common.print_dry(steps, work, common.planned_path(args, "demos", name))
    problem = common.check_installed(args.python, work)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    log = work / "bd3lm.log"
    status, record = common.run_steps(steps[:-1], work, log, args.timeout_s)
    values = {"steps": record, "train_iters": args.train_iters}
    for kind in trainings(args):
        values[kind] = train_values(work / kind / "metrics.jsonl")
        values[kind]["planned"] = planned_values(work / f"{kind}.compiled")
        values[kind]["measured_over_planned"] = planned_vs_measured(values[kind]["planned"], values[kind])
    values.update(throughput_ratios(values))
    if status == "ok":
        import subprocess

        t0 = time.perf_counter()
        done = subprocess.run(steps[-1][1], cwd=str(work), env=common.child_env(), capture_output=True, text=True,
                              timeout=max(60.0, args.timeout_s))
        values["steps"]["evaluate"] = {"returncode": done.returncode, "seconds": round(time.perf_counter() - t0, 1)}
        if done.returncode == 0 and done.stdout.strip():
            values.update(json.loads(done.stdout.strip().splitlines()[-1]))
        else:
            values["steps"]["evaluate"]["log_tail"] = (done.stdout + done.stderr).splitlines()[-30:]
            status = "partial"
    command = [sys.executable, str(Path(__file__).resolve()), *raw]
    common.finish(args, "demos", name, command, values, status)
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
