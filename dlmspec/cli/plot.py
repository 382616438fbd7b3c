"""``dlmspec plot RUN_DIR [RUN_DIR...]``: a PNG of loss, validation loss and tokens/s against
steps, the runs side by side (one line each, named by the run's name), from their
``metrics.jsonl`` (:func:`dlmspec.cli.runs.read_run`); when a run scored generated answers during
training (``[eval.generation]``), their exact-match accuracy; when a run is an RL stage (its
``train`` records carry ``rl/reward_mean``), two more panels: the mean reward and the KL to the
reference (``rl/kl``, the k3 estimate backends/rl/loss.py logs), and no validation loss panel
when only RL runs are drawn (the stage has no validation feed).

matplotlib (the ``viz`` extra) is imported only when a plot is drawn, with its non-interactive
Agg backend. The PNG carries ``Software: dlmspec plot`` in its metadata: a later plot replaces a
file dlmspec drew, any other file only with ``--force``.
"""

from __future__ import annotations

import math
import os

import typer

from dlmspec.cli.app import app
from dlmspec.cli.help import Command
from dlmspec.cli.output import print_envelope, shown, use_json
from dlmspec.cli.runs import RunLog, read_run
from dlmspec.errors import SpecError, SpecIssue
from dlmspec.files import FileRefused, atomic_writer, open_regular
from dlmspec.wording import count

#: The PNG metadata that marks a file this command wrote (a ``tEXt`` chunk).
SOFTWARE = "dlmspec plot"

#: Values beyond this magnitude (infinities, 1e308) are left out: no metric reaches it, and
#: matplotlib cannot place ticks on an axis that spans them. NaN stays (a gap in the line).
MAX_DRAWN = 1e30

#: The panels: (title, event, key, y label).
PANELS = (
    ("training loss", "train", "loss", "loss (nats/token)"),
    ("validation loss", "valid", "loss", "loss (nats/token)"),
    ("throughput", "train", "tokens_per_s", "tokens/s"),
)

#: The RL stage's panels, drawn when any run logs ``rl/reward_mean`` (backends/rl/rollout.py
#: ``rollout_metrics``; ``rl/kl``: backends/rl/stage.py ``interval_metrics``).
RL_PANELS = (
    ("reward", "train", "rl/reward_mean", "mean reward of the rollouts"),
    ("KL to the reference", "train", "rl/kl", "KL (k3 estimate)"),
)


#: The panel of ``[eval.generation]``'s score (backends/megatron/generation_eval.py), drawn when
#: any run logs ``generation_accuracy`` in its ``eval`` records.
ACCURACY_PANEL = ("generation accuracy", "eval", "generation_accuracy", "exact-match accuracy (validation prompts)")


def panels_for(runs: list[RunLog]) -> tuple[tuple[str, str, str, str], ...]:
    """:data:`PANELS`, then :data:`ACCURACY_PANEL` when any of ``runs`` logged a generation
    accuracy, then :data:`RL_PANELS` when any logged an RL reward. The validation loss is left out
    when only RL runs are drawn and none logged one (an RL stage has no validation feed)."""
    def logged(event: str, key: str) -> bool:
        return any(log.series(event, key)[0] for log in runs)

    rl = [bool(log.series("train", RL_PANELS[0][2])[0]) for log in runs]
    panels = [p for p in PANELS if not (p[1] == "valid" and all(rl) and not logged("valid", p[2]))]
    if logged(ACCURACY_PANEL[1], ACCURACY_PANEL[2]):
        panels.append(ACCURACY_PANEL)
    if any(rl):
        panels.extend(RL_PANELS)
    return tuple(panels)


def written_by_dlmspec(path: str) -> bool:
    """Whether the PNG at ``path`` carries this command's ``Software`` tag (read from the first
    64 KiB: matplotlib writes its text chunks before the image data)."""
    try:
        fd = open_regular(path, what="--output")
    except FileRefused:  # a FIFO or device is never read (nor taken for a plot)
        return False
    with os.fdopen(fd, "rb") as f:
        try:
            head = f.read(65536)
        except OSError:
            return False
    return head.startswith(b"\x89PNG") and b"Software\x00" + SOFTWARE.encode() in head


