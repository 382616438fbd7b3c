"""SLURM: ``launch.sbatch`` from ``[cluster]`` and ``[cluster.slurm]`` (``dlmspec submit`` is :mod:`dlmspec.cli.submit`).

:func:`render_sbatch` turns a :class:`~dlmspec.resolve.Resolved` into a batch script
(``templates/launch.sbatch.j2``) that

* asks for ``nodes`` nodes and the GPUs of each (``--gpus-per-node=N``, ``--gres=gpu:N`` or
  nothing, per ``gpu_request``), and starts either one task per node running torchrun
  (``launcher = "torchrun"``) or one task per GPU with ``srun`` whose ``RANK``/``LOCAL_RANK``/
  ``WORLD_SIZE`` come from ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NTASKS`` for torch's
  ``env://`` rendezvous (``launcher = "srun"``);
* takes the rendezvous host from the allocation's first node (``scontrol show hostnames``) and a
  port from the job id (:func:`rendezvous_port`), exported as ``MASTER_ADDR``/``MASTER_PORT``;
* exports the spec's ``[cluster.slurm] env``; secrets (``WANDB_API_KEY``, ``HF_TOKEN``, ``DB_PASS``,
  ...: :func:`dlmspec.credentials.is_secret_name`) are refused there and read from the
  environment ``sbatch`` is called from, never written (secret-shaped values anywhere in the
  spec are the ``secret-in-spec`` rule's, :mod:`dlmspec.validate`);
* optionally runs in a container: pyxis/enroot (``srun --container-image``) or ``apptainer exec``;
* survives time limits: ``--signal=B:USR1@N`` and ``--requeue``; the script traps SIGUSR1,
  forwards it to the training processes (which save a checkpoint and exit with
  :data:`~dlmspec.errors.REQUEUE_EXIT_CODE`), then ``scontrol requeue``\\ s the job, whose next run resumes from the
  latest checkpoint.

Every spec value that reaches the script is either checked against a strict pattern (the whole
value: a trailing newline does not pass) or quoted by :mod:`dlmspec.render.escape`:
:func:`~dlmspec.render.escape.shell_word` for shell words, :func:`~dlmspec.render.escape.sbatch_value` for
``#SBATCH`` lines (which sbatch parses itself, never a shell), :func:`~dlmspec.render.escape.comment` for
the header comment. Control characters (newlines included) are refused in ``#SBATCH`` values so
no value can start a line of its own, and a container image or mount starting with ``-`` is
refused so none becomes an option of ``apptainer``.

CPU check mode (no GPUs needed), chosen at submit time in the environment of ``sbatch``:
``DLMSPEC_CHECK_MODE=env`` runs ``python -m dlmspec.backends.launch.check`` instead of ``train.py``
(rendezvous over gloo, check world size, ranks and environment, write a JSON report to
``DLMSPEC_CHECK_REPORT``); ``DLMSPEC_CHECK_MODE=train`` runs its simulated long job that
checkpoints on SIGUSR1 and resumes after a requeue (state in ``DLMSPEC_CHECK_DIR``).

Nothing here imports torch or megatron.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from dlmspec import __version__
from dlmspec.credentials import HIDDEN, NEVER_WRITTEN, is_secret_name
from dlmspec.errors import REQUEUE_EXIT_CODE, SpecError, SpecIssue
from dlmspec.render.escape import comment, sbatch_value, shell_word
from dlmspec.resolve import Resolved
from dlmspec.templates import TEMPLATE_DIR

if TYPE_CHECKING:
    from dlmspec.spec.models import SlurmSpec

#: Rendezvous ports are ``PORT_BASE + job_id % PORT_SPAN``: 10000-29999, below Linux's default
#: ephemeral range (32768-60999), so an outgoing connection never holds the port.
PORT_BASE = 10000
PORT_SPAN = 20000

#: ``--signal`` takes at most 65535 seconds (SLURM stores it in 16 bits, sbatch(1)).
MAX_SIGNAL_SECONDS = 0xFFFF

#: Environment names the script sets itself (torch's rendezvous, SLURM's own, dlmspec's
#: run-time switches); ``[cluster.slurm] env`` may not set them.
RESERVED_ENV = re.compile(
    r"^(MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK"
    r"|SLURM_.*|SBATCH_.*|SRUN_.*|DLMSPEC_.*|TORCHELASTIC_.*|PET_.*)$"
)

#: Secrets the script checks for at run time (a warning when unset; it never prints values).
RUNTIME_SECRETS = ("WANDB_API_KEY",)

# The strict forms of SLURM values, matched with fullmatch (``$`` would also match before a
# trailing newline, which would then end the #SBATCH line).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_LIST = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")
_HOSTLIST = re.compile(r"[A-Za-z0-9_.\-\[\],]+")
_GPU_TYPE = re.compile(r"[A-Za-z0-9_.+-]+")
_MEM = re.compile(r"[0-9]+[KMGT]?")
_TIME = re.compile(r"(?:(?P<days>[0-9]+)-(?P<dh>[0-9]+)(?::(?P<dm>[0-9]+)(?::(?P<ds>[0-9]+))?)?"
                   r"|(?P<a>[0-9]+)(?::(?P<b>[0-9]+)(?::(?P<c>[0-9]+))?)?)")


# --------------------------------------------------------------------------------------------
# Values.


def time_limit_seconds(text: str) -> int | None:
    """Seconds in a SLURM time limit, or None for ``UNLIMITED``/``INFINITE``.

    Formats (sbatch(1) ``--time``): ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.

    Raises:
        ValueError: anything else.
    """
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = _TIME.fullmatch(text)
    if not match:
        raise ValueError("not a SLURM time")
    g = {k: int(v) if v is not None else None for k, v in match.groupdict().items()}
    if g["days"] is not None:
        return g["days"] * 86400 + g["dh"] * 3600 + (g["dm"] or 0) * 60 + (g["ds"] or 0)
    if g["c"] is not None:
        return g["a"] * 3600 + g["b"] * 60 + g["c"]
    return g["a"] * 60 + (g["b"] or 0)


def rendezvous_port(job_id: int) -> int:
    """``MASTER_PORT`` of job ``job_id``: ``PORT_BASE + job_id % PORT_SPAN`` (10000-29999).

    The script computes the same in bash; :mod:`dlmspec.backends.launch.check` checks they agree.
    Jobs whose ids differ by less than ``PORT_SPAN`` never share a port."""
    return PORT_BASE + job_id % PORT_SPAN


def slurm_settings(resolved: Resolved) -> SlurmSpec:
    """``[cluster.slurm]`` of the spec, or its defaults when the table is absent (a
    :class:`~dlmspec.spec.fast.SpecTable` for a spec loaded with ``fast=True``: no pydantic)."""
    slurm = resolved.spec.cluster.slurm
    if slurm:
        return slurm
    from dlmspec.spec.fast import section_defaults

    return section_defaults(resolved.spec, "SlurmSpec")


def job_name(resolved: Resolved) -> str:
    """``cluster.slurm.job_name`` when written in the spec, else the spec's ``name``."""
    slurm = resolved.spec.cluster.slurm
    if slurm is not None and "job_name" in slurm.model_fields_set:
        return slurm.job_name
    return resolved.spec.name


