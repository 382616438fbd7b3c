"""The scaling suite: every member of the bundled scaling studies trained and evaluated on one GPU
(several runs side by side), in one call of at most ten minutes.

    python bench/scaling/run.py --gpus 1                 # ~6-8 minutes on one H100 (see the estimate --dry prints)
    python bench/scaling/run.py --dry                    # the commands, the planner's estimate, the result path (CPU)
    python bench/scaling/run.py --prepare-data           # CPU, once: the data kit's corpus into .data/ (then carry it)
    python bench/scaling/run.py --members 'isoflop-dlm-*' --parallel 4

The studies (``--specs``, default both): ``specs/scaling-demo-isoflop.py`` (4 sizes x 3 compute
budgets, DLM and AR: 24 runs, each at most one epoch of the demo corpus) and
``specs/scaling-demo-repeat.py`` (the data-constrained pair, one epoch against eight of a capped
prefix, DLM and AR: 4 runs). Steps, from a work directory outside the checkout whose ``.data`` links
to ``--data-dir`` (what the specs' relative data paths name): ``dlmspec compile SPEC -o
WORK/compiled/<stem>`` per study, then per member, in ``WORK/members/<name>/`` (whose ``.data/`` links
each file of ``--data-dir``, so megatron-core's index cache, written next to the data, is the
member's own: runs side by side never write one cache file), its ``launch.sh`` (``--parallel`` at a
time, member ``i`` on GPU ``i mod --gpus``, the longest planned first) and ``dlmspec eval
runs/<name> --data <its validation prefix> --json`` (AR: exact NLL per token; DLM: the ELBO bound
per token with its standard error, ``--eval-samples`` samples of ``--eval-sequences`` windows) into
``runs/<name>/eval.json``. A wall-clock budget (``--budget-s``) bounds the whole study: no run
starts after it and a run still going at its end is stopped (and named).

Each member's row: its planner values (``N`` = non-embedding parameters as ``dlmspec/params.py``
counts them, the total beside it; training FLOPs = the planner's model FLOPs per step x
``train_iters``; tokens; unique tokens and epochs as ``dlmspec/data/repetition.py`` counts them
from ``--data-dir``; the planned training seconds), then what the run measured: exit codes and
seconds of training and evaluation, the last validation loss of its ``metrics.jsonl``, and the
evaluation. The result goes to ``bench/results/scaling/<date>-<gpu>-<name>.json`` (``--out``:
under it); beside it, in the folder of the same name, ``runs/<name>/`` holds each member's
``metrics.jsonl``, ``eval.json`` (unless empty: an evaluation the budget stopped), ``spec.lock.toml``
and last checkpoint's ``dlmspec.json``, and ``.data/`` the dataset records and indexes (``.idx``:
document lengths, what a unique-token cap is counted with), so ``dlmspec fit --sweep FOLDER/runs``
fits the study, epochs included, without its checkpoints or token files (:func:`keep_files`).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

ROOT = common.ROOT
SUITE = "scaling"
STUDIES = [ROOT / "specs" / "scaling-demo-isoflop.py", ROOT / "specs" / "scaling-demo-repeat.py"]
#: Seconds a run spends outside its planned training steps (start-up of torch and megatron-core,
#: the data index, the checkpoint at its end, the evaluation in training): the demo's 150-step MDM run
#: of bench/results/demos/2026-12-06-h100-bd3lm-vs-mdm-train150.json took 57.8 s for ~11 s of steps.
OVERHEAD_S = 45.0
#: Seconds of a ``dlmspec eval`` call on these models (start-up and a few seconds of scoring; assumed).
EVAL_S = 20.0


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, precision=None)
    p.add_argument("--specs", default=",".join(str(s.relative_to(ROOT)) for s in STUDIES),
                   help="comma-separated sweep files (default: the bundled isoFLOP study and data-constrained pair)")
    p.add_argument("--members", default="*", help="comma-separated name patterns of the members to run (default: all)")
    p.add_argument("--parallel", type=int, default=8, help="runs side by side (default 8: small models leave the GPU idle)")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall-clock seconds for the whole study (default 540)")
    p.add_argument("--data-dir", default=str(ROOT / ".data"), help="what the specs' .data/ paths name (default: the checkout's)")
    p.add_argument("--eval-sequences", type=int, default=64, help="validation windows dlmspec eval scores (default 64)")
    p.add_argument("--eval-samples", type=int, default=128, help="DLM: Monte-Carlo samples per window (default 128)")
    p.add_argument("--prepare-data", action="store_true", help="prepare .data/ from the offline data kit and exit (CPU)")
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"), help="the offline data kit")
    args = p.parse_args(argv)
    for flag, value in (("--parallel", args.parallel), ("--gpus", args.gpus), ("--eval-sequences", args.eval_sequences),
                        ("--eval-samples", args.eval_samples)):
        if value < 1:
            p.error(f"{flag} {value}: must be at least 1")
    if not args.budget_s > 0:
        p.error(f"--budget-s {args.budget_s}: must be positive (e.g. 540)")
    specs = []
    for item in (s.strip() for s in args.specs.split(",")):
        path = (ROOT / item) if not Path(item).is_absolute() else Path(item)
        if not item or not path.is_file():
            p.error(f"--specs {item!r}: no such sweep file (e.g. --specs specs/scaling-demo-isoflop.py)")
        specs.append(path.resolve())
    args.spec_paths = specs
    args.patterns = [m.strip() for m in args.members.split(",") if m.strip()] or ["*"]
    return args


def plan_members(args) -> list[dict[str, Any]]:
    """Every chosen member's planner values (see the module docstring), in the sweeps' order. Data
    paths are read relative to the checkout (``.data/`` as the specs name it)."""
    try:
        from dlmspec.data.repetition import repetition
    except ImportError as exc:
        print(f"error: {sys.executable} cannot import dlmspec ({exc}): this launcher plans the studies with it; run "
              "it with a Python that has dlmspec installed (pip install . from the repository root)", file=sys.stderr)
        raise SystemExit(2) from None
    from dlmspec.plan import make_plan
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load
    from dlmspec.spec.python_load import sweep_targets

    rows = []
    here = os.getcwd()
    os.chdir(Path(args.data_dir).resolve().parent if Path(args.data_dir).name == ".data" else ROOT)
    try:
        for path in args.spec_paths:
            for target in sweep_targets(path):
                spec = load(target).spec
                if not any(fnmatch.fnmatchcase(spec.name, pat) for pat in args.patterns):
                    continue
                resolved = resolve(spec)
                plan = make_plan(resolved).to_dict()
                rep = repetition(spec, resolved)
                iters = resolved.train_iters
                rows.append({
                    "name": spec.name, "study": path.name, "objective": spec.objective.kind,
                    "num_layers": spec.model.num_layers, "hidden_size": spec.model.hidden_size,
                    "ffn_hidden_size": spec.model.ffn_hidden_size,
                    "non_embedding_parameters": resolved.params.non_embedding, "total_parameters": resolved.params.total,
                    "train_iters": iters, "tokens": iters * resolved.tokens_per_step,
                    "training_flops": plan["flops"]["model_per_step"] * iters,
                    "unique_tokens": rep.unique_tokens if rep else None, "epochs": rep.epochs if rep else None,
                    "max_unique_tokens": [e.max_unique_tokens for e in spec.data.train],
                    "valid_prefix": spec.data.valid[0].prefix if spec.data.valid else None,
                    "planned_train_seconds": plan["time"]["to_train_seconds"], "planned_mfu": plan["mfu"],
                })
    finally:
        os.chdir(here)
    return rows


def estimate(rows: list[dict[str, Any]], parallel: int) -> dict[str, Any]:
    """The study's time: the planner's training seconds summed, plus :data:`OVERHEAD_S` and
    :data:`EVAL_S` a run, spread over ``parallel`` runs side by side (the runs are launch-bound:
    the planner's MFU for them is 0.3-1.5%, so several share one GPU; a rough figure)."""
    train = sum(r["planned_train_seconds"] or 0.0 for r in rows)
    serial = train + len(rows) * (OVERHEAD_S + EVAL_S)
    longest = max((r["planned_train_seconds"] or 0.0) + OVERHEAD_S + EVAL_S for r in rows) if rows else 0.0
    return {"members": len(rows), "planned_train_seconds": round(train, 1), "overhead_seconds_per_run": OVERHEAD_S,
            "eval_seconds_per_run": EVAL_S, "serial_seconds": round(serial, 1), "parallel": parallel,
            "wall_seconds": round(max(serial / parallel, longest), 1)}


def steps(args, work: Path, rows: list[dict[str, Any]]):
    """``(compile steps, {member: (train step, eval step)})``, each step ``(name, argv, extra env)``."""
    py = args.python
    compiles = []
    for path in args.spec_paths:
        cmd = [py, "-m", "dlmspec.cli", "compile", str(path), "-o", str(work / "compiled" / path.stem), "--force"]
        if args.gpu:
            cmd += ["--set", f'cluster.gpu="{args.gpu}"']
        compiles.append((f"compile-{path.stem}", cmd, {}))
    per_member = {}
    for i, row in enumerate(rows):
        stem, home = Path(row["study"]).stem, member_dir(work, row["name"])
        launch = {"DLMSPEC_PYTHON": py, "CUDA_VISIBLE_DEVICES": str(i % args.gpus)}
        train = (f"train-{row['name']}", ["bash", str(work / "compiled" / stem / row["name"] / "launch.sh")], launch)
        ev = [py, "-m", "dlmspec.cli", "eval", str(home / "runs" / row["name"]), "--data",
              str(home / (row["valid_prefix"] or "")), "--num-sequences", str(args.eval_sequences), "--json"]
        if row["objective"] != "ar":
            # 2 windows x 16 samples a forward: [32, 512, 50304] float32 logits (3.3 GB), where eval's default
            # of 8 windows makes 13 GB. On one H100 (2026-12-07) two processes held ~38 GiB each while 8 runs
            # shared the GPU, and 6 evaluations ran out of memory. The windows per batch change only which
            # draws go together.
            ev += ["--num-samples", str(args.eval_samples), "--batch-size", "2"]
        per_member[row["name"]] = (train, (f"eval-{row['name']}", ev, {"CUDA_VISIBLE_DEVICES": str(i % args.gpus)}))
    return compiles, per_member


def member_dir(work: Path, name: str) -> Path:
    """Where member ``name`` runs (its ``.data/``, ``runs/<name>/``)."""
    return work / "members" / name


def link_data(home: Path, data: Path) -> None:
    """``home/.data/``: a folder of links to each entry of ``data`` (its files and folders), so
    that what megatron-core writes beside the data (``cache/``) lands in ``home/.data/``."""
    folder = home / ".data"
    folder.mkdir(parents=True, exist_ok=True)
    for entry in sorted(data.iterdir()):
        if entry.name == "cache":
            continue
        link = folder / entry.name
        if not link.is_symlink() and not link.exists():
            link.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())


