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
  spec are the ``secret-in-spec`` rule's, :mod:`dlmspec.check.strings`);
* optionally runs in a container: pyxis/enroot (``srun --container-image``) or ``apptainer exec``;
* survives time limits: ``--signal=B:USR1@N`` and ``--requeue``; the script traps SIGUSR1,
  forwards it to the training processes (which save a checkpoint and exit with
  :data:`~dlmspec.errors.REQUEUE_EXIT_CODE`), then ``scontrol requeue``\\ s the job, whose next run resumes from the
  latest checkpoint.

Every spec value that reaches the script is either checked against a strict pattern by the
``slurm`` rules (:mod:`dlmspec.check.slurm`; the whole value: a trailing newline does not pass)
or quoted by :mod:`dlmspec.escape`:
:func:`~dlmspec.escape.shell_word` for shell words, :func:`~dlmspec.escape.sbatch_value` for
``#SBATCH`` lines (which sbatch parses itself, never a shell), :func:`~dlmspec.escape.comment` for
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

import functools
from typing import Any

from dlmspec import __version__
from dlmspec.check import issues_for
from dlmspec.errors import REQUEUE_EXIT_CODE, SpecError
from dlmspec.escape import comment, sbatch_value, shell_word
from dlmspec.render.launch_env import PREFLIGHT_ARGS, environment_block, torchrun_probe
from dlmspec.resolve import Resolved, job_name, slurm_settings
from dlmspec.templates import environment

#: Rendezvous ports are ``PORT_BASE + job_id % PORT_SPAN``: 10000-29999, below Linux's default
#: ephemeral range (32768-60999), so an outgoing connection never holds the port.
PORT_BASE = 10000
PORT_SPAN = 20000

#: Secrets the script checks for at run time (a warning when unset; it never prints values).
RUNTIME_SECRETS = ("WANDB_API_KEY",)


# --------------------------------------------------------------------------------------------
# Values.


def rendezvous_port(job_id: int) -> int:
    """``MASTER_PORT`` of job ``job_id``: ``PORT_BASE + job_id % PORT_SPAN`` (10000-29999).

    The script computes the same in bash; :mod:`dlmspec.backends.launch.check` checks they agree.
    Jobs whose ids differ by less than ``PORT_SPAN`` never share a port."""
    return PORT_BASE + job_id % PORT_SPAN


# --------------------------------------------------------------------------------------------
# Rendering.


def sbatch_directives(resolved: Resolved) -> list[str]:
    """The ``#SBATCH`` options, each ``--name`` or ``--name=value`` (value already
    :func:`~dlmspec.escape.sbatch_value` d), in the order they are written. Assumes the ``slurm``
    rules (:mod:`dlmspec.check.slurm`) found nothing."""
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
    :func:`~dlmspec.escape.shell_word` here; the template adds only fixed text and integers.

    Keys: ``name`` (comment-safe spec name), ``version``, ``directives``
    (:func:`sbatch_directives`), ``nodes``, ``gpus_per_node``, ``world_size``, ``launcher``,
    ``env`` (name, quoted value) pairs, ``srun_options`` (quoted words, each after a space) and
    ``container_prefix`` (quoted words, each before a space),
    ``check_options`` (quoted words passed to ``dlmspec.backends.launch.check``), ``signal_seconds``,
    ``requeue``, ``requeue_exit``, ``port_base``, ``port_span``, ``wandb`` (check
    ``WANDB_API_KEY`` at run time), ``launch_environment`` (the exports shared with launch.sh:
    :func:`dlmspec.render.launch_env.environment_block`), ``preflight_args`` (train.py's start-check
    arguments, :data:`~dlmspec.render.launch_env.PREFLIGHT_ARGS`), ``torchrun_probe`` (the per-node
    bash that picks the optional torchrun options its ``--help`` lists:
    :func:`~dlmspec.render.launch_env.torchrun_probe`).
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
        "wandb": spec.logging.wandb_project is not None and spec.logging.wandb_mode != "offline",
        "runtime_secrets": RUNTIME_SECRETS,
        "launch_environment": environment_block(resolved),
        "preflight_args": " ".join(shell_word(a) for a in PREFLIGHT_ARGS),
        "torchrun_probe": torchrun_probe(slurm.signal_seconds_before_end),
    }


def render_sbatch(resolved: Resolved, loaded: Any = None, *, python: str | None = None) -> str:
    """The text of ``launch.sbatch`` for ``resolved`` (pure: same spec, same bytes).

    Args:
        resolved: the resolved spec; its ``[cluster]`` and ``[cluster.slurm]`` (defaults when
            absent) decide the script.
        loaded: optionally the :class:`~dlmspec.spec.load.LoadedSpec`, so errors name file and line.
        python: the interpreter the job runs (``dlmspec compile --python``, already checked by
            :func:`dlmspec.render.compile.launch_interpreter`); ``None``: ``DLMSPEC_PYTHON`` at
            run time, else ``python3``.

    Returns:
        The script, starting ``#!/bin/bash``, ending in a newline.

    Raises:
        SpecError: any problem the ``slurm`` rules find (:mod:`dlmspec.check.slurm`, all of them).
    """
    issues = issues_for("sbatch", loaded if loaded is not None else resolved.spec, resolved)
    if issues:
        raise SpecError(issues)
    context = {**sbatch_context(resolved), "python": None if python is None else shell_word(python)}
    return _environment().get_template("launch.sbatch.j2").render(context)


@functools.lru_cache(maxsize=None)
def _environment() -> Any:
    """launch.sbatch.j2's environment, made once a process (it keeps the compiled template); bash's
    ``${#array[@]}`` would open a jinja comment, so comments are ``{## ... ##}`` (the template has none)."""
    return environment(comment_start_string="{##", comment_end_string="##}")