# --------------------------------------------------------------------------------------------
# Checks.


@dataclass
class _Issues:
    """Collects :class:`SpecIssue` s with file/line from a loaded spec when there is one."""

    locate: Callable[[str], tuple[str | None, int | None]] | None
    found: list[SpecIssue] = field(default_factory=list)

    def add(self, key: str, message: str, value: Any, hint: str, rule: str) -> None:
        file, line = self.locate(key) if self.locate else (None, None)
        self.found.append(SpecIssue(key=key, message=message, value=value, hint=hint, rule=rule,
                                    source="dlmspec.render.sbatch", file=file, line=line))


def sbatch_issues(resolved: Resolved, loaded: Any = None) -> list[SpecIssue]:
    """Every problem that stops :func:`render_sbatch` (all errors; empty when it renders).

    Args:
        resolved: the resolved spec.
        loaded: the :class:`~dlmspec.spec.load.LoadedSpec` it came from, for file and line.
    """
    spec = resolved.spec
    slurm = slurm_settings(resolved)
    issues = _Issues(loaded.locate if loaded is not None else None)
    base = "cluster.slurm"

    def strict(key: str, value: str | None, pattern: re.Pattern[str], what: str, hint: str) -> None:
        if value is not None and not pattern.fullmatch(value):
            issues.add(f"{base}.{key}", f"not a valid {what}", value, hint, "slurm-value")

    strict("partition", slurm.partition, _NAME_LIST, "partition name (letters, digits, _ . + -; "
           "several separated by commas)", 'e.g. partition = "gpu"')
    strict("account", slurm.account, _NAME_LIST, "account name (letters, digits, _ . + -)", 'e.g. account = "proj123"')
    strict("qos", slurm.qos, _NAME_LIST, "QOS name (letters, digits, _ . + -)", 'e.g. qos = "normal"')
    strict("exclude", slurm.exclude, _HOSTLIST, "host list (names, ranges in brackets, commas)",
           'e.g. exclude = "node[01-03],node07"')
    strict("gpu_type", slurm.gpu_type, _GPU_TYPE, "GPU type (letters, digits, _ . + -)", 'e.g. gpu_type = "a100"')
    if slurm.mem is not None and not _MEM.fullmatch(slurm.mem):
        issues.add(f"{base}.mem", "not a SLURM memory size", slurm.mem,
                   'a number with an optional K, M, G or T suffix, e.g. mem = "480G" ("0": all of the node)',
                   "slurm-value")
    for key, value in (("job_name", job_name(resolved)), ("output", slurm.output), ("constraint", slurm.constraint)):
        if value is None:
            continue
        try:
            sbatch_value(value)
        except ValueError as exc:
            where = f"{base}.{key}" if key != "job_name" or "job_name" in slurm.model_fields_set else "name"
            issues.add(where, str(exc), value, "write it on one line without control characters", "slurm-value")
    name = job_name(resolved)
    if "/" in name and "%x" in slurm.output:
        where = f"{base}.job_name" if "job_name" in slurm.model_fields_set else "name"
        issues.add(where, "a job name with '/' puts the log in a directory that does not exist "
                   f"(cluster.slurm.output {slurm.output!r} holds %x, the job name)", name,
                   "use a name without '/', or an output path without %x", "slurm-value")
    try:
        limit = time_limit_seconds(slurm.time)
    except ValueError:
        issues.add(f"{base}.time", "not a SLURM time limit", slurm.time,
                   'use MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. time = "04:00:00"', "slurm-time")
    else:
        signal = slurm.signal_seconds_before_end
        if signal > MAX_SIGNAL_SECONDS:
            issues.add(f"{base}.signal_seconds_before_end", f"SLURM's --signal takes at most {MAX_SIGNAL_SECONDS} s",
                       signal, "use the time a checkpoint needs plus a margin, e.g. 300", "slurm-signal")
        elif limit is not None and signal >= limit:
            issues.add(f"{base}.signal_seconds_before_end",
                       f"the signal would come at or before the start: the time limit is {slurm.time} ({limit} s)",
                       signal, f"use less than {limit} s, or a longer cluster.slurm.time", "slurm-signal")
    for name, value in sorted(slurm.env.items()):
        key = f"{base}.env.{name}"
        if not _ENV_NAME.fullmatch(name):
            issues.add(key, "not an environment variable name", name,
                       "letters, digits and _, not starting with a digit, e.g. NCCL_DEBUG", "slurm-env")
        elif is_secret_name(name):  # refused: it would be written into launch.sbatch
            issues.add(key, f"looks like a secret; {NEVER_WRITTEN}", HIDDEN,
                       f"remove it from the spec and export {name} in the shell you run sbatch from "
                       "(the job inherits it)", "slurm-secret")
        elif RESERVED_ENV.match(name):
            issues.add(key, "set by the launch script itself (rendezvous, SLURM or dlmspec)", name,
                       "remove it from [cluster.slurm] env", "slurm-env")
        elif "\x00" in value:
            issues.add(key, "a NUL character cannot be passed in the environment", value,
                       "remove the NUL character", "slurm-env")
        elif any("\ud800" <= ch <= "\udfff" for ch in value):
            issues.add(key, "holds a lone surrogate (half of a UTF-16 pair), which is not a character and "
                       "cannot be written into the UTF-8 script", value, "write the character itself", "slurm-env")
    if slurm.container_image is not None:
        image = slurm.container_image
        if image == "" or image.startswith("-") or any(not ch.isprintable() for ch in image):
            issues.add(f"{base}.container_image", "empty, starts with '-' (it would be read as an option) or "
                       "holds control characters", image,
                       'e.g. container_image = "nvcr.io#nvidia/pytorch:25.01-py3"', "slurm-container")
    for index, mount in enumerate(slurm.container_mounts):
        bad = mount == "" or mount.startswith("-") or any(not ch.isprintable() for ch in mount) or (
            slurm.container_runtime == "pyxis" and "," in mount)
        if bad:
            issues.add(f"{base}.container_mounts", f"mount {index} is empty, starts with '-' (it would be read as "
                       "an option), holds control characters, or (pyxis) a comma, which separates mounts", mount,
                       'one SRC[:DST[:FLAGS]] per entry, e.g. "/lustre:/lustre"', "slurm-container")
    if slurm.container_mounts and slurm.container_image is None:
        issues.add(f"{base}.container_mounts", "mounts without a container image", slurm.container_mounts,
                   "set cluster.slurm.container_image, or remove the mounts", "slurm-container")
    if resolved.world_size != spec.cluster.nodes * spec.cluster.gpus_per_node:  # pragma: no cover - resolve's invariant
        issues.add("cluster", "world size disagrees with nodes * gpus_per_node", resolved.world_size,
                   "report this as a bug", "slurm-world")
    return issues.found


