"""Do two runs' loss curves agree? (every optimisation keeps the first 50 steps' losses
within bf16 noise of the run without it, same seed.)

    python bench/throughput/loss_agreement.py runs/base/metrics.jsonl runs/fused/metrics.jsonl
    python bench/throughput/loss_agreement.py a.jsonl b.jsonl --steps 50 --rtol 0.02 --json out.json
    python bench/throughput/loss_agreement.py all.jsonl all.jsonl --where-a run=qwen-mb4 --where-b run=qwen-mb8
    python bench/throughput/loss_agreement.py base.jsonl fused.jsonl --noise base_again.jsonl --noise base_flash.jsonl

Input: JSON-lines metrics files as the runtime writes them (``metrics.jsonl``: records with
``"event": "train"``, ``"iteration"`` and ``"loss"``; with ``log_interval > 1`` a record's loss
is the mean over its interval, so both runs must log at the same interval), as
``bench/throughput/hf_baseline.py --metrics-jsonl`` writes them, or as
``bench/runtime/gpu_session.sh`` collects them (a ``"run"`` tag per line: select one run with
``--where-a/--where-b KEY=VALUE``). Records without ``"event"`` count as train records; of
several records of one iteration (a resumed run appends) the last one wins. Files are read with
bench/common.py's ``read_metrics``: a line that is not a JSON object (the cut last line of a run
killed mid-write) is skipped, so its iteration counts as not logged.

Comparison: for every iteration ``<= --steps`` logged by either run, the relative difference
``|a - b| / max(|a|, |b|)``. The runs agree when both logged the same iterations up to
``--steps`` and reached ``--steps`` (else ``complete`` is false; ``--allow-short`` accepts
runs that stop earlier), every loss is finite, and the largest relative difference is at most
``--rtol``. The default tolerance is 5 units of bf16 rounding (``5 * 2**-8 ~= 1.95%``): bf16
keeps 8 significant bits, so one rounding of a value moves it by up to ``2**-8`` relative, and
two bf16 runs whose kernels differ only in summation order drift by a few such units in their
first tens of steps.

The noise floor (``--noise FILE``, repeatable): runs of ``file_a``'s configuration again, the
same seed, differing only in non-determinism (the same command rerun) or in rounding (an
equivalent kernel). Their largest relative difference from ``file_a`` is what bf16 noise
alone does to this curve, and the tolerance becomes ``max(--rtol, noise floor)``. On
Qwen3-1.7B at micro batch 4 the same command rerun differed from itself by 3.0% at a loss
spike (iteration 23), above the fixed 1.95% (``bench/results/loss_agreement_qkv_norm_h200.json``).

Exit code 0 agree, 1 disagree (or incomplete), 2 unreadable input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402  (bench/common.py: read_metrics)

#: Relative spacing of bf16 numbers (8 significant bits).
BF16_EPS = 2.0 ** -8
#: Default tolerance: 5 bf16 units.
DEFAULT_RTOL = 5 * BF16_EPS
DEFAULT_STEPS = 50


class MetricsError(ValueError):
    """A metrics file that cannot be compared (missing, unreadable, no train records)."""


def _parse_where(items: Sequence[str]) -> List[Tuple[str, str]]:
    out = []
    for item in items:
        if "=" not in item:
            raise MetricsError(f"--where takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        out.append((key, value))
    return out


def _matches(rec: Dict[str, Any], where: Sequence[Tuple[str, str]]) -> bool:
    return all(key in rec and str(rec[key]) == value for key, value in where)


def read_losses(path: str | Path, *, key: str = "loss", where: Sequence[Tuple[str, str]] = ()) -> Dict[int, float]:
    """``{iteration: value of key}`` of the train records of a JSON-lines metrics file.

    Args:
        path: the file (:func:`common.read_metrics`; a run folder reads its ``metrics.jsonl``).
        key: the value to read (``loss``; ``grad_norm`` works too).
        where: ``(key, value)`` pairs a record must match (values compared as strings).

    Raises:
        MetricsError: if the file is missing or cannot be read whole (not a regular file, a line
            past the reader's cap), or holds no matching train record with ``iteration`` and ``key``.
    """
    rows = common.read_metrics(path)
    path = rows.path
    if not rows.found:
        raise MetricsError(f"{path}: cannot read (no such file)")
    if rows.refused:
        raise MetricsError(f"{path}: cannot read ({rows.refused})")
    values: Dict[int, float] = {}
    for rec in rows:
        if rec.get("event", "train") != "train" or not _matches(rec, where):
            continue
        iteration = rec.get("iteration", rec.get("step"))
        if not isinstance(iteration, int) or rec.get(key) is None:
            continue
        values[iteration] = float(rec[key])
    if not values:
        filt = f" matching {dict(where)}" if where else ""
        bad = f" ({rows.skipped} line{'s' if rows.skipped != 1 else ''} not a JSON object)" if rows.skipped else ""
        raise MetricsError(f"{path}: no train records with 'iteration' and {key!r}{filt}{bad}")
    return values


def compare(a: Dict[int, float], b: Dict[int, float], *, steps: int = DEFAULT_STEPS, rtol: float = DEFAULT_RTOL,
            allow_short: bool = False) -> Dict[str, Any]:
    """Compare two ``{iteration: loss}`` curves over their first ``steps`` iterations.

    Returns:
        ``agree`` (bool), ``max_rel_diff`` (float, ``nan`` if a loss is not finite, ``None`` if
        no iteration is shared), ``max_abs_diff``, ``worst_iteration``, ``compared`` (number of
        shared iterations), ``complete`` (both logged the same iterations and reached
        ``steps``), ``only_in_a`` / ``only_in_b`` (iterations <= steps logged by one run only),
        ``last_iteration_a`` / ``_b``, ``nonfinite`` (iterations with a NaN/inf loss), ``rtol``,
        ``steps`` and ``per_iteration`` (``[iteration, a, b, rel_diff]``).
    """
    a_its = {i for i in a if i <= steps}
    b_its = {i for i in b if i <= steps}
    shared = sorted(a_its & b_its)
    rows, nonfinite = [], []
    max_rel, max_abs, worst = 0.0, 0.0, None
    for i in shared:
        x, y = a[i], b[i]
        if not (math.isfinite(x) and math.isfinite(y)):
            nonfinite.append(i)
            rows.append([i, x, y, float("nan")])
            continue
        diff = abs(x - y)
        rel = diff / max(abs(x), abs(y)) if diff else 0.0
        rows.append([i, x, y, rel])
        if worst is None or rel > max_rel:
            max_rel, worst = rel, i
        max_abs = max(max_abs, diff)
    reached = bool(a_its) and bool(b_its) and max(a_its) >= steps and max(b_its) >= steps
    complete = a_its == b_its and bool(shared) and (reached or allow_short)
    return {
        "agree": bool(shared) and complete and not nonfinite and max_rel <= rtol,
        "max_rel_diff": (float("nan") if nonfinite else max_rel) if shared else None,
        "max_abs_diff": max_abs if shared else None,
        "worst_iteration": worst,
        "compared": len(shared),
        "complete": complete,
        "only_in_a": sorted(a_its - b_its),
        "only_in_b": sorted(b_its - a_its),
        "last_iteration_a": max(a) if a else None,
        "last_iteration_b": max(b) if b else None,
        "nonfinite": nonfinite,
        "rtol": rtol,
        "steps": steps,
        "per_iteration": rows,
    }


def check_files(path_a: str | Path, path_b: str | Path, *, steps: int = DEFAULT_STEPS, rtol: float = DEFAULT_RTOL,
                key: str = "loss", where_a: Sequence[str] = (), where_b: Sequence[str] = (),
                allow_short: bool = False, noise: Sequence[str | Path] = ()) -> Dict[str, Any]:
    """:func:`compare` of two files read with :func:`read_losses`; adds ``file_a``/``file_b``/``key``.

    Args:
        noise: Metrics files of ``path_a``'s run repeated (same seed; non-determinism or an
            equivalent kernel only). Each is compared with ``path_a`` (complete, finite, over the
            same ``steps``); the largest relative difference among them is the noise floor and the
            tolerance is ``max(rtol, noise floor)``. Adds ``noise_floor``, ``noise`` (per file:
            its ``max_rel_diff`` and ``worst_iteration``) and ``fixed_rtol``.

    Raises:
        MetricsError: see :func:`read_losses`; also when a noise run is incomplete or not finite
            (it cannot set a floor).
    """
    a = read_losses(path_a, key=key, where=_parse_where(where_a))
    b = read_losses(path_b, key=key, where=_parse_where(where_b))
    floor, noise_rows = 0.0, []
    for path in noise:
        ref = compare(a, read_losses(path, key=key), steps=steps, rtol=rtol, allow_short=allow_short)
        if not ref["complete"] or ref["nonfinite"] or ref["max_rel_diff"] is None:
            raise MetricsError(f"{path}: a noise run must log the same {steps} iterations as {path_a}, all finite")
        floor = max(floor, ref["max_rel_diff"])
        noise_rows.append({"file": str(path), "max_rel_diff": ref["max_rel_diff"], "worst_iteration": ref["worst_iteration"]})
    result = compare(a, b, steps=steps, rtol=max(rtol, floor), allow_short=allow_short)
    result.update(file_a=str(path_a), file_b=str(path_b), key=key)
    if noise_rows:
        result.update(noise_floor=floor, noise=noise_rows, fixed_rtol=rtol)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file_a")
    p.add_argument("file_b")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="compare iterations 1..STEPS")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="largest relative difference allowed")
    p.add_argument("--key", default="loss")
    p.add_argument("--where-a", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--where-b", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--allow-short", action="store_true", help="accept runs that stop before --steps")
    p.add_argument("--noise", action="append", default=[], metavar="FILE",
                   help="file_a's run repeated (same seed): its difference from file_a raises the tolerance (repeatable)")
    p.add_argument("--json", default=None, help="also write the result here")
    args = p.parse_args(argv)
    if args.steps < 1 or not args.rtol > 0:
        p.error("need --steps >= 1 and --rtol > 0")
    try:
        result = check_files(args.file_a, args.file_b, steps=args.steps, rtol=args.rtol, key=args.key,
                             where_a=args.where_a, where_b=args.where_b, allow_short=args.allow_short,
                             noise=args.noise)
    except MetricsError as exc:
        print(f"loss_agreement: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    rel = result["max_rel_diff"]
    rel_text = "n/a" if rel is None else f"{rel:.3e}"
    print(f"loss_agreement: {'AGREE' if result['agree'] else 'DISAGREE'}: max relative difference of {args.key} "
          f"{rel_text} (at iteration {result['worst_iteration']}, tolerance {result['rtol']:.3e}) over {result['compared']} "
          f"iterations <= {args.steps}; complete={result['complete']}")
    for row in result.get("noise", []):
        print(f"loss_agreement: noise floor: {row['file']} differs from file_a by {row['max_rel_diff']:.3e} "
              f"(iteration {row['worst_iteration']})")
    if result["only_in_a"] or result["only_in_b"]:
        print(f"loss_agreement: logged by one run only: a {result['only_in_a'][:10]}, b {result['only_in_b'][:10]}")
    if result["nonfinite"]:
        print(f"loss_agreement: non-finite {args.key} at iterations {result['nonfinite'][:10]}")
    return 0 if result["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
