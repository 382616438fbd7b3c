"""The ``{name}`` placeholder of the run's paths: it expands to the spec's final name
(after ``extends`` and ``--set``) when the spec is validated, so the checks, the plan, the compiled
files and the runtime all see the expanded path; any other ``{...}`` in those keys is the loader's
``name-placeholder`` error, whose fix loads."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dlmspec.check import load_for
from dlmspec.errors import SpecError
from dlmspec.render.compile import compile_spec
from dlmspec.spec.load import load
from dlmspec.spec.models import Spec

#: A small valid spec (one GPU, mock data) whose run paths follow its name.
PARENT = """\
name = "parent"

[model]
num_layers = 2
hidden_size = 128
ffn_hidden_size = 512
num_attention_heads = 4
vocab_size = 1000
max_position_embeddings = 256

[train]
global_batch_size = 4
seq_length = 128
train_iters = 10

[data]
mock = true

[data.tokenizer]
type = "NullTokenizer"
vocab_size = 999

[checkpoint]
save = "runs/{name}/checkpoints"
save_interval = 5

[cluster]
gpu = "h100"
gpus_per_node = 1

[logging]
tensorboard_dir = "runs/{name}/tensorboard"
"""


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _paths(spec) -> tuple[str, str | None]:
    return spec.checkpoint.save, spec.logging.tensorboard_dir


def test_the_paths_follow_the_final_name(tmp_path: Path) -> None:
    parent = _write(tmp_path, "parent.toml", PARENT)
    child = _write(tmp_path, "child.toml", 'extends = "parent.toml"\nname = "child"\n')
    assert _paths(load(parent).spec) == ("runs/parent/checkpoints", "runs/parent/tensorboard")
    assert _paths(load(child).spec) == ("runs/child/checkpoints", "runs/child/tensorboard")
    assert _paths(load(child, ["name=\"x\""]).spec) == ("runs/x/checkpoints", "runs/x/tensorboard")
    # the pydantic-free loader of validate and plan builds the same
    assert load(child, fast=True).spec == load(child).spec
    assert _paths(load(child, fast=True).spec) == ("runs/child/checkpoints", "runs/child/tensorboard")


def test_every_name_key_takes_the_placeholder(tmp_path: Path) -> None:
    text = PARENT + ('run_dir = "/scratch/{name}"\nwandb_exp_name = "{name}-v2"\n'
                     '[cluster.slurm]\njob_name = "{name}"\n')
    spec = load(_write(tmp_path, "p.toml", text.replace('tensorboard_dir = "runs/{name}/tensorboard"\n',
                                                            'tensorboard_dir = "/scratch/{name}/tensorboard"\n'))).spec
    from dlmspec.spec.names import NAME_KEYS

    def value(key: str) -> str | None:
        node = spec
        for part in key.split("."):
            node = getattr(node, part)
        return node

    values = {key: value(key) for key in NAME_KEYS}
    assert spec.logging.run_dir == "/scratch/parent" and spec.logging.tensorboard_dir == "/scratch/parent/tensorboard"
    assert spec.logging.wandb_exp_name == "parent-v2" and spec.cluster.slurm.job_name == "parent"
    assert not [v for v in values.values() if v is not None and "{" in v], values
    loaded_load = load(_write(tmp_path, "q.toml", PARENT.replace("save_interval = 5",
                                                                 'save_interval = 5\nload = "ck/{name}"')))
    assert loaded_load.spec.checkpoint.load == "ck/parent"


def test_checks_plan_compiled_files_and_lock_see_the_expanded_path(tmp_path: Path) -> None:
    _write(tmp_path, "parent.toml", PARENT)
    child = _write(tmp_path, "child.toml", 'extends = "parent.toml"\nname = "child"\n')
    _, resolved, issues = load_for("validate", child)
    # runtime-tensorboard-dir compares tensorboard_dir with run_dir (default runs/<name>): both expanded
    assert [i.rule for i in issues if i.severity == "error"] == []
    result = compile_spec(child, tmp_path / "out")
    files = {p.name: p.read_text(encoding="utf-8") for p in result.files}
    assert all("{name}" not in text for text in files.values())
    assert "save_dir='runs/child/checkpoints'" in files["train.py"]
    assert "run_dir='runs/child'" in files["train.py"]
    lock = tomllib.loads(files["spec.lock.toml"])
    assert lock["checkpoint"]["save"] == "runs/child/checkpoints"
    assert lock["logging"]["tensorboard_dir"] == "runs/child/tensorboard"
    # the lock records the expanded paths: it compiles to the same files, even with another name
    relocked = compile_spec(tmp_path / "out" / "spec.lock.toml", tmp_path / "again")
    assert relocked.content_hash == result.content_hash


def test_a_written_path_and_the_placeholder_hash_the_same(tmp_path: Path) -> None:
    """spec.lock.toml records the expanded path, so a spec moved to ``runs/{name}/...`` keeps its
    content hash (and compiles to the same train.py)."""
    literal = _write(tmp_path, "a.toml", PARENT.replace("{name}", "parent"))
    templated = _write(tmp_path, "b.toml", PARENT)
    a = compile_spec(literal, tmp_path / "a")
    b = compile_spec(templated, tmp_path / "b")
    assert a.content_hash == b.content_hash
    for name in ("train.py", "spec.lock.toml", "launch.sh", "launch.sbatch", "plan.json"):
        text_a = (tmp_path / "a" / name).read_text(encoding="utf-8").replace("a.toml", "X")
        text_b = (tmp_path / "b" / name).read_text(encoding="utf-8").replace("b.toml", "X")
        assert text_a == text_b, name


def test_python_specs_and_models_expand_too(tmp_path: Path) -> None:
    data = tomllib.loads(PARENT)
    assert Spec.model_validate(data).checkpoint.save == "runs/parent/checkpoints"
    as_dict = _write(tmp_path, "d.py", f"spec = {data!r}\n")
    assert load(as_dict, ["name=\"y\""]).spec.checkpoint.save == "runs/y/checkpoints"
    as_model = _write(tmp_path, "m.py", (
        "from dlmspec.spec.models import CheckpointSpec, LoggingSpec, Spec\n"
        f"data = {data!r}\n"
        "data['checkpoint'] = CheckpointSpec(save='runs/{name}/ck')\n"
        "data['logging'] = LoggingSpec(tensorboard_dir='runs/{name}/tensorboard')\n"
        "spec = Spec(**data)\n"))
    spec = load(as_model).spec
    assert _paths(spec) == ("runs/parent/ck", "runs/parent/tensorboard")
    assert "save" in spec.checkpoint.model_fields_set


@pytest.mark.parametrize("written, fixed", [
    ("runs/{nmae}/checkpoints", "runs/{name}/checkpoints"),
    ("runs/{run}/checkpoints", "runs/{name}/checkpoints"),
    ("runs/{}/checkpoints", "runs/{name}/checkpoints"),
    ("runs/{name/checkpoints", "runs/{{name/checkpoints"),
    ("runs/x}/checkpoints", "runs/x}}/checkpoints"),
    ("${SCRATCH}/checkpoints", "${{SCRATCH}}/checkpoints"),  # a shell variable (not expanded): kept as text
])
def test_any_other_brace_is_an_error_whose_remedy_loads(tmp_path: Path, written: str, fixed: str) -> None:
    path = _write(tmp_path, "p.toml", PARENT.replace('save = "runs/{name}/checkpoints"', f'save = "{written}"'))
    with pytest.raises(SpecError) as err:
        load(path)
    (issue,) = err.value.issues
    assert (issue.rule, issue.key, issue.value, issue.severity) == ("name-placeholder", "checkpoint.save", written,
                                                                     "error")
    assert issue.file == str(path) and issue.line == PARENT.splitlines().index(
        'save = "runs/{name}/checkpoints"') + 1
    assert f'checkpoint.save = "{fixed}"' in issue.hint
    repaired = _write(tmp_path, "p.toml", PARENT.replace('save = "runs/{name}/checkpoints"', f'save = "{fixed}"'))
    assert "{name}" not in load(repaired).spec.checkpoint.save


def test_doubled_braces_are_literal_braces(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.toml", PARENT.replace('save = "runs/{name}/checkpoints"',
                                                     'save = "runs/{{x}}/{name}"'))
    assert load(path).spec.checkpoint.save == "runs/{x}/parent"


def test_every_bad_key_is_reported_at_once_and_by_the_python_loader(tmp_path: Path) -> None:
    path = _write(tmp_path, "p.toml", PARENT.replace("{name}", "{nam}"))
    with pytest.raises(SpecError) as err:
        load(path)
    assert sorted(i.key for i in err.value.issues) == ["checkpoint.save", "logging.tensorboard_dir"]
    data = tomllib.loads(PARENT.replace("{name}", "{nam}"))
    py = _write(tmp_path, "m.py", "from dlmspec.spec.models import Spec\n"
                f"spec = Spec.model_validate({data!r})\n")
    with pytest.raises(SpecError) as err:
        load(py)
    assert {(i.rule, i.key) for i in err.value.issues} >= {("name-placeholder", "checkpoint.save")}