# --------------------------------------------------------------------------------------------
# Rendering.


def sbatch_directives(resolved: Resolved) -> list[str]:
    """The ``#SBATCH`` options, each ``--name`` or ``--name=value`` (value already
    :func:`~dlmspec.render.escape.sbatch_value` d), in the order they are written. Assumes :func:`sbatch_issues` found
    nothing."""
    cluster = resolved.spec.cluster
    slurm = slurm_settings(resolved)
    gpus = cluster.gpus_per_node
    typed = f"{slurm.gpu_type}:{gpus}" if slurm.gpu_type else str(gpus)
    tasks_per_node = 1 if slurm.launcher == "torchrun" else gpus
    out = [f"--job-name={sbatch_value(job_name(resolved))}", f"--nodes={cluster.nodes}",
           f"--ntasks-per-node={tasks_per_node}"]
    if slurm.gpu_request == "gpus-per-node":
        out.append(f"--gpus-per-node={typed}")
    elif slurm.gpu_request == "gres":
        out.append(f"--gres=gpu:{typed}")
    if slurm.cpus_per_task is not None:
        out.append(f"--cpus-per-task={slurm.cpus_per_task}")
    if slurm.mem is not None:
        out.append(f"--mem={slurm.mem}")
    out.append(f"--time={sbatch_value(slurm.time)}")
    for key in ("partition", "account", "qos"):
        value = getattr(slurm, key)
        if value is not None:
            out.append(f"--{key}={sbatch_value(value)}")
    out.append(f"--output={sbatch_value(slurm.output)}")
    out.append("--open-mode=append")
    if slurm.exclusive:
        out.append("--exclusive")
    if slurm.constraint is not None:
        out.append(f"--constraint={sbatch_value(slurm.constraint)}")
    if slurm.exclude is not None:
        out.append(f"--exclude={sbatch_value(slurm.exclude)}")
    out.append(f"--signal=B:USR1@{slurm.signal_seconds_before_end}")
    out.append("--requeue" if slurm.requeue else "--no-requeue")
    return out