def run_until(cmd: list[str], cwd: Path, env: dict[str, str], out, deadline: float) -> tuple[int | None, float]:
    """Run ``cmd`` in its own process group, output to ``out``; at ``deadline`` (``time.monotonic``)
    SIGTERM the group, SIGKILL it 10 s later (:func:`common.run_limited`). Returns ``(exit code or
    None when stopped, seconds)``."""
    t0 = time.monotonic()
    code, stopped = common.run_limited(cmd, cwd, common.child_env(env), out, max(1.0, deadline - time.monotonic()))
    return (None if stopped else code), round(time.monotonic() - t0, 1)


def last_valid_loss(metrics: Path) -> float | None:
    """The loss of the last validation record (``valid`` or ``eval``) of a ``metrics.jsonl`` with a
    number as its loss (None when there is none; :func:`common.read_metrics`)."""
    scored = [r for r in common.events(common.read_metrics(metrics), "valid", "eval")
              if isinstance(r.get("loss"), (int, float))]
    return float(scored[-1]["loss"]) if scored else None


def eval_scores(path: Path) -> dict[str, Any] | None:
    """The scores of a ``dlmspec eval --json`` envelope: AR ``nll_per_token``; DLM the ``count``
    estimator's ``nll_per_token`` and ``stderr_per_token`` with its sample counts (None when the
    file holds no result)."""
    try:
        envelope = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    result = envelope.get("result") if isinstance(envelope, dict) else None
    if not isinstance(result, dict):
        return None
    if isinstance(result.get("ar"), dict):
        keep = ("nll_per_token", "perplexity", "num_tokens", "num_sequences")
        return {"kind": "ar_nll", **{k: result["ar"].get(k) for k in keep}}
    elbo = result.get("elbo") or {}
    for name, e in elbo.items():
        keep = ("nll_per_token", "stderr_per_token", "num_samples", "num_sequences", "num_tokens")
        return {"kind": f"elbo_{name}", **{k: e.get(k) for k in keep}}
    return None


