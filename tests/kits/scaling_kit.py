"""What the scaling-fit tests share: a known law, noisy points drawn from it, Chinchilla's points
(bench/scaling/besiroglu2024), and run folders as the runtime writes them (metrics.jsonl with
start / train / valid records, spec.lock.toml) for ``dlmspec fit``."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from spec_kit import spec_file

ROOT = Path(__file__).resolve().parents[2]
BESIROGLU = ROOT / "bench" / "scaling" / "besiroglu2024"

#: A Chinchilla-like law (Hoffmann et al. 2022's fitted values, rounded).
KNOWN = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def chinchilla_points() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(N, D, C, loss)`` of the 240 points Besiroglu et al. 2024 fit: D = C / (6 N), the 5 of
    highest loss left out (their notebook's rule; published.json says so)."""
    with (BESIROGLU / "svg_extracted_data.csv").open() as f:
        rows = list(csv.DictReader(f))
    n = np.array([float(r["Model Size"]) for r in rows])
    c = np.array([float(r["Training FLOP"]) for r in rows])
    loss = np.array([float(r["loss"]) for r in rows])
    keep = loss < np.sort(loss)[-5]
    return n[keep], c[keep] / (6 * n[keep]), c[keep], loss[keep]


def published() -> dict[str, Any]:
    return json.loads((BESIROGLU / "published.json").read_text())


def noisy_points(seed: int = 0, noise: float = 0.01) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(N, D, loss)``: 6 model sizes x 6 token counts (N 1e7..3e9, D 1e9..1e12) of :data:`KNOWN`,
    each loss times ``exp(noise x standard normal)`` (numpy's default_rng(seed))."""
    from dlmspec.scaling.law import Law

    law = Law(**KNOWN)
    n, d = np.meshgrid(np.geomspace(1e7, 3e9, 6), np.geomspace(1e9, 1e12, 6))
    n, d = n.ravel(), d.ravel()
    rng = np.random.default_rng(seed)
    return n, d, law.loss(n, d) * np.exp(noise * rng.standard_normal(n.shape))


#: Model shapes of the run folders (num_layers, hidden_size): non-embedding N from 3.1M to 101M.
SHAPES = ((4, 256), (6, 384), (8, 512), (12, 768))


def write_run(folder: Path, *, shape: tuple[int, int], tokens: int | None, loss: float | None,
              flops_per_token: float | None = None, eval_result: dict[str, Any] | None = None,
              name: str | None = None, data: dict[str, Any] | None = None, lock: bool = True,
              objective: str = "mdm") -> Path:
    """A run folder as the runtime leaves it: ``spec.lock.toml`` (spec_kit's spec with ``shape``),
    ``metrics.jsonl`` with a start record (``model_flops_per_token``: default 6 N, N counted as
    ``dlmspec fit`` counts it), a train record with ``tokens_seen`` (none if ``tokens`` is None),
    a valid record with ``loss`` (none if ``loss`` is None), and ``eval.json`` when
    ``eval_result`` is given (the ``result`` of ``dlmspec eval --json``). ``objective``: the start
    record's objective kind (the lock keeps spec_kit's)."""
    from dlmspec.params import count_parameters
    from dlmspec.spec.load import load

    folder.mkdir(parents=True)
    layers, hidden = shape
    changes: dict[str, Any] = {"name": name or folder.name, "logging.run_dir": f"runs/{folder.name}"}
    changes.update(data or {})
    path = spec_file(folder, changes, file_name="spec.lock.toml",
                     model={"num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": 4 * hidden,
                            "num_attention_heads": hidden // 64, "num_query_groups": hidden // 64})
    n = count_parameters(load(path).spec.model).non_embedding
    if not lock:
        path.unlink()
    records = [{"event": "start", "name": name or folder.name, "iteration": 0, "objective": objective,
                "model_flops_per_token": flops_per_token if flops_per_token is not None else 6 * n,
                "spec_lock": "spec.lock.toml-not-here", "run_config": {"logging": {"run_dir": f"runs/{folder.name}"}}}]
    if tokens is not None:
        records.append({"event": "train", "iteration": 100, "loss": 3.0, "tokens_seen": tokens})
    if loss is not None:
        records.append({"event": "valid", "iteration": 100, "loss": loss})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if eval_result is not None:
        (folder / "eval.json").write_text(json.dumps({"command": "eval", "ok": True, "result": eval_result}))
    return folder


def non_embedding(shape: tuple[int, int]) -> int:
    """N of a run folder of ``shape`` (as :func:`write_run` counts it)."""
    from dlmspec.params import count_parameters
    from dlmspec.spec.models import ModelSpec

    layers, hidden = shape
    model = ModelSpec(num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                      num_attention_heads=hidden // 64, num_query_groups=hidden // 64, vocab_size=1000,
                      max_position_embeddings=1024)
    return count_parameters(model).non_embedding


def isoflop_study(root: Path, budgets: tuple[float, ...] = (1e16, 1e17, 1e18), seed: int = 0,
                  noise: float = 0.003, law: dict[str, float] | None = None, objective: str = "mdm",
                  prefix: str = "") -> list[Path]:
    """Run folders ``PREFIXc<i>-<layers>x<hidden>`` of an isoFLOP study of ``law`` (default
    :data:`KNOWN`) for ``objective``: per budget C each of :data:`SHAPES` with D = C / (6 N) and the
    law's loss times ``exp(noise x normal)``."""
    from dlmspec.scaling.law import Law

    law = Law(**(law or KNOWN))
    rng = np.random.default_rng(seed)
    folders = []
    for i, budget in enumerate(budgets):
        for shape in SHAPES:
            n = non_embedding(shape)
            d = int(budget / (6 * n))
            loss = float(law.loss(n, d) * np.exp(noise * rng.standard_normal()))
            folders.append(write_run(root / f"{prefix}c{i}-{shape[0]}x{shape[1]}", shape=shape, tokens=d, loss=loss,
                                     objective=objective))
    return folders
