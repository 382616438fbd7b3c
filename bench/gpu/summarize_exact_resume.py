"""Summarise bench/devbox/gpu/demo_resume.sh ("Exact resume") into one JSON.

    python3 bench/gpu/summarize_exact_resume.py WORK_DIR OUT_JSON [--timing TIMING_DIR] [--command CMD]

WORK_DIR holds ``{nd,det}-{A,B,R}.metrics.jsonl`` (and the launch logs): A and B uninterrupted,
R stopped by SIGTERM twice and launched again, all of the demo with the same seed and every step
logged; ``nd`` with the demo's kernels, ``det`` with bitwise-reproducible ones. TIMING_DIR holds
``time-{off,on}.N.metrics.jsonl`` (100 steps, kernels.qkv_fusion / compiled_norm /
apply_rope_fusion all false or all true).

The criterion, fixed before the runs (s1 = the step of the checkpoint the first SIGTERM wrote):

* ``nd`` (the demo's kernels are not bitwise reproducible): for every logged training step
  t > s1, ``|R_t - A_t| <= band_t`` with ``band_t = max(|B_u - A_u| for |u - t| <= 10)``; for every
  evaluation e > s1, ``|R_e - A_e| <= max(|B_f - A_f| for evaluations f with |f - e| <= 50)``.
  Were R simply a third uninterrupted run, a per-step band like this would still be exceeded now
  and then by chance (at about 1 step in 21 if the differences were independent), so the same
  count is reported with R and B swapped (B against the band of |R - A|) as the reference a
  perfect resume would reach.
* ``nd`` with a third uninterrupted run C (an earlier GPU run, fixed before its runs): the band is
  ``band_t = max(|B_u - A_u|, |C_u - A_u| for |u - t| <= 10)``, the noise of two uninterrupted runs
  against A rather than of one; and as the reference a perfect resume would reach, each of B and
  C is checked the same way against the band of the other two (|R - A| and the other's).
* ``det``: A and B agree bitwise at every step (the kernels are reproducible), and R agrees with
  A bitwise at every step after s1 (training and evaluation losses): an exact resume.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402  (bench/common.py: read_metrics)

WINDOW = 10
EVAL_WINDOW = 50


def _load(path: Path) -> list:
    """The records of a metrics file (:func:`common.read_metrics`; [] when it is missing)."""
    return common.read_metrics(path)


def _series(records, event: str) -> dict:
    return {r["iteration"]: r["loss"] for r in records if r["event"] == event}


def _band_check3(a: dict, b: dict, c: dict, r: dict, after: int, window: int) -> dict:
    """Steps t > after: |r - a| against max(|b - a|, |c - a|) over the steps within ``window``
    of t; and each of b, c against the band of the other two of (b, c, r)."""
    steps = sorted(t for t in a if t > after and t in b and t in c and t in r)
    diff = {name: {t: abs(x[t] - a[t]) for t in steps} for name, x in (("B", b), ("C", c), ("R", r))}

    def band(names, t):
        near = [diff[n][u] for n in names for u in diff[n] if abs(u - t) <= window]
        return max(near) if near else 0.0

    outside = {name: [t for t in steps if diff[name][t] > band([n for n in "BCR" if n != name], t)] for name in "BCR"}
    rms = lambda ds: math.sqrt(sum(d * d for d in ds) / len(ds)) if ds else None  # noqa: E731
    return {
        "steps": len(steps), "window": window, "references": ["B", "C"],
        "holds": bool(steps) and not outside["R"],
        "outside_band_count": len(outside["R"]), "outside_band": outside["R"],
        "reference_outside_band_count": {n: len(outside[n]) for n in "BC"},
        "max_abs_minus_A": {n: max(diff[n].values(), default=None) for n in "BCR"},
        "rms_minus_A": {n: rms(list(diff[n].values())) for n in "BCR"},
    }


def _band_check(a: dict, b: dict, r: dict, after: int, window: int) -> dict:
    """Steps t > after: |r - a| against max |b - a| over the steps within ``window`` of t."""
    steps = sorted(t for t in a if t > after and t in b and t in r)
    diff_ba = {t: abs(b[t] - a[t]) for t in a if t in b}
    diff_ra = {t: abs(r[t] - a[t]) for t in a if t in r}

    def band(diffs, t):
        near = [d for u, d in diffs.items() if abs(u - t) <= window]
        return max(near) if near else 0.0

    outside = [t for t in steps if diff_ra[t] > band(diff_ba, t)]
    swapped = [t for t in steps if diff_ba[t] > band(diff_ra, t)]
    rms = lambda ds: math.sqrt(sum(d * d for d in ds) / len(ds)) if ds else None  # noqa: E731
    return {
        "steps": len(steps), "window": window,
        "holds": bool(steps) and not outside,
        "outside_band_count": len(outside), "outside_band": outside,
        "outside_band_swapped_reference_count": len(swapped), "outside_band_swapped_reference": swapped,
        "same_step_R_closer_than_B": sum(diff_ra[t] <= diff_ba[t] for t in steps),
        "max_abs_R_minus_A": max((diff_ra[t] for t in steps), default=None),
        "max_abs_B_minus_A": max((diff_ba[t] for t in steps), default=None),
        "rms_R_minus_A": rms([diff_ra[t] for t in steps]),
        "rms_B_minus_A": rms([diff_ba[t] for t in steps]),
    }


def _bitwise(x: dict, y: dict, after: int) -> dict:
    steps = sorted(t for t in x if t > after and t in y)
    differ = [t for t in steps if x[t] != y[t]]
    return {"steps": len(steps), "equal": bool(steps) and not differ, "first_differing": differ[:5],
            "differing": len(differ)}


def _probe(work: Path, v: str) -> dict:
    """bench/gpu/resume_probe.py's fingerprints of A and R before the same steps: what differs."""
    a = {r["iteration"]: r for r in _load(work / f"{v}-A.probe.jsonl")}
    r = {x["iteration"]: x for x in _load(work / f"{v}-R.probe.jsonl")}
    out = {}
    for it in sorted(set(a) & set(r)):
        x, y = a[it], r[it]
        diff = {}
        for key in ("model", "tracker"):
            names = [n for n in x[key] if x[key][n] != y[key].get(n)]
            if names:
                diff[key] = {"differing": len(names), "of": len(x[key]), "first": names[:5]}
        for key in ("main", "exp_avg", "exp_avg_sq"):
            n = sum(p != q for p, q in zip(x[key], y[key]))
            if n:
                diff[key] = {"differing": n, "of": len(x[key])}
        for key in ("steps", "lr", "weight_decay", "scheduler_num_steps", "torch_rng", "cuda_rng"):
            if x[key] != y[key]:
                diff[key] = {"A": x[key], "R": y[key]}
        out[f"before step {it + 1}"] = diff or "identical"
    return out


