"""Rules of the ``[cluster.slurm]`` values ``launch.sbatch`` is rendered from (scope ``slurm``):
each value that reaches an ``#SBATCH`` line or the script's environment matches a strict form
(the whole value: a trailing newline does not pass), so none can start a line of its own or
become an option; :func:`dlmspec.render.sbatch.render_sbatch` refuses what these find."""

from __future__ import annotations

import re
from typing import Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.credentials import HIDDEN, NEVER_WRITTEN, is_secret_name, redact_text
from dlmspec.escape import sbatch_value
from dlmspec.resolve import job_name, slurm_settings

#: ``--signal`` takes at most 65535 seconds (SLURM stores it in 16 bits, sbatch(1)).
MAX_SIGNAL_SECONDS = 0xFFFF

#: Environment names the script sets itself (torch's rendezvous, SLURM's own, dlmspec's
#: run-time switches); ``[cluster.slurm] env`` may not set them.
RESERVED_ENV = re.compile(
    r"^(MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|NODE_RANK"
    r"|SLURM_.*|SBATCH_.*|SRUN_.*|DLMSPEC_.*|TORCHELASTIC_.*|PET_.*)$"
)

# The strict forms of SLURM values, matched with fullmatch (``$`` would also match before a
# trailing newline, which would then end the #SBATCH line).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME_LIST = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")
_HOSTLIST = re.compile(r"[A-Za-z0-9_.\-\[\],]+")
_GPU_TYPE = re.compile(r"[A-Za-z0-9_.+-]+")
_MEM = re.compile(r"[0-9]+[KMGT]?")
_TIME = re.compile(r"(?:(?P<days>[0-9]+)-(?P<dh>[0-9]+)(?::(?P<dm>[0-9]+)(?::(?P<ds>[0-9]+))?)?"
                   r"|(?P<a>[0-9]+)(?::(?P<b>[0-9]+)(?::(?P<c>[0-9]+))?)?)")

_BASE = "cluster.slurm"


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


@rule(
    "slurm-value",
    "error",
    "sbatch(1) --partition, --account, --qos, --exclude, --gres, --mem, --job-name, --output, --constraint "
    "(sbatch parses #SBATCH lines itself; a value ends at the line's end)",
    "SLURM names, host lists, GPU types and memory sizes have their strict forms; no control characters",
    scope="slurm",
)
def _slurm_value(ctx: Context) -> Iterator[Finding]:
    slurm = slurm_settings(ctx.r)
    for key, value, pattern, what, hint in (
        ("partition", slurm.partition, _NAME_LIST, "partition name (letters, digits, _ . + -; several separated by "
         "commas)", 'e.g. partition = "gpu"'),
        ("account", slurm.account, _NAME_LIST, "account name (letters, digits, _ . + -)", 'e.g. account = "proj123"'),
        ("qos", slurm.qos, _NAME_LIST, "QOS name (letters, digits, _ . + -)", 'e.g. qos = "normal"'),
        ("exclude", slurm.exclude, _HOSTLIST, "host list (names, ranges in brackets, commas)",
         'e.g. exclude = "node[01-03],node07"'),
        ("gpu_type", slurm.gpu_type, _GPU_TYPE, "GPU type (letters, digits, _ . + -)", 'e.g. gpu_type = "a100"'),
    ):
        if value is not None and not pattern.fullmatch(value):
            yield Finding(f"{_BASE}.{key}", f"not a valid {what}", hint, value=value)
    if slurm.mem is not None and not _MEM.fullmatch(slurm.mem):
        yield Finding(f"{_BASE}.mem", "not a SLURM memory size",
                      'a number with an optional K, M, G or T suffix, e.g. mem = "480G" ("0": all of the node)',
                      value=slurm.mem)
    name = job_name(ctx.r)
    for key, value in (("job_name", name), ("output", slurm.output), ("constraint", slurm.constraint)):
        if value is None:
            continue
        try:
            sbatch_value(value)
        except ValueError as exc:
            where = f"{_BASE}.{key}" if key != "job_name" or "job_name" in slurm.model_fields_set else "name"
            # secrets are hidden before the value is rewritten: the rewritten text would no longer
            # look like the secret it holds (secret-in-spec reports the secret itself)
            fix = Fix({where: "".join(ch for ch in redact_text(value) if ch.isprintable()).strip() or "run"})
            yield Finding(where, str(exc), f"write it on one line without control characters: {fix.text()}",
                          value=value, fix=fix)
    if "/" in name and "%x" in slurm.output:
        # the run's name and folders stay; a secret in the name is hidden before '/' becomes '-' (a
        # password of https://user:PASS@host/x would no longer look like one)
        fix = Fix({f"{_BASE}.job_name": redact_text(name).replace("/", "-")})
        where = f"{_BASE}.job_name" if "job_name" in slurm.model_fields_set else "name"
        yield Finding(where, "a job name with '/' puts the log in a directory that does not exist "
                      f"(cluster.slurm.output {slurm.output!r} holds %x, the job name)",
                      f"use a name without '/' ({fix.text()}), or an output path without %x", value=name, fix=fix)


