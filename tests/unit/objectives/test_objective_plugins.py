"""Objectives are plugins (dlmspec/objectives, backends/megatron/objectives): no module outside
them branches on an objective's kind by name (``kind == "mdm"``, ``!= "ar"``, ``in ("mdm", ...)``);
they ask the registration (``dlmspec.objectives.get(kind).diffusion``, ``.attention``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SEARCHED = ("dlmspec", "backends", "templates")
#: The objective packages themselves (where a kind's name belongs) and generated files.
OWN = ("dlmspec/objectives/", "backends/megatron/objectives/", "dlmspec/spec/fast.py")
KIND = r"""["'](?:mdm|ar)["']"""
BRANCH = re.compile(
    rf"""(?:==|!=)\s*{KIND}"""              # x == "mdm", kind != 'ar'
    rf"""|{KIND}\s*(?:==|!=)"""             # "mdm" == x
    rf"""|\bin\s*[(\[{{]\s*{KIND}"""          # x in ("mdm", "ar"), x not in ["ar"]
)


def objective_branches() -> dict[str, list[str]]:
    """``{path: ["line: text", ...]}`` of every kind-name branch outside :data:`OWN`."""
    found: dict[str, list[str]] = {}
    for top in SEARCHED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".j2") or not path.is_file():
                continue
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(OWN):
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0] if path.suffix == ".py" else line
                if BRANCH.search(code):
                    found.setdefault(rel, []).append(f"{number}: {line.strip()}")
    return found


def test_no_objective_kind_branch_outside_the_objective_modules() -> None:
    found = objective_branches()
    listing = "\n".join(f"{path}:{line}" for path, lines in found.items() for line in lines)
    assert not found, (
        "branches on an objective's kind by name (ask dlmspec.objectives.get(kind) instead):\n" + listing)


def test_the_branch_pattern_catches_each_spelling(tmp_path: Path) -> None:
    hostile = ['if o.kind == "mdm":', "if kind != 'ar':", 'x = "mdm" == kind', 'if kind in ("mdm", "ar"):',
               'if objective.kind not in ["ar"]:', '{% if o.kind == "mdm" %}']
    assert [line for line in hostile if not BRANCH.search(line)] == []
    harmless = ['KINDS = ("mdm", "ar")', 'kind: str = "mdm"', 'if spec.stage.kind == "sft":', 'x == "armor"']
    assert [line for line in harmless if BRANCH.search(line)] == []