def run_member(row, train, ev, work: Path, data: Path, deadline: float, lock: threading.Lock) -> dict[str, Any]:
    """Train then evaluate one member in :func:`member_dir` (its log: WORK/logs/<name>.log)."""
    out: dict[str, Any] = {}
    if time.monotonic() >= deadline:
        return {"skipped": "the study's --budget-s ran out before it started"}
    home = member_dir(work, row["name"])
    link_data(home, data)
    log = work / "logs" / f"{row['name']}.log"
    with open(log, "ab") as fh:
        with lock:
            print(f"{train[0]}: {common.show(train[1], home)}", flush=True)
        code, secs = run_until(train[1], home, train[2], fh, deadline)
        out["train"] = {"returncode": code, "seconds": secs, **({"stopped": "--budget-s"} if code is None else {})}
    run_dir = home / "runs" / row["name"]
    out["valid_loss"] = last_valid_loss(run_dir / "metrics.jsonl")
    if code == 0 and time.monotonic() < deadline:
        with lock:
            print(f"{ev[0]}: {common.show(ev[1], home)}", flush=True)
        with open(run_dir / "eval.json", "wb") as fh, open(log, "ab") as err:
            t0 = time.monotonic()
            ecode, stopped = common.run_limited(ev[1], home, common.child_env(ev[2]), fh,
                                                max(1.0, deadline - time.monotonic()), grace=0.0, stderr=err)
            ecode = None if stopped else ecode
        out["eval"] = {"returncode": ecode, "seconds": round(time.monotonic() - t0, 1)}
        out["eval_scores"] = eval_scores(run_dir / "eval.json")
    if code != 0 or out.get("eval", {}).get("returncode") != 0:
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        out["log_tail"] = lines[-20:]
        cause = first_error(lines)
        if cause:
            out["error"] = cause
    return out