def _words(*items: str) -> list[str]:
    return [shell_word(i) for i in items]


def sbatch_context(resolved: Resolved) -> dict[str, Any]:
    """What ``templates/launch.sbatch.j2`` reads. Every string that becomes shell code is a
    :func:`~dlmspec.render.escape.shell_word` here; the template adds only fixed text and integers.

    Keys: ``name`` (comment-safe spec name), ``version``, ``directives``
    (:func:`sbatch_directives`), ``nodes``, ``gpus_per_node``, ``world_size``, ``launcher``,
    ``env`` (name, quoted value) pairs, ``srun_options`` (quoted words, each after a space) and
    ``container_prefix`` (quoted words, each before a space),
    ``check_options`` (quoted words passed to ``dlmspec.backends.launch.check``), ``signal_seconds``,
    ``requeue``, ``requeue_exit``, ``port_base``, ``port_span``, ``wandb`` (check
    ``WANDB_API_KEY`` at run time).
    """
    spec = resolved.spec
    cluster = spec.cluster
    slurm = slurm_settings(resolved)
    srun: list[str] = []
    if slurm.cpus_per_task is not None:
        # srun does not inherit sbatch's --cpus-per-task in every SLURM release (22.05-23.02).
        srun.append(f"--cpus-per-task={slurm.cpus_per_task}")
    prefix: list[str] = []
    if slurm.container_image is not None:
        if slurm.container_runtime == "pyxis":
            srun += _words(f"--container-image={slurm.container_image}")
            if slurm.container_mounts:
                srun += _words("--container-mounts=" + ",".join(slurm.container_mounts))
            srun.append('--container-workdir="$PWD"')
        else:
            prefix = ["apptainer", "exec"]
            if slurm.gpu_request != "none":
                prefix.append("--nv")
            for mount in slurm.container_mounts:
                prefix += ["--bind", shell_word(mount)]
            prefix.append(shell_word(slurm.container_image))
    env = [(name, shell_word(value)) for name, value in sorted(slurm.env.items())]
    check = ["--nodes", str(cluster.nodes), "--nproc-per-node", str(cluster.gpus_per_node),
             "--launcher", slurm.launcher]
    for name, value in sorted(slurm.env.items()):
        check += ["--expect-env", shell_word(f"{name}={value}")]
    return {
        "name": comment(spec.name),
        "version": __version__,
        "directives": sbatch_directives(resolved),
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "world_size": resolved.world_size,
        "launcher": slurm.launcher,
        "env": env,
        "srun_options": "".join(" " + word for word in srun),
        "container_prefix": "".join(word + " " for word in prefix),
        "check_options": check,
        "signal_seconds": slurm.signal_seconds_before_end,
        "requeue": slurm.requeue,
        "requeue_exit": REQUEUE_EXIT_CODE,
        "port_base": PORT_BASE,
        "port_span": PORT_SPAN,
        "wandb": spec.logging.wandb_project is not None,
        "runtime_secrets": RUNTIME_SECRETS,
    }


def render_sbatch(resolved: Resolved, loaded: Any = None) -> str:
    """The text of ``launch.sbatch`` for ``resolved`` (pure: same spec, same bytes).

    Args:
        resolved: the resolved spec; its ``[cluster]`` and ``[cluster.slurm]`` (defaults when
            absent) decide the script.
        loaded: optionally the :class:`~dlmspec.spec.load.LoadedSpec`, so errors name file and line.

    Returns:
        The script, starting ``#!/bin/bash``, ending in a newline.

    Raises:
        SpecError: any problem :func:`sbatch_issues` finds (all of them).
    """
    import jinja2

    issues = sbatch_issues(resolved, loaded)
    if issues:
        raise SpecError(issues)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        # bash's ${#array[@]} would open a jinja comment; the template has no comments.
        comment_start_string="{##",
        comment_end_string="##}",
    )
    return env.get_template("launch.sbatch.j2").render(sbatch_context(resolved))