def _variant(work: Path, v: str) -> dict:
    names = "".join(k for k in "ABCR" if (work / f"{v}-{k}.metrics.jsonl").is_file()) or "ABR"
    runs = {k: _load(work / f"{v}-{k}.metrics.jsonl") for k in names}
    saved = [r for r in runs["R"] if r["event"] == "checkpoint" and str(r.get("reason", "")).startswith("signal")]
    resumes = [r for r in runs["R"] if r["event"] == "resume"]
    stops = [r["iteration"] for r in resumes]
    s1 = stops[0] if stops else None
    train = {k: _series(runs[k], "train") for k in names}
    valid = {k: _series(runs[k], "valid") for k in names}
    out = {
        "resumed_from": stops, "signal_checkpoints": [r["iteration"] for r in saved],
        "exits": {k: [r for r in runs[k] if r["event"] == "exit"] for k in names},
        "steps_logged": {k: len(train[k]) for k in names},
    }
    if s1 is None or not all(train.values()):
        out["error"] = "a run is missing or R never resumed"
        out["losses"] = {"train": train, "valid": valid}
        return out
    if v == "nd" and "C" in names:
        out["criterion"] = {"train": _band_check3(train["A"], train["B"], train["C"], train["R"], s1, WINDOW),
                            "valid": _band_check3(valid["A"], valid["B"], valid["C"], valid["R"], s1, EVAL_WINDOW)}
    elif v == "nd":
        out["criterion"] = {"train": _band_check(train["A"], train["B"], train["R"], s1, WINDOW),
                            "valid": _band_check(valid["A"], valid["B"], valid["R"], s1, EVAL_WINDOW)}
    out["bitwise"] = {
        "A_vs_B_train_all_steps": _bitwise(train["A"], train["B"], 0) if train.get("B") else None,
        "A_vs_B_valid": _bitwise(valid["A"], valid["B"], 0) if train.get("B") else None,
        "R_vs_A_train_before_stop": _bitwise({t: x for t, x in train["R"].items() if t <= s1}, train["A"], 0),
        "R_vs_A_train_after_stop": _bitwise(train["R"], train["A"], s1),
        "R_vs_A_valid_after_stop": _bitwise(valid["R"], valid["A"], s1),
    }
    if v == "det":
        out["probe_A_vs_R"] = _probe(work, v)
        bw = out["bitwise"]
        out["criterion"] = {"holds": (bw["A_vs_B_train_all_steps"] is None or bw["A_vs_B_train_all_steps"]["equal"])
                            and bw["R_vs_A_train_after_stop"]["equal"] and bw["R_vs_A_valid_after_stop"]["equal"]}
    out["losses"] = {
        event: [{"iteration": t, **{k: series[k].get(t) for k in names}}
                for t in sorted(series["A"])]
        for event, series in (("train", train), ("valid", valid))
    }
    return out


