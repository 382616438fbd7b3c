"""``[logging]``'s W&B keys through the compiler: `compile` no longer refuses
``wandb_project``; train.py's LoggingConfig carries project, name, save dir, entity, mode and tags
(escaped); the API key is never a spec value; the bundled specs compile as before."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dlmspec.check import RULES
from dlmspec.errors import SpecError
from dlmspec.render.compile import check_spec, render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "specs" / "demo-dlm.toml")
WANDB = ["logging.wandb_project='dlm-demo'", "logging.wandb_mode='offline'", "logging.wandb_entity='team'",
         "logging.wandb_tags=[\"demo\", \"it's\"]", "logging.wandb_save_dir='runs/demo-dlm/wb'"]


def _compiled(tmp_path: Path, sets: list[str]) -> dict[str, str]:
    loaded = load(DEMO, sets)
    resolved = resolve(loaded.spec)
    check_spec(loaded, resolved)  # raises SpecError on an error
    files = render(resolved, "specs/demo-dlm.toml")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return files


def check_spec_issues(loaded):
    """The rule findings of ``loaded`` (errors and warnings) without raising."""
    from dlmspec.check import issues_for

    return issues_for("validate", loaded, resolve(loaded.spec))


def _build_run(path: Path):
    spec = importlib.util.spec_from_file_location("compiled_train_py", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("compiled_train_py", None)
    spec.loader.exec_module(module)
    return module.build_run()


def test_the_runtime_wandb_refusal_is_gone() -> None:
    assert "runtime-wandb" not in RULES


def test_compile_writes_the_wandb_settings_into_train_py(tmp_path) -> None:
    files = _compiled(tmp_path, WANDB)
    assert "WANDB_API_KEY" in files["train.py"]  # named in a comment: where the key comes from
    logging = _build_run(tmp_path / "train.py").logging
    assert (logging.wandb_project, logging.wandb_exp_name, logging.wandb_entity, logging.wandb_mode) == \
        ("dlm-demo", "demo-dlm", "team", "offline")
    assert list(logging.wandb_tags) == ["demo", "it's"] and logging.wandb_save_dir == "runs/demo-dlm/wb"
    # offline needs no key: launch.sbatch does not warn about a missing WANDB_API_KEY
    assert "WANDB_API_KEY is not set" not in files["launch.sbatch"]
    online = _compiled(tmp_path, ["logging.wandb_project='dlm-demo'", "logging.wandb_exp_name='{name}-a'"])
    assert "WANDB_API_KEY" in online["launch.sbatch"]
    logging = _build_run(tmp_path / "train.py").logging
    assert (logging.wandb_mode, logging.wandb_exp_name, logging.wandb_save_dir) == ("online", "demo-dlm-a", None)


def test_without_a_project_train_py_has_no_wandb_line(tmp_path) -> None:
    assert "wandb" not in _compiled(tmp_path, [])["train.py"]


def test_a_wandb_key_in_the_spec_is_refused_and_hidden(tmp_path) -> None:
    key = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(SpecError) as info:
        _compiled(tmp_path, ["logging.wandb_project='p'", f"logging.wandb_tags=['{key}']"])
    text = str(info.value) + "".join(str(i) for i in info.value.issues)
    assert key not in text
    found = [(i.key, i.rule, i.value) for i in info.value.issues if "secret" in i.rule or "key" in i.rule]
    assert found == [("logging.wandb_tags.0", "wandb-key-in-spec", "<hidden>")]
    # a git commit elsewhere is not a key
    loaded = load(DEMO, [f"checkpoint.init_from='hf:org/model@{key}'"])
    assert not [i for i in check_spec_issues(loaded) if i.rule == "wandb-key-in-spec"]


def test_wandb_keys_without_a_project_are_warned_about() -> None:
    loaded = load(DEMO, ["logging.wandb_mode='offline'", "logging.wandb_tags=['a']"])
    warnings = check_spec(loaded, resolve(loaded.spec))
    found = {(w.key, w.rule) for w in warnings}
    assert {("logging.wandb_mode", "wandb-name-without-project"),
            ("logging.wandb_tags", "wandb-name-without-project")} <= found


def test_an_unknown_mode_names_the_key() -> None:
    with pytest.raises(SpecError) as info:
        load(DEMO, ["logging.wandb_mode='cloud'"])
    assert any(i.key == "logging.wandb_mode" for i in info.value.issues)


def test_the_wandb_save_dir_takes_the_runs_name(tmp_path) -> None:
    _compiled(tmp_path, ["name='viz'", "logging.wandb_project='p'", "logging.wandb_save_dir='runs/{name}/wandb'"])
    assert _build_run(tmp_path / "train.py").logging.wandb_save_dir == "runs/viz/wandb"
