"""What produced a run: the spec's content hash, the dlmspec version, the git commit of the
spec's repository and the library versions, read when the job starts.

Read at launch (never at compile time, so compiled files stay byte-identical from one commit to
the next); the record goes into the ``start`` line at the head of each launch's ``metrics.jsonl``,
into every checkpoint's ``dlmspec.json`` (``"provenance"``, beside the ``"spec"`` record) and into
the W&B run's config. ``dlmspec show RUN_DIR`` prints it (:mod:`dlmspec.cli.runs`).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from typing import Any, Dict, Optional

import dlmspec

#: Version of the record's layout (``"format"``); readers skip keys they do not know.
PROVENANCE_FORMAT = 1

#: Distributions whose versions are recorded: record key -> distribution names tried in turn
#: (read from the installed metadata: Transformer Engine is never imported for it).
LIBRARIES = {
    "torch": ("torch",),
    "megatron_core": ("megatron-core", "megatron_core"),
    "transformer_engine": ("transformer-engine", "transformer_engine", "transformer-engine-cu12"),
    "wandb": ("wandb",),
}

#: Seconds a ``git`` call may take before the record says ``None`` (a slow network file system
#: must not hold the job's start).
GIT_TIMEOUT_S = 10.0


def _git(cwd: str, *args: str) -> Optional[str]:
    """Output of ``git -C cwd ARGS`` (stripped), or ``None`` when git is missing, fails or times out."""
    try:
        done = subprocess.run(["git", "-C", cwd, *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(path: str) -> Optional[Dict[str, Any]]:
    """The git commit of the repository holding ``path``.

    Args:
        path: A directory inside the repository (the directory the job was launched from, which
            the spec's relative paths refer to).

    Returns:
        ``{"commit": <40 hex>, "dirty": bool, "root": <the work tree's top>}``; ``dirty`` is
        whether tracked files differ from the commit (untracked files do not count). ``None``
        when ``path`` is in no repository or git is not installed.
    """
    commit = _git(path, "rev-parse", "HEAD")
    if not commit:
        return None
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None,
            "root": _git(path, "rev-parse", "--show-toplevel")}


def library_versions() -> Dict[str, Optional[str]]:
    """Installed versions of :data:`LIBRARIES` (``None``: not installed), and Python's and CUDA's
    (``torch.version.cuda``, ``None`` on a CPU build)."""
    versions: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for key, names in LIBRARIES.items():
        versions[key] = None
        for name in names:
            try:
                versions[key] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    try:
        import torch  # the runtime has it; the record stays readable without

        versions["torch"] = torch.__version__
        versions["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - the runtime always has torch
        versions["cuda"] = None
    return versions


def collect(spec_hash: Optional[str], *, launch_dir: Optional[str] = None) -> Dict[str, Any]:
    """The provenance record of a run started now.

    Args:
        spec_hash: ``RunConfig.spec_hash`` (``"sha256:<hex>"``, the ``[lock] content_hash`` train.py
            was compiled with), or ``None``.
        launch_dir: Where to look for the spec's repository; default: the current directory (the
            job is launched from the directory the spec's relative paths refer to).

    Returns:
        ``{"format", "spec_hash", "dlmspec_version", "git", "versions"}``: ``git`` as
        :func:`git_state` (``None`` outside a repository), ``versions`` as :func:`library_versions`.
        JSON-serialisable; never raises for a missing tool or library.
    """
    return {
        "format": PROVENANCE_FORMAT,
        "spec_hash": spec_hash,
        "dlmspec_version": dlmspec.__version__,
        "git": git_state(launch_dir or os.getcwd()),
        "versions": library_versions(),
    }