def legend_label(name: str) -> str:
    """A run's name as matplotlib may draw it: :func:`dlmspec.cli.output.shown` (secrets hidden,
    control characters and lone surrogates escaped: FreeType cannot draw a surrogate), ``$``
    escaped (matplotlib reads ``$...$`` as mathtext, and a bad formula fails the drawing) and a
    leading ``_`` kept visible (matplotlib leaves labels starting with ``_`` out of the legend)."""
    text = shown(name).replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def draw(runs: list[RunLog], output: str) -> dict[str, int]:
    """Draw :func:`panels_for` ``runs`` into the PNG ``output`` (written whole into a file created
    exclusively beside it, then moved into place: :func:`dlmspec.files.atomic_writer`); each line
    is labelled by its run's name (and directory, where two runs share a name). Values larger
    than :data:`MAX_DRAWN` in magnitude are left out.

    Returns:
        Points drawn per panel (``{"training loss": 40, ...}``).

    Raises:
        SpecError: matplotlib is not installed (``--output`` is not written).
        OSError: the folder cannot be written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError([SpecIssue("dlmspec plot", "needs matplotlib, which is not installed", value=None,
                                   hint="pip install matplotlib (or pip install 'dlmspec[viz]')",
                                   rule="arguments")]) from None
    panels = panels_for(runs)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    # fixed margins: a layout engine takes twice the time of the drawing itself
    fig.subplots_adjust(left=0.055, right=0.985, bottom=0.13, top=0.92, wspace=0.3)
    points: dict[str, int] = {}
    names = [log.name for log in runs]
    labels = [legend_label(f"{name} ({log.run_dir})" if names.count(name) > 1 else name)
              for name, log in zip(names, runs)]
    for ax, (title, event, key, ylabel) in zip(axes, panels):
        points[title] = 0
        for log, label in zip(runs, labels):
            pairs = [(x, y) for x, y in zip(*log.series(event, key)) if math.isnan(y) or abs(y) <= MAX_DRAWN]
            steps, values = [x for x, _ in pairs], [y for _, y in pairs]
            if steps:
                ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3, label=label)
                points[title] += len(steps)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if points[title]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no {event} records", ha="center", va="center", transform=ax.transAxes)
    try:
        # a new file beside --output (created exclusively, never through a link), moved over it whole
        with atomic_writer(output) as handle:
            fig.savefig(handle, format="png", dpi=110, metadata={"Software": SOFTWARE})
    finally:
        plt.close(fig)
    return points


@app.command("plot", cls=Command)
def plot(
    ctx: typer.Context,
    run_dirs: list[str] = typer.Argument(..., metavar="RUN_DIR...", help="Run directories ([logging] run_dir: "
                                         "the folders holding metrics.jsonl), drawn side by side."),
    output: str = typer.Option("dlmspec-plot.png", "--output", "-o", help="The PNG to write."),
    force: bool = typer.Option(False, "--force", help="Replace --output even when dlmspec did not draw it."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Plot loss, validation loss and tokens/s against steps for one or more runs (a PNG); a run
    scoring generated answers adds their accuracy, an RL run its mean reward and its KL to the
    reference.

    Exit code 2 when a RUN_DIR holds no metrics.jsonl, --output is another file (without --force)
    or its folder does not exist, or matplotlib is missing.
    """
    use_json(ctx, json_output)
    runs = [read_run(d) for d in run_dirs]
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise SpecError([SpecIssue("--output", "is in a folder that does not exist", value=output, file=output,
                                   hint=f"create {parent} first, or give --output in an existing folder",
                                   rule="arguments")])
    if os.path.isdir(output) or os.path.islink(output):
        raise SpecError([SpecIssue("--output", "is a folder or a symbolic link", value=output, file=output,
                                   hint="give a file name, e.g. --output loss.png", rule="arguments")])
    if os.path.exists(output) and not force and not written_by_dlmspec(output):
        raise SpecError([SpecIssue("--output", "exists and was not drawn by dlmspec plot", value=output, file=output,
                                   hint="give another --output, or add --force to replace it", rule="arguments")])
    try:
        points = draw(runs, output)
    except OSError as exc:
        raise SpecError([SpecIssue("--output", f"cannot be written ({exc.strerror or exc})", value=output, file=output,
                                   hint="give --output in a folder you can write", rule="arguments")]) from None
    if json_output:
        print_envelope("plot", ok=True, result={"output": output, "runs": [r.run_dir for r in runs], "points": points})
    else:
        print(f"wrote {shown(output)}: " + ", ".join(f"{title} {n} points" for title, n in points.items())
              + f" from {count(len(runs), 'run')}")
