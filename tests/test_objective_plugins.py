"""Objectives are plugins (dlmspec/objectives, backends/megatron/objectives): no module outside
them branches on an objective's kind by name (``kind == "mdm"``, ``!= "ar"``, ``in ("mdm", ...)``);
they ask the registration (``dlmspec.objectives.get(kind).diffusion``, ``.attention``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEARCHED = ("dlmspec", "backends", "templates")
#: The objective packages themselves (where a kind's name belongs) and generated files.
OWN = ("dlmspec/objectives/", "backends/megatron/objectives/", "dlmspec/spec/fast.py")
KIND = r"""["'](?:mdm|ar)["']"""
BRANCH = re.compile(
    rf"""(?:==|!=)\s*{KIND}"""              # x == "mdm", kind != 'ar'
    rf"""|{KIND}\s*(?:==|!=)"""             # "mdm" == x
    rf"""|\bin\s*[(\[{{]\s*{KIND}"""          # x in ("mdm", "ar"), x not in ["ar"]
)
#: Branches in modules other sessions are moving onto the registry (the resolve package, the CLI,
#: generate's loader and lm-eval wrapper, convert, the runtime's start checks and spec record, and
#: check rules outside check/objective.py). Each entry is the exact count there now: removing a
#: branch means lowering its count (test_pending_objective_branches_are_counted_exactly), and no
#: other module may add one.
PENDING = {
    "backends/convert/objective.py": 6,
    "backends/generate/lm_eval_model.py": 9,
    "backends/generate/load.py": 3,
    "backends/megatron/checks.py": 4,
    "backends/megatron/spec_record.py": 2,
    "dlmspec/check/generate.py": 1,
    "dlmspec/check/precision.py": 1,
    "dlmspec/check/runtime.py": 1,
    "dlmspec/check/sequence.py": 1,
    "dlmspec/check/sft.py": 2,
    "dlmspec/check/stage.py": 2,
    "dlmspec/cli/commands/new.py": 3,
    "dlmspec/cli/generate.py": 9,
    "dlmspec/cli/generate_options.py": 1,
    "dlmspec/generate_settings.py": 1,
}


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
    new = {path: lines for path, lines in found.items() if path not in PENDING}
    grown = {path: lines for path, lines in found.items() if path in PENDING and len(lines) > PENDING[path]}
    listing = "\n".join(f"{path}:{line}" for group in (new, grown) for path, lines in group.items() for line in lines)
    assert not new and not grown, (
        "branches on an objective's kind by name (ask dlmspec.objectives.get(kind) instead):\n" + listing)


def test_pending_objective_branches_are_counted_exactly() -> None:
    found = objective_branches()
    stale = {path: (count, len(found.get(path, []))) for path, count in PENDING.items()
             if len(found.get(path, [])) != count}
    assert not stale, f"PENDING counts (listed, found) no longer match; lower them: {stale}"


def test_the_branch_pattern_catches_each_spelling(tmp_path: Path) -> None:
    hostile = ['if o.kind == "mdm":', "if kind != 'ar':", 'x = "mdm" == kind', 'if kind in ("mdm", "ar"):',
               'if objective.kind not in ["ar"]:', '{% if o.kind == "mdm" %}']
    assert [line for line in hostile if not BRANCH.search(line)] == []
    harmless = ['KINDS = ("mdm", "ar")', 'kind: str = "mdm"', 'if spec.stage.kind == "sft":', 'x == "armor"']
    assert [line for line in harmless if BRANCH.search(line)] == []