@rule(
    "slurm-time",
    "error",
    "sbatch(1) --time (MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS[:MINUTES[:SECONDS]])",
    "cluster.slurm.time is a SLURM time limit",
    scope="slurm",
)
def _slurm_time(ctx: Context) -> Iterator[Finding]:
    slurm = slurm_settings(ctx.r)
    try:
        time_limit_seconds(slurm.time)
    except ValueError:
        yield Finding(f"{_BASE}.time", "not a SLURM time limit",
                      'use MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. time = "04:00:00"', value=slurm.time,
                      fix=Fix({f"{_BASE}.time": "04:00:00"}))


@rule(
    "slurm-signal",
    "error",
    "sbatch(1) --signal=B:USR1@SECONDS (at most 65535; sent that long before the time limit)",
    "the checkpoint signal comes after the start and within SLURM's limit",
    scope="slurm",
)
def _slurm_signal(ctx: Context) -> Iterator[Finding]:
    slurm = slurm_settings(ctx.r)
    try:
        limit = time_limit_seconds(slurm.time)
    except ValueError:
        return  # slurm-time
    signal = slurm.signal_seconds_before_end
    key = f"{_BASE}.signal_seconds_before_end"
    if signal > MAX_SIGNAL_SECONDS:
        fix = Fix({key: 300 if limit is None or limit > 600 else max(1, limit // 2)})
        yield Finding(key, f"SLURM's --signal takes at most {MAX_SIGNAL_SECONDS} s",
                      f"use the time a checkpoint needs plus a margin, e.g. signal_seconds_before_end = "
                      f"{fix.set[key]}", value=signal, fix=fix)
    elif limit is not None and signal >= limit:
        fix = Fix({key: max(1, min(300, limit // 2))})
        yield Finding(key, f"the signal would come at or before the start: the time limit is {slurm.time} ({limit} s)",
                      f"use less than {limit} s (e.g. signal_seconds_before_end = {fix.set[key]}), or a longer "
                      "cluster.slurm.time", value=signal, fix=fix)


@rule(
    "slurm-env",
    "error",
    "launch.sbatch exports [cluster.slurm] env (POSIX names; the script sets the rendezvous, SLURM and "
    "DLMSPEC_ variables itself; the environment carries no NUL)",
    "[cluster.slurm] env names are environment names the script does not set, with values it can write",
    scope="slurm",
)
def _slurm_env(ctx: Context) -> Iterator[Finding]:
    for name, value in sorted(slurm_settings(ctx.r).env.items()):
        key = f"{_BASE}.env.{name}"
        if not _ENV_NAME.fullmatch(name):
            # no fix of keys: the dotted key of a name that is not one cannot be written back
            yield Finding(key, "not an environment variable name",
                          "letters, digits and _, not starting with a digit, e.g. NCCL_DEBUG", value=name)
        elif is_secret_name(name):
            continue  # slurm-secret
        elif RESERVED_ENV.match(name):
            yield Finding(key, "set by the launch script itself (rendezvous, SLURM or dlmspec)",
                          f"remove {name} from [cluster.slurm] env", value=name, fix=Fix(unset=(key,)))
        elif "\x00" in value or any("\ud800" <= ch <= "\udfff" for ch in value):
            fix = Fix({key: "".join(ch for ch in value if ch != "\x00" and not "\ud800" <= ch <= "\udfff")})
            if "\x00" in value:
                yield Finding(key, "a NUL character cannot be passed in the environment",
                              f"remove the NUL character: {fix.text()}", value=value, fix=fix)
            else:
                yield Finding(key, "holds a lone surrogate (half of a UTF-16 pair), which is not a character and "
                              "cannot be written into the UTF-8 script",
                              f"write the character itself (without it: {fix.text()})", value=value, fix=fix)


@rule(
    "slurm-secret",
    "error",
    "dlmspec.credentials.is_secret_name (launch.sbatch is a file: a secret exported there is written to disk)",
    "[cluster.slurm] env holds no secret (WANDB_API_KEY, HF_TOKEN, ...): the job inherits those from sbatch's shell",
    scope="slurm",
)
def _slurm_secret(ctx: Context) -> Iterator[Finding]:
    for name in sorted(slurm_settings(ctx.r).env):
        if _ENV_NAME.fullmatch(name) and is_secret_name(name):  # refused: it would be written into launch.sbatch
            yield Finding(f"{_BASE}.env.{name}", f"looks like a secret; {NEVER_WRITTEN}",
                          f"remove it from the spec and export {name} in the shell you run sbatch from "
                          "(the job inherits it)", value=HIDDEN, fix=Fix(unset=(f"{_BASE}.env.{name}",)))


def _bad_word(text: str) -> bool:
    """Empty, an option (``-...``) or holding a control character."""
    return text == "" or text.startswith("-") or any(not ch.isprintable() for ch in text)


@rule(
    "slurm-container",
    "error",
    "pyxis srun --container-image / --container-mounts (comma-separated) and apptainer exec IMAGE --bind",
    "the container image and mounts are single words that are not options, and mounts come with an image",
    scope="slurm",
)
def _slurm_container(ctx: Context) -> Iterator[Finding]:
    slurm = slurm_settings(ctx.r)
    image = slurm.container_image
    if image is not None and _bad_word(image):
        # the image is the user's to name; removing it (and its mounts) runs the job outside a container
        fix = Fix(unset=(f"{_BASE}.container_image",) + ((f"{_BASE}.container_mounts",) if slurm.container_mounts else ()))
        yield Finding(f"{_BASE}.container_image", "empty, starts with '-' (it would be read as an option) or "
                      "holds control characters", 'e.g. container_image = "nvcr.io#nvidia/pytorch:25.01-py3", '
                      f"or {fix.text()} (no container)", value=image, fix=fix)
    good = [m for m in slurm.container_mounts
            if not (_bad_word(m) or (slurm.container_runtime == "pyxis" and "," in m))]
    keep = Fix({f"{_BASE}.container_mounts": good}) if good else Fix(unset=(f"{_BASE}.container_mounts",))
    for index, mount in enumerate(slurm.container_mounts):
        if _bad_word(mount) or (slurm.container_runtime == "pyxis" and "," in mount):
            yield Finding(f"{_BASE}.container_mounts", f"mount {index} is empty, starts with '-' (it would be read "
                          "as an option), holds control characters, or (pyxis) a comma, which separates mounts",
                          'one SRC[:DST[:FLAGS]] per entry, e.g. "/lustre:/lustre"; without the bad ones: '
                          f"{keep.text()}", value=mount, fix=keep)
    if slurm.container_mounts and image is None:
        yield Finding(f"{_BASE}.container_mounts", "mounts without a container image",
                      "remove cluster.slurm.container_mounts, or set cluster.slurm.container_image",
                      value=slurm.container_mounts, fix=Fix(unset=(f"{_BASE}.container_mounts",)))
