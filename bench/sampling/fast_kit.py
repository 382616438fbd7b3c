"""Plain-Python parts of the fast-sampling suite (``bench/sampling/fast_sampling.py``): the
configurations, the batching of held-out prompts, scoring (exact match, Wilson interval), token
agreement, the speed and accuracy targets and the table for docs/generate.md. No torch import, so the CPU tests
and the launcher's ``--dry`` use it without a GPU stack.

Sources of the formulas:

- Wilson score interval (Wilson 1927, "Probable inference, the law of succession, and statistical
  inference", JASA 22:209): ``(p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``,
  ``z = 1.96`` for 95 %.
- Targets (the fast-sampling feature's acceptance goals: dlmspec without cache at batch 1 >= 1.5x the
  peers' Hugging Face loop on the same settings; prefix and dual cache with threshold decoding
  >= 5x dlmspec's own no-cache low-confidence baseline at batch 32 and >= 3x at batch 1, and faster
  than Fast-dLLM's own implementation on the same model; accuracy within the no-cache run's 95 %
  interval).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Config:
    """One measured configuration.

    Attributes:
        name: ``"<impl>/<cache>/<remasking>"`` (the key of every result).
        impl: ``"dlmspec"`` (``dlmspec.backends.generate.sampler.generate`` on megatron-core),
            ``"hf-loop"`` (the suite's LLaDA ``generate.py``-style loop: a full Hugging Face forward
            per step, :func:`bench.sampling.generate_demo.peer_generate`) or ``"fast-dllm"``
            (Fast-dLLM's own ``llada/generate.py`` functions on its own ``modeling_llada.py``).
        cache: ``"none"``, ``"prefix"`` or ``"dual"`` (Fast-dLLM's block caches, Wu et al. 2025).
        remasking: ``"low_confidence"`` (LLaDA: the schedule's count of most confident),
            ``"threshold"`` (Fast-dLLM: every confidence >= threshold, at least one) or ``"factor"``
            (Fast-dLLM's factor rule).
        compile: dlmspec's ``[generate] compile = true`` (``torch.compile(mode="reduce-overhead")``:
            CUDA graphs of the block forwards); measured after everything else (``--with-compile``).
    """

    impl: str
    cache: str
    remasking: str
    compile: bool = False

    @property
    def name(self) -> str:
        return f"{self.impl}/{self.cache}/{self.remasking}" + ("+compile" if self.compile else "")

    @property
    def side(self) -> str:
        """Which worker process runs it: ``"dlmspec"`` or ``"peers"``."""
        return "dlmspec" if self.impl == "dlmspec" else "peers"


#: Every configuration, in the order each worker runs them (the baselines first, so a run cut short
#: still has what the others are compared with).
CONFIGS: Tuple[Config, ...] = (
    Config("dlmspec", "none", "low_confidence"),
    Config("dlmspec", "none", "threshold"),
    Config("dlmspec", "prefix", "threshold"),
    Config("dlmspec", "dual", "threshold"),
    Config("dlmspec", "prefix", "factor"),
    Config("dlmspec", "dual", "factor"),
    Config("hf-loop", "none", "low_confidence"),
    Config("hf-loop", "none", "threshold"),
    Config("fast-dllm", "none", "low_confidence"),
    Config("fast-dllm", "none", "threshold"),
    Config("fast-dllm", "prefix", "threshold"),
    Config("fast-dllm", "dual", "threshold"),
)
#: dlmspec with CUDA graphs (``--with-compile``): after all of :data:`CONFIGS`, as their compilation
#: takes time the others should have first.
COMPILE_CONFIGS: Tuple[Config, ...] = (
    Config("dlmspec", "none", "low_confidence", True),
    Config("dlmspec", "prefix", "threshold", True),
    Config("dlmspec", "dual", "threshold", True),
)
ALL_CONFIGS: Tuple[Config, ...] = CONFIGS + COMPILE_CONFIGS
BY_NAME: Dict[str, Config] = {c.name: c for c in ALL_CONFIGS}
#: The reference of token agreement and of the accuracy target: dlmspec's no-cache decoding.
BASELINE = "dlmspec/none/low_confidence"
BASELINE_THRESHOLD = "dlmspec/none/threshold"


def configs_of(side: str, only: Optional[Sequence[str]] = None, with_compile: bool = False) -> List[Config]:
    """The configurations ``side`` (``"dlmspec"`` or ``"peers"``) runs, restricted to ``only``
    (names) when given; with ``with_compile``, :data:`COMPILE_CONFIGS` last.

    Raises:
        ValueError: a name in ``only`` that is no configuration (the message lists them).
    """
    if only:
        unknown = [n for n in only if n not in BY_NAME]
        if unknown:
            raise ValueError(f"unknown configuration(s) {unknown}; known: {', '.join(BY_NAME)}")
    pool = ALL_CONFIGS if with_compile or (only and any(n in only for n in (c.name for c in COMPILE_CONFIGS))) else CONFIGS
    return [c for c in pool if c.side == side and (not only or c.name in only)]


# --------------------------------------------------------------------------- held-out prompts


def read_task_rows(task_dir: Path, limit: int) -> List[Dict[str, str]]:
    """The first ``limit`` held-out rows ``{"id", "prompt", "answer"}`` of a task folder written by
    ``dlmspec task make`` (its ``test.jsonl``; the one seam on the task's file layout).

    Raises:
        FileNotFoundError: no ``test.jsonl`` in ``task_dir``.
        ValueError: a line that is not a JSON object with string ``prompt`` and ``answer`` (file and
            line named), or fewer rows than ``limit``.
    """
    path = Path(task_dir) / "test.jsonl"
    rows: List[Dict[str, str]] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not isinstance(row.get("answer"), str):
                raise ValueError(f"{path}:{number}: needs string keys 'prompt' and 'answer'")
            rows.append({"id": str(row.get("id", number)), "prompt": row["prompt"], "answer": row["answer"]})
            if len(rows) == limit:
                break
    if len(rows) < limit:
        raise ValueError(f"{path}: {len(rows)} held-out rows, {limit} asked (make the task with --test {limit} or more)")
    return rows


def eval_batches(lengths: Sequence[int], batch: int) -> List[List[int]]:
    """Indices of the prompts in batches of at most ``batch`` prompts of ONE token length each (no
    padding: the peers' loops take equal-length prompts only), in order of length, then index."""
    by_len: Dict[int, List[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    out: List[List[int]] = []
    for n in sorted(by_len):
        idx = by_len[n]
        out.extend(idx[k:k + batch] for k in range(0, len(idx), batch))
    return out


def timing_prompts(lengths: Sequence[int], batch: int) -> List[int]:
    """``batch`` indices of prompts of the most common token length (cycled when that length has
    fewer prompts than ``batch``): the timed batches have one length, so every implementation runs
    the same canvas without padding."""
    by_len: Dict[int, List[int]] = {}
    for i, n in enumerate(lengths):
        by_len.setdefault(n, []).append(i)
    common = max(by_len.values(), key=lambda idx: (len(idx), -lengths[idx[0]]))
    return [common[k % len(common)] for k in range(batch)]


# --------------------------------------------------------------------------- scoring


def wilson(correct: int, n: int, z: float = 1.96) -> Tuple[float, float]:
    """The Wilson score interval of ``correct / n`` (95 % at ``z = 1.96``; module docstring);
    ``(0, 1)`` when ``n == 0``."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / denom), min(1.0, (centre + half) / denom)


def checker() -> Tuple[Callable[[str, str], bool], str]:
    """``(exact_match(completion, answer) -> bool, its name)``: ``dlmspec.tasks.check.exact_match``
    (the task's own checker), else a stand-in (first line, stripped, equal) named as such."""
    try:
        from dlmspec.tasks.check import exact_match

        return exact_match, "dlmspec.tasks.check.exact_match"
    except ImportError:
        def first_line_equal(completion: str, answer: str) -> bool:
            return completion.split("\n", 1)[0].strip() == answer.strip()

        return first_line_equal, "stand-in: first line stripped equal (dlmspec.tasks.check not installed)"


def cut_at_eos(ids: Sequence[int], eos: Optional[int]) -> List[int]:
    """``ids`` up to (not including) the first ``eos``."""
    out = []
    for t in ids:
        if eos is not None and t == eos:
            break
        out.append(int(t))
    return out


def accuracy(generated: Sequence[Sequence[int]], answers: Sequence[str], decode: Callable[[List[int]], str],
             eos: Optional[int], match: Callable[[str, str], bool]) -> Dict[str, Any]:
    """Exact-match accuracy of the generated regions (``gen_length`` ids each, cut at the first EOS,
    decoded) against ``answers``, with its Wilson 95 % interval."""
    correct = sum(bool(match(decode(cut_at_eos(g, eos)), a)) for g, a in zip(generated, answers))
    n = len(answers)
    lo, hi = wilson(correct, n)
    return {"correct": correct, "n": n, "accuracy": correct / n if n else None, "interval_95": [lo, hi]}


def agreement(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> Dict[str, Any]:
    """Token agreement of two decodings of the same prompts: the fraction of generated positions
    (all ``gen_length``, before any EOS cut) holding the same token, and the fraction of rows equal
    throughout."""
    same = total = rows = 0
    for x, y in zip(a, b):
        n = min(len(x), len(y))
        eq = sum(int(p) == int(q) for p, q in zip(x[:n], y[:n]))
        same += eq
        total += max(len(x), len(y))
        rows += int(eq == n and len(x) == len(y))
    count = min(len(a), len(b))
    return {"tokens": same / total if total else None, "rows": rows / count if count else None, "n": count}


# --------------------------------------------------------------------------- targets


def _tps(summary: Dict[str, Any], name: str, batch: int) -> Optional[float]:
    """tokens/s of ``name`` at ``batch``; ``None`` when not measured, or when a cache configuration ran
    without its cache (the sampler's ``cache_fallback``: then it measured something else)."""
    entry = summary.get(name, {}).get("timing", {}).get(str(batch))
    if not entry or entry.get("cache_fallback"):
        return None
    return entry.get("tokens_per_second")


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if num and den else None


def targets(summary: Dict[str, Any], batches: Sequence[int]) -> List[Dict[str, Any]]:
    """Each speed and accuracy target beside its measured value: ``{"target", "measured", "goal", "met"}``
    (``measured`` ``None``, ``met`` ``None`` where a configuration is missing).

    ``summary``: config name -> ``{"timing": {batch: {"tokens_per_second", ...}}, "accuracy": {...}}``.
    """
    out: List[Dict[str, Any]] = []

    def add(target: str, measured: Optional[float], goal: float, kind: str = ">=") -> None:
        met = None if measured is None else (measured >= goal if kind == ">=" else measured > goal)
        out.append({"target": target, "measured": measured, "goal": f"{kind} {goal:g}", "met": met})

    b1 = 1 if 1 in batches else min(batches)
    bmax = 32 if 32 in batches else max(batches)
    for rule in ("low_confidence", "threshold"):
        add(f"batch {b1}: dlmspec/none/{rule} over hf-loop/none/{rule}",
            _ratio(_tps(summary, f"dlmspec/none/{rule}", b1), _tps(summary, f"hf-loop/none/{rule}", b1)), 1.5)
    for cache in ("prefix", "dual"):
        for batch, goal in ((bmax, 5.0), (b1, 3.0)):
            add(f"batch {batch}: dlmspec/{cache}/threshold over {BASELINE}",
                _ratio(_tps(summary, f"dlmspec/{cache}/threshold", batch), _tps(summary, BASELINE, batch)), goal)
        for batch in batches:
            add(f"batch {batch}: dlmspec/{cache}/threshold over fast-dllm/{cache}/threshold",
                _ratio(_tps(summary, f"dlmspec/{cache}/threshold", batch),
                       _tps(summary, f"fast-dllm/{cache}/threshold", batch)), 1.0, ">")
    base = summary.get(BASELINE, {}).get("accuracy")
    for name in [c.name for c in CONFIGS if c.impl == "dlmspec" and c.cache != "none"]:
        acc = summary.get(name, {}).get("accuracy")
        inside = None
        if base and acc and acc.get("accuracy") is not None:
            lo, hi = base["interval_95"]
            inside = lo <= acc["accuracy"] <= hi
        out.append({"target": f"accuracy of {name} within {BASELINE}'s 95% interval",
                    "measured": acc.get("accuracy") if acc else None,
                    "goal": f"in [{base['interval_95'][0]:.3f}, {base['interval_95'][1]:.3f}]" if base else "in the interval",
                    "met": inside})
    return out


def speedups(summary: Dict[str, Any], batches: Sequence[int]) -> Dict[str, Dict[str, Dict[str, Optional[float]]]]:
    """Per configuration and batch, its tokens/s over each no-cache low-confidence baseline
    (dlmspec's, the peers' loop's and Fast-dLLM's own), so each implementation's own gain is
    beside dlmspec's: ``{name: {batch: {baseline: ratio}}}``."""
    bases = (BASELINE, "hf-loop/none/low_confidence", "fast-dllm/none/low_confidence")
    return {c.name: {str(b): {base: _ratio(_tps(summary, c.name, b), _tps(summary, base, b)) for base in bases}
                     for b in batches}
            for c in ALL_CONFIGS if c.name in summary}


# --------------------------------------------------------------------------- table


def _fmt(value: Optional[float], spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render_table(values: Dict[str, Any]) -> str:
    """The markdown table for docs/generate.md: per configuration, tokens/s and forward passes at
    each batch, held-out accuracy with its 95 % interval, token agreement with dlmspec's no-cache
    decoding; then the targets beside the measured ratios."""
    summary = values.get("configs", {})
    batches = values.get("settings", {}).get("batches", [1, 8, 32])
    head = ["configuration"] + [f"tok/s b{b} (passes)" for b in batches] + ["accuracy [95% CI]", "agreement vs no-cache"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config in ALL_CONFIGS:
        entry = summary.get(config.name)
        if not entry:
            continue
        cells = [f"`{config.name}`"]
        for b in batches:
            t = entry.get("timing", {}).get(str(b))
            fell_back = " no cache: fallback" if t and t.get("cache_fallback") else ""
            cells.append(f"{t['tokens_per_second']:.0f} ({t['forward_passes']}){fell_back}" if t
                         else ("skipped" if entry.get("skipped") else "n/a"))
        acc = entry.get("accuracy")
        cells.append(f"{acc['accuracy']:.3f} [{acc['interval_95'][0]:.3f}, {acc['interval_95'][1]:.3f}] (n={acc['n']})"
                     if acc and acc.get("accuracy") is not None else "n/a")
        ag = entry.get("agreement", {})
        ref = BASELINE_THRESHOLD if config.remasking != "low_confidence" else BASELINE
        got = ag.get(ref, {}).get("tokens")
        cells.append(f"{_fmt(got, '.3f')} ({ref.split('/')[-1]})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    for t in values.get("targets", []):
        met = {True: "yes", False: "no", None: "n/a"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['measured'], '.2f')} | {t['goal']} | {met} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- files


def write_json(path: Path, data: Dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, atomically (a temporary file beside it, then renamed), so a run
    stopped mid-write leaves the previous complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def stamp(t0: float, message: str) -> str:
    """``"[hh:mm:ss +SSSs] message"``: UTC wall clock and seconds since ``t0``."""
    import time

    now = time.time()
    return f"[{time.strftime('%H:%M:%S', time.gmtime(now))} +{now - t0:5.0f}s] {message}"


def merge_configs(parts: Iterable[Dict[str, Any]]) -> Dict[str, Any]:
    """The ``configs`` of several workers' partial results, in :data:`ALL_CONFIGS` order."""
    merged: Dict[str, Any] = {}
    for part in parts:
        merged.update(part.get("configs", {}))
    return {c.name: merged[c.name] for c in ALL_CONFIGS if c.name in merged}