#: Lines that name why a run failed (a Python exception's last line, CUDA's out-of-memory), as a
#: torchrun log prints them before the launcher's own ``ChildFailedError`` summary.
_ERROR_MARKERS = ("Error:", "Exception:", "out of memory", "Killed")


def first_error(lines: list[str]) -> str | None:
    """The first line of a run's log that names an error (:data:`_ERROR_MARKERS`) other than
    torchrun's summary (``ChildFailedError``), without the ``[rank0]:`` prefix; None when none does.
    The last 20 lines of a failed torchrun job are its launcher's summary, which names no cause."""
    for line in lines:
        text = line.split("]:", 1)[1].strip() if line.startswith("[rank") and "]:" in line else line.strip()
        if "ChildFailedError" in text or not any(m in text for m in _ERROR_MARKERS):
            continue
        return text[:500]
    return None


def _empty(path: Path) -> bool:
    """Whether ``path`` holds nothing but white space (an evaluation stopped before it printed)."""
    return path.stat().st_size < (1 << 16) and not path.read_bytes().strip()


def keep_files(work: Path, rows: list[dict[str, Any]], dest: Path, data: Path | None = None) -> None:
    """A copy of the study that ``dlmspec fit --sweep DEST/runs`` reads, without the checkpoints:
    ``DEST/runs/<name>/`` with each member's ``metrics.jsonl``, ``eval.json`` (not when it is empty:
    the study's budget stopped the evaluation, and the run's loss is then its ``metrics.jsonl``
    valid record), its compiled ``spec.lock.toml`` and its last checkpoint's ``dlmspec.json``
    (provenance and spec record), and ``DEST/.data/`` with each dataset's record
    (``PREFIX.dlmspec.json``: token counts) of ``data`` and its index beside it (``PREFIX.idx``:
    the documents' lengths, which a ``max_unique_tokens`` cap is counted with; ~17 KB for the demo
    corpus, the ``.bin`` token files stay behind), where the locks' relative ``.data/`` paths point
    from ``DEST``."""
    for row in rows:
        run_dir = member_dir(work, row["name"]) / "runs" / row["name"]
        target = dest / "runs" / row["name"]
        found = [run_dir / "metrics.jsonl", run_dir / "eval.json"]
        found.append(work / "compiled" / Path(row.get("study", "")).stem / row["name"] / "spec.lock.toml")
        found += sorted((run_dir / "checkpoints").glob("iter_*/dlmspec.json"))[-1:]
        for src in found:
            if src.is_file() and not (src.name == "eval.json" and _empty(src)):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target / src.name)
    if data is not None and data.is_dir():
        for record in sorted(data.glob("*.dlmspec.json")):
            (dest / ".data").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(record, dest / ".data" / record.name)
            index = record.with_name(record.name[: -len(".dlmspec.json")] + ".idx")
            if index.is_file():
                shutil.copyfile(index, dest / ".data" / index.name)


