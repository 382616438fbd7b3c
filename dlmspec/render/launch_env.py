"""What ``launch.sh`` and ``launch.sbatch`` both do before the training processes start: ONE
source for their environment, their pre-flight ``train.py --check``, and the torchrun options
each may pass.

* :func:`launch_environment`: the variables both scripts export (``CUDA_DEVICE_MAX_CONNECTIONS=1``
  for tensor/sequence parallelism, ``TORCH_NCCL_AVOID_RECORD_STREAMS``, ``NCCL_DEBUG``,
  ``OMP_NUM_THREADS``), and :func:`environment_block`, the bash lines that export them;
* :data:`PREFLIGHT_ARGS`: the arguments of train.py's one-process start check (data files, the
  checkpoint a resume loads, the GPUs), run before torchrun/srun start any rank, so a refusal is
  one message and exit code 2, not a failed-worker report from every rank;
* :data:`TORCHRUN_REQUIRED` / :data:`TORCHRUN_OPTIONAL`: the torchrun (``torch.distributed.run``)
  options launch.sbatch passes. Every required one is in every torch the runtime extra allows
  (``torch>=2.6``: the lists in ``torchrun_options.json``, extracted from each published wheel's
  ``torch/distributed/run.py`` by ``bench/launch/torchrun_options.py``); the optional ones
  (``--signals-to-handle``: torch 2.10+, ``--shutdown-timeout``: torch 2.12+) are passed only when
  ``torchrun --help`` on the node lists them (:func:`torchrun_probe`).

Every value reaching the scripts is a constant here or a :func:`~dlmspec.escape.shell_word`.
Nothing here imports torch or megatron.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dlmspec.escape import shell_word
from dlmspec.resolve import Resolved, runtime_values

#: The committed torchrun option lists, by torch version (``bench/launch/torchrun_options.py``).
TORCHRUN_OPTIONS_FILE = Path(__file__).with_name("torchrun_options.json")

#: ``train.py`` arguments of the pre-flight check both launchers run once before the ranks start.
PREFLIGHT_ARGS: tuple[str, ...] = ("--check",)

#: torchrun options launch.sbatch always passes (each in every torch >= 2.6).
TORCHRUN_REQUIRED: tuple[str, ...] = ("--node-rank", "--nnodes", "--nproc-per-node", "--max-restarts",
                                      "--master-addr", "--master-port")
#: torchrun options launch.sbatch passes torchrun for the time-limit signal when its ``--help``
#: lists them: forward SIGUSR1 to the workers (torch 2.10+; before, torchrun's default set,
#: SIGTERM/SIGINT/SIGHUP/SIGQUIT, does not include it, so the srun signal reaches torchrun only)
#: and wait for them to save (torch 2.12+; before, torchrun's fixed 30 s).
TORCHRUN_OPTIONAL: tuple[str, ...] = ("--signals-to-handle", "--shutdown-timeout")

#: Signals torchrun forwards to the workers when it takes ``--signals-to-handle``.
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


@dataclass(frozen=True)
class EnvVar:
    """One exported variable: ``name``; ``value`` (the text after ``=``, a shell word or
    ``${NAME:-default}``); ``why`` (the comment above it, one line)."""

    name: str
    value: str
    why: str


def launch_environment(resolved: Resolved) -> list[EnvVar]:
    """The variables launch.sh and launch.sbatch export before the training processes start.

    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` where :func:`dlmspec.resolve.runtime_values` says so (TP > 1
    or sequence parallel, never Megatron-FSDP): megatron-core relies on kernels being launched
    in issue order so TP communication overlaps compute (one hardware queue; Megatron-LM's
    examples set it). The others keep a value the caller's environment already has:
    ``TORCH_NCCL_AVOID_RECORD_STREAMS=1`` (the caching allocator frees communication buffers
    without recordStream: less memory held, as Megatron-LM's examples set it), ``NCCL_DEBUG=WARN``
    (warnings only), ``OMP_NUM_THREADS=1`` (torchrun's own default per worker: no CPU
    oversubscription by N ranks x all cores)."""
    out = []
    if runtime_values(resolved).cuda_device_max_connections_1:
        sp = " with sequence parallelism" if resolved.spec.parallel.sequence_parallel else ""
        out.append(EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "1",
                          f"tensor parallelism{sp}: megatron-core needs kernels launched in issue order"))
    out += [
        EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "${TORCH_NCCL_AVOID_RECORD_STREAMS:-1}",
               "NCCL buffers freed without recordStream (less memory held)"),
        EnvVar("NCCL_DEBUG", "${NCCL_DEBUG:-WARN}", "NCCL warnings only unless set"),
        EnvVar("OMP_NUM_THREADS", "${OMP_NUM_THREADS:-1}", "one CPU thread per rank unless set"),
    ]
    return out


def environment_block(resolved: Resolved) -> str:
    """The bash lines exporting :func:`launch_environment`, each after a ``#`` comment; ends in
    a newline. Used verbatim by both templates (``launch_environment`` in their context)."""
    lines = []
    for var in launch_environment(resolved):
        lines.append(f"# {var.why}")
        value = var.value if var.value.startswith("${") else shell_word(var.value)
        lines.append(f'export {var.name}="{value}"' if value.startswith("${") else f"export {var.name}={value}")
    return "\n".join(lines) + "\n"


def torchrun_probe(signal_seconds: int) -> str:
    """Bash lines (the start of launch.sbatch's per-node program, run as ``bash -c`` with ``$0``
    the Python, inside the container when there is one) that set the array ``optional`` to the
    :data:`TORCHRUN_OPTIONAL` options, with their values, that the node's torchrun takes: the
    option names listed by ``"$0" -m torch.distributed.run --help`` (argparse's option lines,
    two spaces then ``-``; the words before the help text, split at commas). Ends in a newline."""
    values = {"--signals-to-handle": TORCHRUN_SIGNALS, "--shutdown-timeout": str(int(signal_seconds))}
    lines = [
        "# The torchrun options this torch has (--signals-to-handle: 2.10+, --shutdown-timeout: 2.12+).",
        "takes=$(NO_COLOR=1 \"$0\" -m torch.distributed.run --help 2>/dev/null |",
        "  sed -n -e 's/^  \\(-[^ ].*\\)/\\1/p' | sed -e 's/  .*//' | tr ',' '\\n' | awk '{print $1}')",
        "optional=()",
    ]
    for name in TORCHRUN_OPTIONAL:
        lines.append(f'if grep -qx -e {name} <<<"$takes"; then optional+=({name}={values[name]}); fi')
    return "\n".join(lines) + "\n"


def torchrun_options() -> dict[str, list[str]]:
    """The committed option lists: torch version -> sorted ``--options`` of its torchrun."""
    data = json.loads(TORCHRUN_OPTIONS_FILE.read_text(encoding="utf-8"))
    return {version: entry["options"] for version, entry in data["versions"].items()}


__all__ = ["EnvVar", "PREFLIGHT_ARGS", "TORCHRUN_OPTIONAL", "TORCHRUN_REQUIRED", "TORCHRUN_SIGNALS",
           "environment_block", "launch_environment", "torchrun_options", "torchrun_probe"]
