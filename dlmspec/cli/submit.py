"""``dlmspec submit``: compile specs if needed, then ``sbatch --parsable`` each; ``--dry-run``
prints the commands instead (:func:`dry_run_script`). The batch script itself is
:mod:`dlmspec.render.sbatch`'s.

Each argument is a stage, in order (``pretrain.toml sft.toml``: SFT starts when pretraining
succeeds): every job of a stage waits with ``--dependency=afterok:<ids>`` for all jobs of the
stage before. A Python sweep (:func:`dlmspec.spec.python_load.sweep_targets`) is one stage of
independent jobs, one per member, side by side. ``--after JOBID`` delays the first stage (each
member of a sweep)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from dlmspec.errors import SpecError, SpecIssue
from dlmspec.escape import shell_word
from dlmspec.resolve import slurm_settings

#: Where ``dlmspec submit SPEC`` compiles when no ``--output`` is given: ``compiled/<spec stem>``
#: under the working directory.
DEFAULT_COMPILE_ROOT = "compiled"

#: Seconds ``sbatch`` may take to answer before submit gives up.
SBATCH_TIMEOUT = 120

CHECK_MODES = ("env", "train")


@dataclass
class SubmitStep:
    """One job of ``dlmspec submit``.

    Attributes:
        target: the argument as given (a spec file or a compiled directory).
        directory: the compiled directory holding ``launch.sbatch``.
        files: rendered files to write first (spec targets; empty for a compiled directory or
            when the directory already holds exactly these files).
        output_dir: the directory of the job's ``--output`` file, created before sbatch when it
            does not exist (None when it needs nothing or holds a ``%`` pattern).
        name: the spec's name (or the directory's name).
        compile_command: the ``dlmspec compile`` command that writes ``files`` (for --dry-run).
        stage: the index of the argument it came from: jobs of one stage (a sweep's members)
            run side by side, each stage after the one before (:func:`stages`).
    """

    target: str
    directory: Path
    files: dict[str, str] = field(default_factory=dict)
    output_dir: Path | None = None
    name: str = ""
    compile_command: list[str] = field(default_factory=list)
    stage: int = 0

    @property
    def script(self) -> Path:
        return self.directory / "launch.sbatch"


def _submit_issue(key: str, message: str, value: Any, hint: str, rule: str = "submit") -> SpecError:
    return SpecError([SpecIssue(key=key, message=message, value=value, hint=hint, rule=rule, source="dlmspec.render.sbatch")])


def _output_dir(output: str | None) -> Path | None:
    if not output:
        return None
    parent = Path(output).parent
    if str(parent) in ("", ".") or "%" in str(parent):
        return None
    return parent


def _output_from_script(script: Path) -> str | None:
    """The ``--output`` value of a written ``launch.sbatch`` (unquoted as sbatch would)."""
    try:
        text = script.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    for line in text.splitlines():
        if line.startswith("#SBATCH --output="):
            value = line[len("#SBATCH --output="):]
            if value.startswith('"') and value.endswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            return value
    return None


def plan_submission(
    targets: Sequence[str],
    *,
    output: str | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    python: str | None = None,
) -> list[SubmitStep]:
    """Decide what :func:`submit` does for each target, writing nothing.

    A directory that holds ``launch.sbatch`` is submitted as it is. A spec file is loaded,
    checked and rendered (:mod:`dlmspec.render.compile`) for ``output`` (one target), or
    ``output/<spec stem>`` (several), or ``compiled/<spec stem>``; a directory that already
    holds exactly those files is reused, a different non-empty one needs ``force``. ``python``
    (``--python``) is the interpreter the compiled scripts run
    (:func:`dlmspec.render.compile.launch_interpreter`).

    Raises:
        SpecError: no targets, a missing target, a directory without ``launch.sbatch``, an
            invalid spec, a non-empty output directory without ``force``, an unusable ``python``.
    """
    from dlmspec.render import compile as compiler
    from dlmspec.spec.load import load
    from dlmspec.resolve import resolve

    python = compiler.launch_interpreter(python)

    from dlmspec.spec.python_load import sweep_targets
    from dlmspec.spec.sweep import split_member

    if not targets:
        raise _submit_issue("<targets>", "nothing to submit", None, "give a spec file or a compiled directory")
    given = len(targets)
    staged = [(stage, t) for stage, target in enumerate(targets)
              for t in (sweep_targets(target, overrides) if Path(target).is_file() else [target])]
    targets = [t for _, t in staged]
    steps: list[SubmitStep] = []
    used: dict[Path, str] = {}
    for stage, target in staged:
        path, member = split_member(target)
        if path.is_dir():
            if not (path / "launch.sbatch").is_file():
                raise _submit_issue("<target>", "the directory has no launch.sbatch", target,
                                    "give a directory written by `dlmspec compile`, or a spec file")
            if overrides:
                raise _submit_issue("--set", "--set applies to spec files, not to compiled directories", target,
                                    "compile again with --set, or give the spec file")
            if python is not None:
                raise _submit_issue("--python", "--python applies to spec files, not to compiled directories",
                                    target, "compile again with --python, or give the spec file")
            steps.append(SubmitStep(target, path, output_dir=_output_dir(_output_from_script(path / "launch.sbatch")),
                                    name=path.resolve().name, stage=stage))
            continue
        if not path.is_file():
            raise _submit_issue("<target>", "no such spec file or compiled directory", target,
                                "check the path")
        leaf = Path(path.stem, member) if member else Path(path.stem)
        if output is not None:
            directory = Path(output) if len(targets) == 1 else Path(output) / (leaf.name if given == 1 else leaf)
        else:
            directory = Path(DEFAULT_COMPILE_ROOT) / leaf
        if directory.resolve() in used:
            raise _submit_issue("--output", f"{target} and {used[directory.resolve()]} would compile into the "
                                "same directory", str(directory), "give spec files with different names")
        used[directory.resolve()] = target
        loaded = load(target, list(overrides))
        resolved = resolve(loaded.spec)
        compiler.check_spec(loaded, resolved)
        files = compiler.render(resolved, Path(target).as_posix(), python=python)
        command = ["dlmspec", "compile", target, "--output", str(directory)]
        for item in overrides:
            command += ["--set", item]
        if python is not None:
            command += ["--python", python]
        if directory.is_dir() and any(directory.iterdir()):
            same = all((directory / n).is_file() and (directory / n).read_text(encoding="utf-8") == text
                       for n, text in files.items())
            if same:
                files, command = {}, []
            elif not force:
                raise _submit_issue("--output", "the directory holds another compile (or other files)",
                                    str(directory), "pass --force to replace the generated files, or choose "
                                    "another directory with --output")
            else:
                compiler.check_output_dir(directory, force=True, names=files)  # before any job is submitted
                command.append("--force")
        steps.append(SubmitStep(target, directory, files, _output_dir(slurm_settings(resolved).output),
                                resolved.spec.name, command, stage))
    return steps


def stages(steps: Sequence[SubmitStep]) -> list[list[SubmitStep]]:
    """``steps`` grouped by :attr:`SubmitStep.stage`, in order (one group per argument)."""
    groups: list[list[SubmitStep]] = []
    for step in steps:
        if groups and groups[-1][0].stage == step.stage:
            groups[-1].append(step)
        else:
            groups.append([step])
    return groups


def sbatch_command(step: SubmitStep, after: str | None, sbatch_args: Sequence[str] = ()) -> list[str]:
    """``sbatch --parsable [--dependency=afterok:AFTER] [ARGS] DIR/launch.sbatch`` (``AFTER``:
    one job id, or several joined by ``:``, all of which must succeed)."""
    command = ["sbatch", "--parsable"]
    if after is not None:
        command.append(f"--dependency=afterok:{after}")
    return command + list(sbatch_args) + [str(step.script)]


def submit_environment(step: SubmitStep, check_mode: str | None) -> dict[str, str]:
    """The variables ``sbatch`` is given on top of the caller's environment (the job inherits
    them): ``DLMSPEC_COMPILED_DIR`` (absolute) and, for a check run, ``DLMSPEC_CHECK_MODE``."""
    env = {"DLMSPEC_COMPILED_DIR": str(step.directory.resolve())}
    if check_mode is not None:
        env["DLMSPEC_CHECK_MODE"] = check_mode
    return env


def dry_run_script(steps: Sequence[SubmitStep], *, check_mode: str | None = None,
                   sbatch_args: Sequence[str] = (), after: str | None = None) -> str:
    """What :func:`submit` would run, as a bash script: each job id in ``$jobN``; the jobs of a
    stage (a sweep's members, side by side) wait for every job of the stage before, the first
    stage for ``after`` (a job id, ``$job0``) when given. A comment heads each stage of several
    jobs and each stage after the first."""
    lines = [f"job0={shell_word(after)}  # --after: the first stage starts when this job succeeds"] if after else []
    waits: list[str] = ["$job0"] if after else []
    index = 0
    groups = stages(steps)
    for number, group in enumerate(groups, start=1):
        if len(group) > 1 or len(groups) > 1:
            what = (f"{len(group)} jobs side by side (a sweep's members)" if len(group) > 1 else "one job")
            when = f", after {' '.join(waits)} succeed{'s' if len(waits) == 1 else ''}" if waits else ""
            lines.append(f"# stage {number} of {len(groups)}: {what}{when}")
        ids = []
        for step in group:
            index += 1
            if step.compile_command:
                lines.append(" ".join(shell_word(w) for w in step.compile_command))
            if step.output_dir is not None and not step.output_dir.is_dir():
                lines.append(f"mkdir -p -- {shell_word(str(step.output_dir))}")
            env = " ".join(f"{k}={shell_word(v)}" for k, v in submit_environment(step, check_mode).items())
            command = sbatch_command(step, ":".join(waits) or None, sbatch_args)
            words = " ".join('"' + w + '"' if w.startswith("--dependency=") else shell_word(w) for w in command)
            lines.append(f"job{index}=$({env} {words})")
            ids.append(f"$job{index}")
        waits = ids
    return "\n".join(lines) + "\n"


@dataclass
class SubmittedJob:
    """A job :func:`submit` submitted: its id (``sbatch --parsable``), the step and the jobs it
    waits for (``after``: ids joined by ``:``, or None)."""

    job_id: str
    step: SubmitStep
    after: str | None


def submit(
    targets: Sequence[str],
    *,
    output: str | None = None,
    overrides: Sequence[str] = (),
    force: bool = False,
    dry_run: bool = False,
    check_mode: str | None = None,
    sbatch_args: Sequence[str] = (),
    echo: Callable[[str], None] = print,
    python: str | None = None,
    after: str | None = None,
) -> list[SubmittedJob]:
    """``dlmspec submit``: compile spec targets if needed, then ``sbatch --parsable`` each.
    Each target is a stage: its jobs wait with ``--dependency=afterok:<ids>`` for every job of
    the stage before (a chain of stages); a Python sweep's members are one stage of independent
    jobs, side by side.

    Args:
        targets: spec files and/or compiled directories, in submission order (stage order).
        output: where to compile (see :func:`plan_submission`).
        overrides: ``--set`` strings for every spec target.
        force: replace the generated files of a directory that holds another compile.
        dry_run: print (through ``echo``) the bash that would run, and do nothing.
        check_mode: ``"env"`` or ``"train"``: run the CPU check instead of train.py.
        sbatch_args: extra sbatch options (before the script).
        echo: where progress lines go.
        python: ``--python``: the interpreter compiled spec targets run (see :func:`plan_submission`).
        after: ``--after JOBID``: the first stage (each member of a sweep) waits for that job
            to succeed (afterok), so a chain can continue one submitted before.

    Returns:
        The jobs submitted (empty for a dry run).

    Raises:
        SpecError: what :func:`plan_submission` raises; an unknown check mode; ``sbatch`` not on
            PATH, not answering within :data:`SBATCH_TIMEOUT` s, refusing a script (its message
            is in the error; jobs already submitted are named) or answering without a job id.
    """
    if check_mode is not None and check_mode not in CHECK_MODES:
        raise _submit_issue("--check", "unknown check mode", check_mode, "use --check env or --check train")
    if after is not None and not re.fullmatch(r"[0-9]+(_[0-9]+)?", after):
        raise _submit_issue("--after", "not a SLURM job id", after, "give the number sbatch printed, e.g. --after 12345")
    steps = plan_submission(targets, output=output, overrides=overrides, force=force, python=python)
    if dry_run:
        echo(dry_run_script(steps, check_mode=check_mode, sbatch_args=sbatch_args, after=after).rstrip("\n"))
        return []
    import shutil  # here, not at the top: `dlmspec validate` checks the settings and submits nothing
    import subprocess

    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise _submit_issue("sbatch", "sbatch is not on PATH: this machine cannot submit SLURM jobs", None,
                            "run on a cluster login node, or use --dry-run to see the commands")
    from dlmspec.render import compile as compiler

    jobs: list[SubmittedJob] = []
    stage_ids: list[str] = []
    for step in steps:
        if jobs and step.stage != jobs[-1].step.stage:  # a new stage waits for all of the last
            after, stage_ids = ":".join(stage_ids), []
        if step.files:
            compiler.write_outputs(step.files, step.directory, force=True)
            echo(f"compiled {step.target} into {step.directory}")
        if step.output_dir is not None:
            try:
                step.output_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise _submit_issue("cluster.slurm.output", f"cannot create the log directory: {exc.strerror}",
                                    str(step.output_dir), "fix the permissions or change cluster.slurm.output") from None
        command = sbatch_command(step, after, sbatch_args)
        command[0] = sbatch
        env = dict(os.environ, **submit_environment(step, check_mode))
        done = ", ".join(f"{j.job_id} ({j.step.target})" for j in jobs)
        already = f"; already submitted: {done}" if done else ""
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=SBATCH_TIMEOUT,
                                    stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise _submit_issue("sbatch", f"sbatch did not answer within {SBATCH_TIMEOUT} s{already}", step.target,
                                "check that the SLURM controller is up (sinfo)") from None
        except OSError as exc:
            raise _submit_issue("sbatch", f"cannot run sbatch: {exc.strerror or exc}{already}", sbatch,
                                "check the SLURM client installation") from None
        message = " ".join((result.stderr or "").split()) or " ".join((result.stdout or "").split())
        if result.returncode != 0:
            raise _submit_issue("sbatch", f"sbatch refused {step.script}: {message or 'no message'} "
                                f"(exit {result.returncode}){already}", step.target,
                                "fix [cluster.slurm] (partition, account, time, GPUs) for this cluster and submit again")
        job_id = (result.stdout or "").strip().split(";")[0]
        if not job_id.isdigit():
            raise _submit_issue("sbatch", f"sbatch answered without a job id: {message!r}{already}", step.target,
                                "check the SLURM client")
        jobs.append(SubmittedJob(job_id, step, after))
        if not after:
            waits = ""
        elif ":" in after:
            waits = f" (after jobs {after.replace(':', ', ')} succeed)"
        else:
            waits = f" (after job {after} succeeds)"
        echo(f"submitted {step.name} as job {job_id}{waits}: {step.script}")
        stage_ids.append(job_id)
    return jobs
