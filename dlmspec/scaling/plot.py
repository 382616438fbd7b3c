"""The figure of ``dlmspec fit --plot PATH`` (a PNG; matplotlib with its Agg backend, imported
only here).

One objective's fit (its kind and loss source in the title). Left: the isoFLOP profiles, loss against N per compute budget: the points (repeated-data runs as
crosses), each budget's parabola (approach 2), the fitted law along the budget (N, D = C/(k N)),
and the law's optimum N*(C) with its bootstrap interval (a token costing ``s N + b`` FLOPs, as
:func:`dlmspec.scaling.law.flops_per_token_line` fits it). Right: the compute-optimal N*(C) of the
law with its interval band, approach 2's minima with theirs, and the points' N against C.

The PNG carries ``Software: dlmspec fit`` in its metadata, so a later fit may replace it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dlmspec.files import FileRefused, atomic_writer, open_regular

#: The PNG metadata that marks a figure this command drew.
SOFTWARE = "dlmspec fit"


def drawn_by_fit(path: str) -> bool:
    """Whether the PNG at ``path`` carries :data:`SOFTWARE` (read from its first 64 KiB)."""
    try:
        fd = open_regular(path, what="--plot")
    except FileRefused:
        return False
    with os.fdopen(fd, "rb") as f:
        try:
            head = f.read(65536)
        except OSError:
            return False
    return head.startswith(b"\x89PNG") and b"Software\x00" + SOFTWARE.encode() in head


def draw(study: Any, output: str) -> None:
    """Draw ``study`` (:class:`dlmspec.scaling.study.StudyFit`) into the PNG ``output`` (a new
    file beside it moved over it whole: :func:`dlmspec.files.atomic_writer`).

    Raises:
        ImportError: matplotlib is not installed.
        OSError: the folder cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dlmspec.scaling.isoflop import group_budgets

    from dlmspec.scaling.law import Law, optimal_allocation

    law, (slope, intercept) = study.law.law, study.law.flops_per_token
    base = study.single_epoch
    n = np.array([p.params for p in base], dtype=float)
    c = np.array([p.flops for p in base], dtype=float)
    loss = np.array([p.loss for p in base], dtype=float)
    err = np.array([np.nan if p.stderr is None else p.stderr for p in base], dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.9))
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.85, wspace=0.25)
    if getattr(study, "objective", None):
        source = {"eval": "eval.json", "valid": "metrics.jsonl valid records"}.get(study.loss_source or "", "?")
        fig.suptitle(f"objective {study.objective}: loss from {source}", fontsize=11)
    colours = plt.cm.viridis(np.linspace(0.05, 0.85, max(len(study.isoflops.budgets), 1)))
    for colour, budget, row in zip(colours, study.isoflops.budgets, study.optimum):
        idx = np.array(budget.indices)
        label = f"C = {budget.compute:.2g}"
        left.errorbar(n[idx], loss[idx], yerr=np.where(np.isfinite(err[idx]), err[idx], 0), fmt="o", color=colour,
                      markersize=4, label=label)
        grid = np.geomspace(n[idx].min() / 1.5, n[idx].max() * 1.5, 100)
        if budget.coefficients is not None:
            p2, p1, p0 = budget.coefficients
            left.plot(grid, p2 * np.log(grid) ** 2 + p1 * np.log(grid) + p0, color=colour, lw=1)
        left.plot(grid, law.loss(grid, budget.compute / (slope * grid + intercept)), color=colour, lw=1, ls="--")
        n_star = row["N"]
        left.plot([n_star], [law.loss(n_star, row["D"])], marker="*", markersize=11, color=colour, mec="black")
        if row["N_interval"]:
            lo, hi = row["N_interval"]
            left.plot([lo, hi], [law.loss(n_star, row["D"])] * 2, color=colour, lw=3, alpha=0.5)
    for i, p in enumerate(study.repeated):
        left.plot([p.params], [p.loss], marker="x", color="crimson", markersize=7, ls="none",
                  label="repeats its data (not fitted)" if i == 0 else None)
    left.set_xscale("log")
    # the sizes trained set the axis: an N* interval reaching far outside them (a law the points do not
    # pin down) is drawn to the edge instead of squeezing every run into a corner
    left.set_xlim(n.min() / 3, n.max() * 3)
    left.set_xlabel("N (non-embedding parameters)")
    left.set_ylabel("final loss (nats/token)")
    left.set_title("isoFLOP profiles: parabola (solid), law (dashed), law optimum (star)")
    left.legend(fontsize=7)
    left.grid(True, alpha=0.3)
    budgets = np.array([row["compute"] for row in study.optimum])
    span = np.geomspace(min(c.min(), budgets.min()) / 2, max(c.max(), budgets.max()) * 2, 100)
    n_line = [optimal_allocation(law, float(x), study.law.flops_per_token)[0] for x in span]
    right.plot(span, n_line, color="black", lw=1.2, label="N*(C) of the law")
    if study.law.samples is not None and len(study.law.samples):
        curves = np.array([[optimal_allocation(Law(*s), float(x), study.law.flops_per_token)[0] for x in span[::5]]
                           for s in study.law.samples])
        tail = (100 - study.law.percentile) / 2
        lo, hi = np.percentile(curves, [tail, 100 - tail], axis=0)
        right.fill_between(span[::5], lo, hi, color="grey", alpha=0.3,
                           label=f"{study.law.percentile:g} % bootstrap interval ({study.law.bootstrap} resamples)")
    found = [b for b in study.isoflops.budgets if b.n_opt is not None]
    for b in found:
        yerr = None
        if b.n_interval:
            yerr = [[max(b.n_opt - b.n_interval[0], 0)], [max(b.n_interval[1] - b.n_opt, 0)]]
        right.errorbar([b.compute], [b.n_opt], yerr=yerr, fmt="s", color="tab:orange", markersize=6)
    if found:
        right.plot([], [], "s", color="tab:orange", label="isoFLOP minima (approach 2)")
    right.scatter(c, n, s=10, color="tab:blue", alpha=0.6, label="runs")
    right.set_xscale("log")
    right.set_yscale("log")
    # the budgets span less than a decade: label each budget (matplotlib's minor labels overlap there)
    from matplotlib.ticker import NullFormatter

    ticks = sorted({float(f"{x:.2g}") for x in budgets})
    right.set_xticks(ticks)
    right.set_xticklabels([f"{x:.2g}" for x in ticks], fontsize=8)
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_xlabel("C (training FLOPs)")
    right.set_ylabel("N")
    right.set_title("compute-optimal model size")
    right.legend(fontsize=7, loc="best")
    right.grid(True, alpha=0.3)
    try:
        with atomic_writer(output) as handle:
            fig.savefig(handle, format="png", dpi=110, metadata={"Software": SOFTWARE})
    finally:
        plt.close(fig)
