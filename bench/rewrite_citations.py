"""Rewrite citations of renamed benchmark results in the repository's text.

    python bench/rewrite_citations.py            # rewrite in place, print each file changed
    python bench/rewrite_citations.py --check    # exit 1 naming the files that still cite an old path

Reads ``bench/results/renames.json`` (``{"renames": {old path: new path}}``; a folder maps every path
under it) and replaces, in README.md, CHANGELOG.md, CONTRIBUTING.md and the text files (``.md``,
``.py``, ``.sh``, ``.toml``, ``.j2``, ``.txt``) under docs/, dlmspec/, backends/, tests/, specs/,
templates/ and bench/ (not the measured data under bench/results/ and bench/calibration/):

* each old path, written out (``bench/results/x.json``, ``bench/results/dir/file``), by the new one;
* each old result file name written alone (``old_name.json``), when no other renamed
  path has that name: by the new file name when it stayed in its folder, else (in files other than
  ``.py``) by the new path.

A path is replaced only where it ends (the next character is not a letter, digit, ``_`` or ``-``,
nor a ``.`` followed by one), so ``bench/results/a`` does not rewrite ``bench/results/a.json``. Files are written through
:func:`dlmspec.files.write_atomic`. Idempotent: a second run changes nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RENAMES = ROOT / "bench" / "results" / "renames.json"
TOP_FILES = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")
FOLDERS = ("docs", "dlmspec", "backends", "tests", "specs", "templates", "bench")
SUFFIXES = {".md", ".py", ".sh", ".toml", ".j2", ".txt"}
SKIP = ("bench/results/", "bench/calibration/local/", "bench/calibration/te/", "tests/golden/")


def load_renames(path: Path = RENAMES) -> dict[str, str]:
    """old -> new from ``renames.json`` (read through :mod:`dlmspec.files`)."""
    sys.path.insert(0, str(ROOT)) if str(ROOT) not in sys.path else None
    from dlmspec.files import read_json

    data = read_json(path)
    renames = data.get("renames") if isinstance(data, dict) else None
    if not isinstance(renames, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in renames.items()):
        raise SystemExit(f"{path}: 'renames' must map old path strings to new path strings")
    return renames


def rewriter(renames: dict[str, str]):
    """A function ``(text, suffix) -> rewritten text`` for ``renames``. A bare file name becomes
    the new file name when the file stayed in its folder; when it moved to another folder, the new
    path, in prose files only (not ``.py``: there a bare name is usually joined to a folder in code)."""
    end = r"(?![\w-]|\.\w)"  # a sentence's full stop may follow a path
    full = [(re.compile(re.escape(old) + end), new) for old, new in sorted(renames.items(), key=lambda kv: -len(kv[0]))]
    names: dict[str, list[tuple[str, str]]] = {}
    for old, new in renames.items():
        if "." in Path(old).name and old.startswith("bench/results/"):
            names.setdefault(Path(old).name, []).append((old, new))
    bare = []
    for name, pairs in sorted(names.items(), key=lambda kv: -len(kv[0])):
        if len(pairs) == 1:
            old, new = pairs[0]
            same_folder = Path(old).parent == Path(new).parent
            bare.append((re.compile(r"(?<![\w./-])" + re.escape(name) + end), Path(new).name if same_folder else new,
                         same_folder))

    def rewrite(text: str, suffix: str = ".md") -> str:
        for pattern, new in full:
            text = pattern.sub(new.replace("\\", "\\\\"), text)
        for pattern, new, same_folder in bare:
            if same_folder or suffix != ".py":
                text = pattern.sub(new.replace("\\", "\\\\"), text)
        return text

    return rewrite


def targets(root: Path = ROOT) -> list[Path]:
    """The files the rewrite reads."""
    out = [root / f for f in TOP_FILES if (root / f).is_file()]
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_file() and not path.is_symlink() and path.suffix in SUFFIXES and not rel.startswith(SKIP) \
                    and "__pycache__" not in rel and rel != "bench/rewrite_citations.py":
                out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file cites an old path")
    p.add_argument("--root", default=str(ROOT), help="repository root (default: this checkout)")
    p.add_argument("--only", action="append", default=[], metavar="PREFIX",
                   help="only files whose repository path starts with PREFIX (repeatable), e.g. --only tests/")
    args = p.parse_args(argv)
    root = Path(args.root)
    from dlmspec.files import read_text, write_atomic

    rewrite = rewriter(load_renames(root / "bench" / "results" / "renames.json"))
    changed = []
    for path in targets(root):
        if args.only and not path.relative_to(root).as_posix().startswith(tuple(args.only)):
            continue
        text = read_text(path)
        new = rewrite(text, path.suffix)
        if new != text:
            changed.append(path.relative_to(root).as_posix())
            if not args.check:
                write_atomic(path, new)
    for rel in changed:
        print(("cites an old path: " if args.check else "rewrote ") + rel)
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
