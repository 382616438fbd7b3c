"""An RL spec compiles: train.py imports the RL stage's options, build_rl() writes every
[stage.rl] value and the rollout sampler's [generate] settings as Python literals (strings through
the Python escaping), and the stage registry builds the RL stage of that kind."""

from __future__ import annotations

import ast
from pathlib import Path

from dlmspec.render.compile import compile_spec

DEMO = Path(__file__).resolve().parents[3] / "specs" / "demo-dlm.toml"

SPEC = f'''extends = "{DEMO}"
name = "rl-compile"
[stage]
kind = "rl"
[stage.rl]
algorithm = "coupled-grpo"
prompts = "data/it's \\"odd\\"\\n.jsonl"
rewards = [{{ function = "rewards.py:correct", weight = 2.0 }}, {{ function = "builtin:format", weight = 0.5 }}]
grpo_group_size = 4
grpo_prompts_per_step = 8
grpo_iterations = 2
grpo_clamp_eps_upper = 0.28
filter_groups = true
loss_normalization = "sequence"
truncated_completions = "mask"
[generate]
temperature = 0.9
gen_length = 64
block_length = 32
steps = 32
[train]
global_batch_size = 32
train_iters = 40
lr_warmup_iters = 4
[data]
mock = true
train = []
valid = []
[checkpoint]
init_from = "mcore:runs/task/checkpoints"
'''


def _build_rl_kwargs(train_py: str) -> dict:
    tree = ast.parse(train_py)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_rl"]
    call = next(n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "RLConfig")
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def test_an_rl_spec_compiles_to_the_rl_stage_with_its_table(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text("def correct(prompt, completion, **row):\n    return 1.0\n")
    spec = tmp_path / "rl.toml"
    spec.write_text(SPEC, encoding="utf-8")
    compile_spec(spec, tmp_path / "out")
    train_py = (tmp_path / "out" / "train.py").read_text()
    assert "from dlmspec.backends.rl.stage import RLConfig" in train_py
    assert "build_stage_of('rl', run, build_rl())" in train_py
    kw = _build_rl_kwargs(train_py)
    assert kw["algorithm"] == "coupled-grpo" and kw["estimator"] == "coupled"
    assert kw["prompts"] == 'data/it\'s "odd"\n.jsonl'
    assert kw["rewards"] == [("rewards.py:correct", 2.0), ("builtin:format", 0.5)]
    assert (kw["grpo_group_size"], kw["grpo_prompts_per_step"], kw["grpo_iterations"]) == (4, 8, 2)
    assert kw["grpo_clamp_eps_upper"] == 0.28 and kw["filter_groups"] is True
    assert kw["loss_normalization"] == "sequence" and kw["truncated_completions"] == "mask"
    assert kw["generate"]["temperature"] == 0.9 and kw["generate"]["gen_length"] == 64
    assert kw["generate"]["steps"] == 32 and kw["generate"]["block_length"] == 32
    compile(train_py, "train.py", "exec")


def test_the_compiled_options_build_the_runtime_stage(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    from dlmspec.backends.megatron.stages import build_stage
    from dlmspec.backends.rl.stage import RLConfig, RLStage

    (tmp_path / "rewards.py").write_text("def correct(prompt, completion, **row):\n    return 1.0\n")
    spec = tmp_path / "rl.toml"
    spec.write_text(SPEC, encoding="utf-8")
    compile_spec(spec, tmp_path / "out")
    options = RLConfig(**_build_rl_kwargs((tmp_path / "out" / "train.py").read_text()))
    stage = build_stage("rl", object(), options)
    assert isinstance(stage, RLStage) and stage.config.estimator_name == "coupled" and stage.config.diffusion
