"""``dlmspec fit RUN... [--sweep DIR] [--objective KIND] [--loss auto|eval|valid] [--json] [--plot
PATH]``: scaling laws fitted to a study's run folders (:mod:`dlmspec.scaling`; docs/scaling.md,
"Fitting").

Reads each run's parameters, tokens, FLOPs, unique tokens, epochs, objective and final validation
loss (:func:`dlmspec.scaling.runs.read_point`); runs missing any of them are named and skipped with
why. The runs of each objective (the start record's ``objective``: ``ar``, ``mdm``, ...) are a
study of their own (:func:`dlmspec.scaling.study.fit_objectives`): per objective it prints the
loss source used, the law's parameters with their bootstrap intervals, the compute-optimal N*(C)
and D*(C) at the budgets present, the isoFLOP minima and, when runs repeat their data, R*_D and
R*_N; ``--plot`` draws them. ``--objective KIND`` fits one objective only.

Loss source (``--loss``), the same for every run of an objective so one fit never mixes
validation sets: ``eval`` (each run's ``eval.json``), ``valid`` (each run's last ``metrics.jsonl``
valid record), ``auto`` (default: ``eval`` when every run of the objective has one, else
``valid`` for all of them). An empty or cut-off ``eval.json`` is a warning, not an error.

``--json``: with runs of one objective (or ``--objective``) the result is one fit: ``points``,
``law``, ``isoflops``, ``optimum``, ``data_constrained``, ``objective``, ``loss`` (``source``,
``why``), ``skipped``, ``plot``. With several objectives it is ``{"objectives": {KIND: <one fit's
keys, plot included>}, "not_fitted": {KIND: {"why", "fix"}}, "skipped": [...]}``. Warnings go to
the envelope's ``warnings``.

``--plot PATH``: one figure per objective; with several objectives each goes to PATH with
``-KIND`` before its suffix (``fit.png`` -> ``fit-ar.png``, ``fit-mdm.png``).

Exit code 2 (file, key, why, fix) for a folder that is no run folder, a lock file or
``eval.json`` that cannot be read (no regular file, JSON that is not ``dlmspec eval``'s),
no objective with as many usable runs as the law's parameters, an ``--objective`` no run trains,
or a ``--plot`` it may not write. numpy, scipy and matplotlib are imported inside the command only.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.help import Command
from dlmspec.cli.output import print_envelope, report_warnings, shown, stdout, use_json
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

    if not path.lower().endswith(".png"):  # the figures are PNG: a .txt or .pdf name would hold PNG bytes
        stem = os.path.splitext(path)[0] or "fit"
        raise _issue("--plot", path, "is not a .png file name (the figures are PNG)", f"--plot {stem}.png", file=path)
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


def plot_paths(plot: str, objectives: list[str]) -> dict[str, str]:
    """Where ``--plot PATH`` draws each objective's figure: PATH itself for one objective, else
    PATH with ``-KIND`` before its suffix (``fit.png`` -> ``fit-ar.png``)."""
    if len(objectives) <= 1:
        return {kind: plot for kind in objectives}
    stem, suffix = os.path.splitext(plot)
    return {kind: f"{stem}-{kind}{suffix or '.png'}" for kind in objectives}


def _print(study: Any, skipped: list[Any]) -> None:
    from rich.table import Table
    from rich.text import Text

    console = stdout()
    kind = study.objective or "?"
    if study.loss_source is not None:
        words = "eval.json" if study.loss_source == "eval" else "metrics.jsonl valid records"
        console.print(f"objective {shown(kind)}: loss from {words} for every run ({shown(study.loss_why)})")
    runs = Table(title=f"{kind} runs (N: non-embedding parameters; C: training FLOPs as the planner counts them)")
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
    title = (f"{kind}: L(N, D) = E + A/N^alpha + B/D^beta (Hoffmann et al. 2022 approach 3; {fit.points} single-epoch points, "
             f"{fit.starts} starts; {fit.percentile:g} % bootstrap intervals of {fit.bootstrap} resamples"
             + (f", {fit.bootstrap_failed} failed" if fit.bootstrap_failed else "") + ")")
    law = Table(title=title)
    for column in ("parameter", "value", "interval"):
        law.add_column(column, justify="right")
    for name, value in fit.law.as_dict().items():
        law.add_row(name, _fmt(value, 5), _interval(fit.intervals.get(name), 4))
    console.print(law)
    slope, intercept = fit.flops_per_token
    opt = Table(title=f"{kind}: compute-optimal at the budgets present (a token costs {slope:.3g} N + {intercept:.3g} FLOPs)")
    for column in ("C FLOPs", "N* (law)", "interval", "D* (law)", "interval", "N_opt (isoFLOP)", "interval"):
        opt.add_column(column, justify="right")
    for row, budget in zip(study.optimum, study.isoflops.budgets):
        iso = _fmt(budget.n_opt, 3) if budget.n_opt is not None else f"- ({budget.why_none})"
        opt.add_row(f"{row['compute']:.3g}", _fmt(row["N"], 3), _interval(row["N_interval"]), _fmt(row["D"], 3),
                    _interval(row["D_interval"]), iso, _interval(budget.n_interval))
    console.print(opt)
    iso = study.isoflops
    if iso.n_exponent is not None:
        console.print(f"{kind}: isoFLOP power laws: N_opt = {iso.n_coefficient:.3g} C^{iso.n_exponent:.3f} "
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
        console.print(f"{kind}: data-constrained (Muennighoff et al. 2023 effective data): {words}")


@app.command("fit", cls=Command)
def fit_command(
    ctx: typer.Context,
    runs: Optional[list[str]] = typer.Argument(None, metavar="RUN...", help="Run folders ([logging] run_dir: the "
                                               "folders holding metrics.jsonl)."),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="A folder whose sub-folders are the study's run folders."),
    objective: Optional[str] = typer.Option(None, "--objective", metavar="KIND", help="Fit only the runs of this "
                                            "objective (ar, mdm, ...: the start record's objective)."),
    loss: str = typer.Option("auto", "--loss", help="Loss of every run of an objective: eval (eval.json), valid "
                             "(metrics.jsonl valid record), auto (eval when every run of the objective has one, "
                             "else valid)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Draw the fits into this PNG (several objectives: one "
                                       "file each, PATH with -KIND before the suffix)."),
    force: bool = typer.Option(False, "--force", help="Replace --plot even when dlmspec fit did not draw it."),
    bootstrap: int = typer.Option(200, "--bootstrap", help="Resamples for the intervals (0: none)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the resampling."),
    grid: str = typer.Option("default", "--grid", help="Starts of L-BFGS-B: default (72) or hoffmann (4,500)."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout (several objectives: "
                                     "{objectives: {KIND: fit}, not_fitted, skipped})."),
) -> None:
    """Fit scaling laws to a study's runs, each objective on its own: L(N, D) = E + A/N^alpha +
    B/D^beta (Hoffmann et al. 2022 approach 3) with bootstrap intervals, isoFLOP parabolas
    (approach 2), Muennighoff et al. 2023's repeated-data form, and the compute-optimal N*(C) and
    D*(C) at the budgets present.

    Every run of an objective takes its loss from one source (--loss; auto: eval.json when all
    have one, else the metrics.jsonl valid records). With several objectives, --json prints
    {"objectives": {KIND: <one fit>}, "not_fitted": {KIND: {why, fix}}, "skipped": [...]} and
    --plot writes PATH-KIND.png per objective. Runs without a validation loss or provenance are
    named and skipped. Exit code 2 for a folder that is no run folder, an unreadable lock file or
    eval.json, an --objective no run trains, or no objective with the law's 5 parameters' runs.
    """
    use_json(ctx, json_output)
    from dlmspec.scaling.runs import LOSS_SOURCES

    folders = list(runs or [])
    unstarted = []
    if sweep is not None:
        from dlmspec.scaling.runs import sweep_runs, sweep_unstarted

        folders += sweep_runs(sweep)
        unstarted = sweep_unstarted(sweep)
    if not folders:
        raise _issue("RUN...", None, "no run folder given", "dlmspec fit runs/a runs/b ... or dlmspec fit --sweep runs/")
    if loss not in LOSS_SOURCES:
        raise _issue("--loss", loss, "not a loss source", "--loss auto, --loss eval (eval.json) or --loss valid "
                     "(metrics.jsonl valid records)")
    if bootstrap < 0:
        raise _issue("--bootstrap", bootstrap, "a negative number of resamples", "--bootstrap 200 (0: no intervals)")
    if seed < 0:
        raise _issue("--seed", seed, "a negative seed", "--seed 0")
    starts = _grid(grid)
    from dlmspec.scaling.runs import RunPoint, by_objective, read_point
    from dlmspec.scaling.study import fit_objectives

    points, skipped, warnings = [], list(unstarted), []
    for folder in dict.fromkeys(folders):  # a folder given twice counts once
        found = read_point(folder, loss=loss)
        (points if isinstance(found, RunPoint) else skipped).append(found)
        for note in getattr(found, "notes", []):
            warnings.append(SpecIssue("RUN", note, value=found.name, severity="warning", rule="fit-input",
                                      file=folder, source="dlmspec.scaling.runs"))
    present = list(by_objective(points))
    if objective is not None and objective not in present:
        raise _issue("--objective", objective, "no usable run trains this objective (objectives present: "
                     f"{', '.join(present) or 'none'})", f"--objective {present[0]}" if present else
                     "leave --objective out")
    kinds = [objective] if objective is not None else present
    paths = plot_paths(plot, kinds) if plot is not None else {}
    for path in paths.values():
        _check_plot(path, force)
    answer = fit_objectives(points, loss=loss, objective=objective, bootstrap=bootstrap, seed=seed, grid=starts)
    skipped += answer.skipped
    if not answer.fits:
        named = "; ".join(f"{s.name}: {s.why}" for s in skipped)
        whys = "; ".join(f"{kind}: {exc.why}" if len(answer.failed) > 1 else exc.why
                         for kind, exc in answer.failed.items()) or "no usable run"
        fix = (next(iter(answer.failed.values())).fix if answer.failed
               else "give run folders of dlmspec runs: a start record, train records with tokens_seen and a validation loss")
        raise _issue("RUN...", f"{len(points)} usable of {len(points) + len(skipped)} runs", whys,
                     fix + (f" (skipped: {named})" if named else "")) from None
    for kind, exc in answer.failed.items():
        warnings.append(SpecIssue("RUN...", f"objective {kind} is not fitted: {exc.why}", value=kind,
                                  hint=exc.fix, severity="warning", rule="fit-input", source="dlmspec.scaling.study"))
    drawn: dict[str, str] = {}
    for kind, study in answer.fits.items():
        if kind not in paths:
            continue
        try:
            from dlmspec.scaling.plot import draw

            draw(study, paths[kind])
        except ImportError:
            raise _issue("--plot", plot, "needs matplotlib, which is not installed",
                         "pip install matplotlib (or pip install 'dlmspec[viz]')") from None
        except OSError as exc:
            raise _issue("--plot", paths[kind], f"cannot be written ({exc.strerror or exc})", "give --plot in a folder "
                         "you can write", file=paths[kind]) from None
        drawn[kind] = paths[kind]
    several = len(kinds) > 1
    if json_output:
        skipped_rows = [s.as_dict() for s in skipped]
        if several:
            result: dict[str, Any] = {
                "objectives": {kind: dict(study.as_dict(), plot=drawn.get(kind)) for kind, study in answer.fits.items()},
                "not_fitted": {kind: {"why": exc.why, "fix": exc.fix} for kind, exc in answer.failed.items()},
                "skipped": skipped_rows}
        else:
            (study,) = answer.fits.values()
            result = study.as_dict()
            result["skipped"] = skipped_rows
            result["plot"] = drawn.get(study.objective) if plot is not None else None
        if answer.left_out:
            result["left_out"] = [{"run_dir": p.run_dir, "name": p.name, "objective": p.objective}
                                  for p in answer.left_out]
        print_envelope("fit", ok=True, issues=warnings, result=result)
        return
    report_warnings(warnings)
    for i, (kind, study) in enumerate(answer.fits.items()):
        _print(study, skipped if i == 0 else [])  # the skipped runs are named once, under the first fit
        if kind in drawn:
            stdout().print(f"wrote {shown(drawn[kind])}")
    if answer.left_out:
        stdout().print(f"left out {len(answer.left_out)} runs of other objectives (--objective {shown(objective)})")
