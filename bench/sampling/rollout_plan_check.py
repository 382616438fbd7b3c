"""The planner's rollout time (dlmspec/plan/rl.py ``rl_rollout``) against committed sampler timings,
on CPU: each measured sampler call of a result file is planned with today's planner and compared.

Reads two kinds of committed GPU results:

- ``--sampling``: a fast-sampling suite result (bench/sampling/fast_sampling.py; ``values.configs``:
  per dlmspec configuration and batch the median ``seconds`` of one ``generate`` call, its forward
  passes, prompt tokens, cache and whether it ran as CUDA graphs; ``values.settings``: gen_length,
  block_length, temperature, threshold, factor). Each dlmspec configuration that ran as graphs is
  planned as a rollout batch of ``batch`` rows (one prompt, ``G = batch``) at a canvas of
  ``prompt_tokens + gen_length`` positions, ``generate.steps`` = the measured forward passes (the
  threshold and factor rules stop early; the planner takes ``steps`` as given).
- ``--rollout``: the RL stage's rollout call against d1's loop (bench/sampling/d1_rollout.py;
  ``settings``, ``rows``, ``tokens_per_second``), planned from ``--rl-spec`` (the spec that ran
  it) at its ``train.seq_length`` (what a user's plan sees) and at the call's canvas (prompt + completion),
  with graphs and eager (the eager forward's launches at ``--host-launch-us``, the run's host).

Writes ``{"cases": [{case, planned_s, measured_s, planned_over_measured}], "median_error", "largest_error",
"within_15_percent", ...}``.
No constant is fitted: the plan uses the calibration and GPU table as they are.

    python bench/sampling/rollout_plan_check.py --sampling S.json --rollout R.json \\
        --rl-spec specs/task-addition-dlm-rl-coupled.toml --host-launch-us 7.17 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.load import load  # noqa: E402


def planned_rollout(spec: Path, sets: Sequence[str]) -> float:
    """One rollout batch of the RL spec ``spec`` under ``sets`` (``--set`` strings), as the plan reports it
    (``rl.rollout_seconds``; validate's RL rules, e.g. against greedy rollouts, are not applied)."""
    return make_plan(resolve(load(spec, list(sets)).spec)).rl.rollout_seconds


def _rows_sets(rows: int, seq: int, gpu: str) -> List[str]:
    return ["stage.rl.grpo_prompts_per_step=1", f"stage.rl.grpo_group_size={rows}", f"train.global_batch_size={rows}",
            f"train.micro_batch_size={rows}", f"train.seq_length={seq}", "cluster.gpus_per_node=1",
            f'cluster.gpu="{gpu}"', "stage.rl.grpo_iterations=1"]


def sampling_cases(doc: Dict[str, Any], spec: Path, model_sets: Sequence[str]) -> List[Dict[str, Any]]:
    """Planned against measured for every dlmspec configuration and batch of a fast-sampling result
    that ran its forward as CUDA graphs (module docstring)."""
    values = doc.get("values", doc)
    settings, gpu = values["settings"], doc.get("hardware", {}).get("gpu", "h100")
    out = []
    for name, config in sorted(values.get("configs", {}).items()):
        if not name.startswith("dlmspec/"):
            continue
        _, cache, remasking = name.split("/")
        for batch, t in sorted(config.get("timing", {}).items(), key=lambda kv: int(kv[0])):
            if not t.get("cuda_graph") or t.get("cuda_graph_fallback") or t.get("cache_run", cache) != cache:
                continue
            rows, gen = int(batch), int(settings["gen_length"])
            seq = int(t["prompt_tokens"]) + gen
            sets = [*model_sets, *_rows_sets(rows, seq, gpu), f"generate.gen_length={gen}",
                    f"generate.block_length={int(settings['block_length'])}", f"generate.steps={int(t['forward_passes'])}",
                    f"generate.temperature={float(settings.get('temperature', 0.0))}", f'generate.cache="{cache}"',
                    f'generate.remasking="{remasking}"']
            planned, measured = planned_rollout(spec, sets), float(t["seconds"])
            out.append({"case": f"sampling {name} batch {rows} ({int(t['forward_passes'])} passes, canvas {seq})",
                        "planned_s": planned, "measured_s": measured, "planned_over_measured": planned / measured})
    return out


def rollout_cases(doc: Dict[str, Any], spec: Path, model_sets: Sequence[str], host_launch_us: Optional[float],
                  gpu: str) -> List[Dict[str, Any]]:
    """Planned against measured for the RL rollout call, with graphs and eager, at the spec's sequence
    length and at the call's canvas (module docstring)."""
    s = doc["settings"]
    rows, gen = int(doc["rows"]), int(s["gen_length"])
    canvas = max(int(n) for n in s.get("prompt_lengths", [0])) + gen
    loops = {"dlmspec/rl-rollout": True, "dlmspec/rl-rollout-eager": False}
    measured = {k: rows * gen / float(v) for k, v in doc["tokens_per_second"].items() if k in loops}
    base = [*model_sets, "cluster.gpus_per_node=1", f'cluster.gpu="{gpu}"',
            f"stage.rl.grpo_group_size={int(s['grpo_group_size'])}", f"stage.rl.grpo_prompts_per_step={int(s['grpo_prompts_per_step'])}",
            f"train.global_batch_size={rows}", f"generate.gen_length={gen}", f"generate.steps={int(s['steps'])}",
            f"generate.block_length={int(s['block_length'])}", f"generate.temperature={float(s['temperature'])}",
            f'generate.remasking="{s["remasking"]}"']
    if host_launch_us:
        base.append(f"cluster.host_launch_us={host_launch_us}")
    out = []
    for loop, graphs in loops.items():
        if loop not in measured:
            continue
        for label, extra in (("spec's seq_length", []), (f"canvas {canvas}", [f"train.seq_length={canvas}"])):
            sets = [*base, *extra, f"generate.cuda_graph={'true' if graphs else 'false'}"]
            planned = planned_rollout(spec, sets)
            out.append({"case": f"RL rollout {loop} ({rows} rows x {gen} tokens, {'graphs' if graphs else 'eager'}; "
                                f"planned at the {label})",
                        "planned_s": planned, "measured_s": measured[loop],
                        "planned_over_measured": planned / measured[loop]})
    return out


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies in it (a result names no machine's folders)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sampling", type=Path, help="a fast-sampling suite result (JSON)")
    p.add_argument("--rollout", type=Path, help="an RL rollout-vs-d1 result (JSON)")
    p.add_argument("--rl-spec", type=Path, default=ROOT / "specs" / "task-addition-dlm-rl-coupled.toml")
    p.add_argument("--set", dest="sets", action="append",
                   help="a model override the measured runs used, repeatable (default: model.qk_layernorm=false)")
    p.add_argument("--host-launch-us", type=float, help="the rollout run's host launch time (µs)")
    p.add_argument("--gpu", default="h100")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.sets = a.sets or ["model.qk_layernorm=false"]
    given = list(sys.argv[1:] if argv is None else argv)
    cases: List[Dict[str, Any]] = []
    if a.sampling:
        cases += sampling_cases(json.loads(a.sampling.read_text()), a.rl_spec, a.sets)
    if a.rollout:
        cases += rollout_cases(json.loads(a.rollout.read_text()), a.rl_spec, a.sets, a.host_launch_us, a.gpu)
    errors = [abs(c["planned_over_measured"] - 1) for c in cases]
    result = {"suite": "rollout-plan-check", "gpu": a.gpu, "cases": cases,
              "command": " ".join(["python", "bench/sampling/rollout_plan_check.py", *given]),
              "note": "made on CPU from committed GPU results by this checkout's planner; no GPU was used",
              "median_error": statistics.median(errors) if errors else None,
              "largest_error": max(errors) if errors else None,
              "within_15_percent": sum(e <= 0.15 for e in errors),
              "sources": {"sampling": str(a.sampling) if a.sampling else None,
                          "rollout": str(a.rollout) if a.rollout else None, "rl_spec": _shown(a.rl_spec)},
              "model_sets": a.sets, "host_launch_us": a.host_launch_us}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    for c in cases:
        print(f"{c['planned_over_measured']:6.2f}  planned {1e3 * c['planned_s']:7.1f} ms  measured "
              f"{1e3 * c['measured_s']:7.1f} ms  {c['case']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