def _timing(timing: Path) -> dict:
    """Median tokens/s of the train records from step 30 on (warm-up and compilation before), per run."""
    out = {}
    for path in sorted(timing.glob("time-*.metrics.jsonl")):
        records = [r for r in _load(path) if r["event"] == "train"]
        steady = [r["tokens_per_s"] for r in records if r["iteration"] >= 30]
        out[path.name.replace(".metrics.jsonl", "")] = {
            "median_tokens_per_s": statistics.median(steady) if steady else None,
            "tokens_per_s": [round(r["tokens_per_s"]) for r in records],
            "step_time_s": [round(r["step_time_s"], 4) for r in records],
            "final_loss": records[-1]["loss"] if records else None,
        }
    for kind in ("off", "on"):
        meds = [v["median_tokens_per_s"] for k, v in out.items() if k.startswith(f"time-{kind}.") and v["median_tokens_per_s"]]
        out[f"kernels_{kind}_median_of_runs"] = statistics.median(meds) if meds else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--timing", type=Path, default=None)
    p.add_argument("--command", default="")
    p.add_argument("--device", default="")
    p.add_argument("--note", default="", help="what the runs' code was (branch, commit)")
    a = p.parse_args()
    result = {
        "benchmark": "exact resume: specs/demo-dlm.toml (kernels as shipped: all off) run uninterrupted "
                     "twice (A, B) and stopped by SIGTERM after steps 100 and 200 and resumed to 300 (R); "
                     "'nd' = the demo's kernels, 'det' = SDPA memory-efficient backend + "
                     "torch.use_deterministic_algorithms(True) + CUBLAS_WORKSPACE_CONFIG=:4096:8",
        "criterion": __doc__.split("The criterion, fixed before the runs", 1)[1].strip(),
        "device": a.device, "command": a.command, "note": a.note,
        "nd": _variant(a.work, "nd"), "det": _variant(a.work, "det"),
    }
    if a.timing is not None:
        result["timing"] = _timing(a.timing)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    brief = {v: {"resumed_from": result[v].get("resumed_from"), "criterion": result[v].get("criterion"),
                 "bitwise": result[v].get("bitwise")} for v in ("nd", "det")}
    for v in brief.values():
        for c in (v["criterion"] or {}).values():
            if isinstance(c, dict):
                c.pop("outside_band", None), c.pop("outside_band_swapped_reference", None)
    print(json.dumps(brief, indent=1))
    if "timing" in result:
        print({k: v for k, v in result["timing"].items() if k.startswith("kernels_")})


if __name__ == "__main__":
    main()
