"""``dlmspec fit RUN... [--sweep DIR] [--json] [--plot PATH]``: scaling laws fitted to a study's
run folders (:mod:`dlmspec.scaling`; docs/scaling.md, "Fitting").

Reads each run's parameters, tokens, FLOPs, unique tokens, epochs and final validation loss
(:func:`dlmspec.scaling.runs.read_point`); runs missing any of them are named and skipped with
why. Prints the law's parameters with their bootstrap intervals, the compute-optimal N*(C) and
D*(C) at the budgets present, the isoFLOP minima and, when runs repeat their data, R*_D and R*_N;
``--plot`` draws them. Exit code 2 (file, key, why, fix) for a folder that is no run folder, a
lock file or ``eval.json`` that cannot be read, fewer usable runs than the law's parameters, or a
``--plot`` it may not write. numpy, scipy and matplotlib are imported inside the command only.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.help import Command
from dlmspec.cli.output import print_envelope, shown, stdout, use_json
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.spec.lines import COMMAND_LINE


def _issue(key: str, value: Any, why: str, fix: str, file: str = COMMAND_LINE) -> SpecError:
    return SpecError([SpecIssue(key, why, value=value, hint=fix, rule="fit-input", file=file,
                                source="dlmspec.cli.commands.fit")])


def _grid(name: str) -> dict[str, Any]:
    from dlmspec.scaling.law import DEFAULT_GRID, HOFFMANN_GRID

    grids = {"default": DEFAULT_GRID, "hoffmann": HOFFMANN_GRID}
    if name not in grids:
        raise _issue("--grid", name, "not a grid of starts", "--grid default (72 starts) or --grid hoffmann (4,500)")
    return grids[name]


def _check_plot(path: str, force: bool) -> None:
    from dlmspec.scaling.plot import drawn_by_fit

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _issue("--plot", path, "is in a folder that does not exist",
                     f"create {parent} first, or give --plot in an existing folder", file=path)
    if os.path.isdir(path) or os.path.islink(path):
        raise _issue("--plot", path, "is a folder or a symbolic link", "give a file name, e.g. --plot fit.png", file=path)
    if os.path.exists(path) and not force and not drawn_by_fit(path):
        raise _issue("--plot", path, "exists and was not drawn by dlmspec fit",
                     "give another --plot, or add --force to replace it", file=path)


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}"


def _interval(pair: Any, digits: int = 3) -> str:
    if not pair:
        return "-"
    return f"{pair[0]:.{digits}g} - {pair[1]:.{digits}g}"


def _print(study: Any, skipped: list[Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    console = stdout()
    runs = Table(title="runs (N: non-embedding parameters; C: training FLOPs as the planner counts them)")
    for column in ("run", "N", "N total", "D tokens", "C FLOPs", "epochs", "loss", "loss from"):
        runs.add_column(column, justify="left" if column in ("run", "loss from") else "right")
    for pooled in study.points:
        p = pooled.point
        loss = f"{p.loss:.4f}" + (f" +- {p.stderr:.4f}" if p.stderr else "")
        epochs = f"{p.epochs:.2f}" if p.epochs is not None else f"? ({p.unique_why})"
        runs.add_row(shown(p.name), f"{p.params:,}", f"{p.total_params:,}", f"{p.tokens:,}", f"{p.flops:.3g}", epochs,
                     loss, shown(p.loss_source))
    console.print(runs)
    for s in skipped:
        console.print(Text(shown(f"skipped {s.name} ({s.run_dir}): {s.why}"), style="yellow"))
    fit = study.law
    title = (f"L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022 approach 3; {fit.points} single-epoch points, "
             f"{fit.starts} starts; {fit.percentile:g} % bootstrap intervals of {fit.bootstrap} resamples"
             + (f", {fit.bootstrap_failed} failed" if fit.bootstrap_failed else "") + ")")
    law = Table(title=title)
    for column in ("parameter", "value", "interval"):
        law.add_column(column, justify="right")
    for name, value in fit.law.as_dict().items():
        law.add_row(name, _fmt(value, 5), _interval(fit.intervals.get(name), 4))
    console.print(law)
    slope, intercept = fit.flops_per_token
    opt = Table(title=f"compute-optimal at the budgets present (a token costs {slope:.3g} N + {intercept:.3g} FLOPs)")
    for column in ("C FLOPs", "N* (law)", "interval", "D* (law)", "interval", "N_opt (isoFLOP)", "interval"):
        opt.add_column(column, justify="right")
    for row, budget in zip(study.optimum, study.isoflops.budgets):
        iso = _fmt(budget.n_opt, 3) if budget.n_opt is not None else f"- ({budget.why_none})"
        opt.add_row(f"{row['compute']:.3g}", _fmt(row["N"], 3), _interval(row["N_interval"]), _fmt(row["D"], 3),
                    _interval(row["D_interval"]), iso, _interval(budget.n_interval))
    console.print(opt)
    iso = study.isoflops
    if iso.n_exponent is not None:
        console.print(f"isoFLOP power laws: N_opt = {iso.n_coefficient:.3g} C^{iso.n_exponent:.3f} "
                      f"(interval {_interval(iso.intervals.get('N_exponent'))}), D_opt = {iso.d_coefficient:.3g} "
                      f"C^{iso.d_exponent:.3f} (interval {_interval(iso.intervals.get('D_exponent'))})")
    rep = study.repetition
    if rep is not None:
        if rep.source == "fitted":
            words = (f"fitted on {len(rep.levels)} repetition levels: R*_D = {rep.r_star_d:.3g} "
                     f"({_interval(rep.intervals.get('R_star_D'))}), R*_N = {rep.r_star_n:.3g} "
                     f"({_interval(rep.intervals.get('R_star_N'))})")
        else:
            words = (f"R*_D = {rep.r_star_d:g}, R*_N = {rep.r_star_n:g} published by Muennighoff et al. 2023 "
                     f"(AR models; {len(rep.levels)} repetition level(s) here, 3 are needed to fit them)")
        console.print(f"data-constrained (Muennighoff et al. 2023 effective data): {words}")


@app.command("fit", cls=Command)
def fit_command(
    ctx: typer.Context,
    runs: Optional[list[str]] = typer.Argument(None, metavar="RUN...", help="Run folders ([logging] run_dir: the "
                                               "folders holding metrics.jsonl)."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="A folder whose sub-folders are the study's run folders."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Draw the fits into this PNG."),
    force: bool = typer.Option(False, "--force", help="Replace --plot even when dlmspec fit did not draw it."),
    bootstrap: int = typer.Option(200, "--bootstrap", help="Resamples for the intervals (0: none)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the resampling."),
    grid: str = typer.Option("default", "--grid", help="Starts of L-BFGS-B: default (72) or hoffmann (4,500)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Fit scaling laws to a study's runs: L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022
    approach 3) with bootstrap intervals, isoFLOP parabolas (approach 2), Muennighoff et al. 2023's
    repeated-data form, and the compute-optimal N*(C) and D*(C) at the budgets present.

    Runs without a validation loss or provenance are named and skipped. Exit code 2 for a folder
    that is no run folder, an unreadable lock file or eval.json, or fewer runs than the law's
    5 parameters.
    """
    use_json(ctx, json_output)
    folders = list(runs or [])
    if sweep is not None:
        from dlmspec.scaling.runs import sweep_runs

        folders += sweep_runs(sweep)
    if not folders:
        raise _issue("RUN...", None, "no run folder given", "dlmspec fit runs/a runs/b ... or dlmspec fit --sweep runs/")
    if bootstrap < 0:
        raise _issue("--bootstrap", bootstrap, "a negative number of resamples", "--bootstrap 200 (0: no intervals)")
    if seed < 0:
        raise _issue("--seed", seed, "a negative seed", "--seed 0")
    starts = _grid(grid)
    if plot is not None:
        _check_plot(plot, force)
    from dlmspec.scaling.law import FitError
    from dlmspec.scaling.runs import RunPoint, read_point
    from dlmspec.scaling.study import fit_study

    points, skipped = [], []
    for folder in dict.fromkeys(folders):  # a folder given twice counts once
        found = read_point(folder)
        (points if isinstance(found, RunPoint) else skipped).append(found)
    try:
        study = fit_study(points, bootstrap=bootstrap, seed=seed, grid=starts)
    except FitError as exc:
        named = "; ".join(f"{s.name}: {s.why}" for s in skipped)
        raise _issue("RUN...", f"{len(points)} usable of {len(points) + len(skipped)} runs", exc.why,
                     exc.fix + (f" (skipped: {named})" if named else "")) from None
    if plot is not None:
        try:
            from dlmspec.scaling.plot import draw

            draw(study, plot)
        except ImportError:
            raise _issue("--plot", plot, "needs matplotlib, which is not installed",
                         "pip install matplotlib (or pip install 'dlmspec[viz]')") from None
        except OSError as exc:
            raise _issue("--plot", plot, f"cannot be written ({exc.strerror or exc})", "give --plot in a folder you "
                         "can write", file=plot) from None
    if json_output:
        result = study.as_dict()
        result["skipped"] = [s.as_dict() for s in skipped]
        result["plot"] = plot
        print_envelope("fit", ok=True, result=result)
        return
    _print(study, skipped)
    if plot is not None:
        stdout().print(f"wrote {shown(plot)}")