def prepare_data(args) -> int:
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from prepare import demo_inputs  # bench/gpu/prepare.py: the kit's GPT-2 files and the docs corpus

    for line in demo_inputs(shared=Path(args.shared)):
        print(line)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    if args.prepare_data:
        return prepare_data(args)
    name = (args.name or "demo-isoflop-and-repeat").lower()
    slurm = common.maybe_slurm(args, raw, SUITE)
    if slurm is not None:
        return slurm
    work = common.work_dir(args, SUITE)
    rows = plan_members(args)
    if not rows:
        print(f"error: --members {args.members!r}: no member of {', '.join(p.name for p in args.spec_paths)} matches "
              f"(names: dlmspec plan SPEC lists them, e.g. --members 'isoflop-dlm-*')", file=sys.stderr)
        return 2
    rows.sort(key=lambda r: -(r["planned_train_seconds"] or 0.0))  # longest first: the shortest finish the study
    est = estimate(rows, args.parallel)
    compiles, per_member = steps(args, work, rows)
    data = Path(args.data_dir).resolve()
    link = ("link-data", ["ln", "-sfn", str(data), str(work / ".data")], {})
    if args.dry:
        ordered = [(link, work), *((c, work) for c in compiles)]
        ordered += [(s, member_dir(work, r["name"])) for r in rows for s in per_member[r["name"]]]
        for (step, cmd, extra), cwd in ordered:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items())
            print(f"{step}: {(env + ' ') if env else ''}{common.show(cmd, cwd)}")
        print(f"estimate: {est['members']} runs, {est['planned_train_seconds']:.0f} s of training steps planned "
              f"(dlmspec plan, summed) + {OVERHEAD_S:.0f} s start-up/checkpoint and {EVAL_S:.0f} s evaluation a run: "
              f"{est['serial_seconds']:.0f} s one after another, ~{est['wall_seconds']:.0f} s at {args.parallel} side by "
              f"side (budget {args.budget_s:.0f} s)")
        print(f"result: {common.planned_path(args, SUITE, name)}")
        return 0
    problem = common.check_installed(args.python, work)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not (data / "demo-train_text_document.idx").is_file():
        print(f"error: --data-dir {data}: no demo-train_text_document.idx (run python bench/scaling/run.py "
              "--prepare-data on a machine with the data kit, and carry .data)", file=sys.stderr)
        return 2
    t_start = time.monotonic()
    deadline = t_start + args.budget_s
    (work / "logs").mkdir(parents=True, exist_ok=True)
    dot_data = work / ".data"
    if dot_data.is_symlink() or not dot_data.exists():
        if dot_data.is_symlink():
            dot_data.unlink()
        dot_data.symlink_to(data, target_is_directory=True)
    status, record = common.run_steps(compiles, work, work / "logs" / "compile.log", timeout_s=300)
    results: dict[str, Any] = {}
    if status == "ok":
        lock = threading.Lock()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            futures = {r["name"]: pool.submit(run_member, r, *per_member[r["name"]], work, data, deadline, lock)
                       for r in rows}
            results = {n: f.result() for n, f in futures.items()}
    members = [{**r, **results.get(r["name"], {})} for r in rows]
    done = [m for m in members if m.get("train", {}).get("returncode") == 0 and m.get("eval", {}).get("returncode") == 0]
    status = "ok" if status == "ok" and len(done) == len(members) else ("partial" if done else "failed")
    values = {"estimate": est, "wall_seconds": round(time.monotonic() - t_start, 1), "budget_s": args.budget_s,
              "compile": record, "members": members,
              "definitions": {"non_embedding_parameters": "dlmspec.params.count_parameters(...).non_embedding",
                              "training_flops": "plan flops.model_per_step x train_iters (dlmspec.flops: 3x forward "
                                                "GEMMs, attention at the objective's keys, logits on the padded vocabulary)",
                              "tokens": "train_iters x global_batch_size x seq_length",
                              "epochs": "dlmspec.data.repetition: tokens drawn / unique training tokens"}}
    command = [sys.executable, str(Path(__file__).resolve()), *raw]
    path = common.finish(args, SUITE, name, command, values, status)
    keep_files(work, rows, path.with_suffix(""), data)
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
