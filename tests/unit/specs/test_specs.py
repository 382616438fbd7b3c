"""The bundled specs (specs/*.toml): each validates and compiles (errors: none; warnings: only
data and checkpoint paths that are not on this machine) unless its header says the runtime
cannot run it yet (then validate reports and compile refuses exactly what the header
describes), and the figures their comments state are what dlmspec computes."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.check import RULES, issues_for
from dlmspec.cli.commands import app
from dlmspec.render.compile import check_spec
from dlmspec.errors import SpecError
from dlmspec.gpus import GiB
from dlmspec.spec.load import load
from dlmspec.plan import make_plan
from dlmspec.resolve import resolve

ROOT = Path(__file__).resolve().parents[3]
SPECS = sorted((ROOT / "specs").glob("*.toml"))

#: Specs that `dlmspec validate` reports and `dlmspec compile` refuses, with the (key, message) of
#: each refusal (the runtime rules of dlmspec.check.runtime): what their header comments say.
REFUSED: dict[str, set[tuple[str, str]]] = {}


def test_bundled_specs_exist() -> None:
    """the list: MegaDLMs' 1.7B example, LLaDA-8B pretraining, Dream-7B adapted from
    Qwen2.5-7B, an SFT spec, a Mixtral-style MoE DLM and a small demo that fits one GPU."""
    names = {p.stem for p in SPECS}
    assert {"demo-dlm", "demo-ar", "megadlms-1.7b-mdm", "megadlms-1.7b-ar", "llada-8b-pretrain",
            "dream-7b-adapt", "megadlms-1.7b-sft", "mixtral-8x7b-mdm"} <= names
    assert set(REFUSED) <= names
    # The compile tests (test_compile*.py) leave out exactly the specs whose header says so.
    assert {p.stem for p in SPECS if "`dlmspec compile` refuses it" in p.read_text()} == set(REFUSED)


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_bundled_spec_validates(path: Path) -> None:
    loaded = load(path)
    resolved = resolve(loaded.spec)
    issues = issues_for("validate", loaded, resolved)
    refused = REFUSED.get(path.stem, set())
    assert {(i.key, i.message) for i in issues if i.severity == "error"} == refused
    assert [str(i) for i in issues if i.rule != "path-not-found" and i.severity != "error"] == []
    assert loaded.spec.name == path.stem
    assert resolved.train_iters > 0
    result = CliRunner().invoke(app, ["validate", str(path)])
    if refused:
        assert result.exit_code == 2 and "[runtime-" in result.stderr
        return
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(f"ok: {path.stem}: ")


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_bundled_spec_compiles_or_is_refused_as_documented(path: Path) -> None:
    loaded = load(path)
    resolved = resolve(loaded.spec)
    if path.stem not in REFUSED:
        check_spec(loaded, resolved)
        return
    with pytest.raises(SpecError) as info:
        check_spec(loaded, resolved)
    assert {(i.key, i.message) for i in info.value.errors} == REFUSED[path.stem]
    assert all(RULES[i.rule].scope == "runtime" for i in info.value.errors)
    header = path.read_text().split("\nname = ", 1)[0]
    assert "`dlmspec compile` refuses it" in header
    for key, _ in REFUSED[path.stem]:
        assert key in header.replace("\n# ", " ")


def _resolved(stem: str):
    return resolve(load(next(p for p in SPECS if p.stem == stem)).spec)


@pytest.mark.parametrize(("mdm", "ar"), [("demo-dlm", "demo-ar"), ("megadlms-1.7b-mdm", "megadlms-1.7b-ar")])
def test_ar_baselines_differ_only_in_objective(mdm: str, ar: str) -> None:
    a, b = _resolved(mdm), _resolved(ar)
    assert (a.spec.objective.kind, a.attention_mask) == ("mdm", "bidirectional")
    assert (b.spec.objective.kind, b.attention_mask) == ("ar", "causal")
    ignore = {"name", "description", "objective", "checkpoint", "logging"}
    assert a.spec.model_dump(exclude=ignore) == b.spec.model_dump(exclude=ignore)


def test_demo_description_figures() -> None:
    r = _resolved("demo-dlm")
    assert round(r.params.total / 1e6) == 153 and round(r.params.non_embedding / 1e6) == 76
    assert r.mask_token_id == 50257 < r.padded_vocab_size
    assert r.world_size == 1


def test_llada_schedule_figures() -> None:
    r = _resolved("llada-8b-pretrain")
    tr = r.spec.train
    assert r.tokens_per_step == 1280 * 4096 and r.dp == 64 and r.num_microbatches == 20
    assert r.train_iters == math.ceil(2.3e12 / r.tokens_per_step) == 438_691
    assert r.mask_token_id == 126336
    # arXiv:2502.09992 sec. 2.2: 4e-4 to 1.2T tokens, then 1e-4 to 2.0T, then linear to 1e-5 at 2.3T
    drop, plateau_end = math.ceil(1.2e12 / r.tokens_per_step), math.ceil(2.0e12 / r.tokens_per_step)
    assert (drop, plateau_end) == (228_882, 381_470)
    assert tr.lr_decay_style == "piecewise" and tr.lr_warmup_iters == 2000
    assert [list(p) for p in tr.lr_points] == [[2000, 4e-4], [drop, 4e-4], [drop, 1e-4], [plateau_end, 1e-4],
                                               [r.train_iters, 1e-5]]


def test_llada_train_py_carries_the_points() -> None:
    """The compiled train.py hands the points to the runtime's ScheduleConfig, as Python literals."""
    from dlmspec.render.compile import render

    train_py = render(_resolved("llada-8b-pretrain"), "llada-8b-pretrain.toml")["train.py"]
    line = next(x for x in train_py.splitlines() if x.strip().startswith("lr_points="))
    literal = line.split("  #")[0].strip().removeprefix("lr_points=").removesuffix(",")
    assert ast.literal_eval(literal) == [
        [2000, 4e-4], [228882, 4e-4], [228882, 1e-4], [381470, 1e-4], [438691, 1e-5]]
    assert 'lr_decay_style="piecewise"' in train_py or "lr_decay_style='piecewise'" in train_py


def test_mixtral_layout_figures() -> None:
    r = _resolved("mixtral-8x7b-mdm")
    assert (r.dp, r.expert_dp, r.num_microbatches) == (16, 2, 32)
    assert r.padded_vocab_size == 32128 and r.mask_token_id == 32000
    assert round(r.params.total / 1e9, 1) == 46.7 and round(r.params.active / 1e9, 1) == 12.9
    assert r.spec.model.num_experts == 8 and r.spec.model.moe_router_topk == 2 and r.ep == 8


def test_megadlms_figures() -> None:
    r = _resolved("megadlms-1.7b-mdm")
    assert (r.dp, r.num_microbatches, r.mask_token_id) == (8, 8, 50277)  # "8 microbatches of 4 per GPU per step"


def test_dream_figures() -> None:
    r = _resolved("dream-7b-adapt")
    s = r.spec
    assert s.model.preset == "dream-7b" and s.model.add_qkv_bias and r.num_query_groups == 4
    assert round(r.params.total / 1e9, 1) == 7.6
    assert r.mask_token_id == 151666 and s.data.tokenizer.eod_id == 151643
    assert s.checkpoint.init_from == "hf:.models/Qwen2.5-7B"
    assert (r.world_size, r.tp, r.dp, r.num_microbatches) == (96, 2, 48, 10)
    assert r.tokens_per_step == 1920 * 2048 and r.train_iters == math.ceil(580e9 / r.tokens_per_step)
    assert abs(make_plan(r).peak_bytes / GiB - 47) < 3  # "about 47 GiB per GPU planned"


def test_sft_extends_the_pretraining_spec() -> None:
    sft, base = _resolved("megadlms-1.7b-sft"), _resolved("megadlms-1.7b-mdm")
    assert sft.spec.stage.kind == "sft" and sft.spec.stage.sft is not None and sft.spec.stage.sft.mask_prompt
    assert sft.spec.model == base.spec.model
    # SFT cuts no sequence to a random length (rule sft-variable-length) and reads no 2,049-id window
    # (rule mdm-unshift-sft): the two objective changes
    assert sft.spec.objective.variable_length_prob == 0 and base.spec.objective.variable_length_prob > 0
    assert sft.spec.objective.unshift is False and base.spec.objective.unshift is True
    same = {"variable_length_prob": 0.0, "unshift": False}
    assert sft.spec.objective.model_copy(update=same) == base.spec.objective.model_copy(update=same)
    assert sft.spec.parallel == base.spec.parallel and sft.spec.cluster == base.spec.cluster
    assert sft.spec.checkpoint.init_from == "mcore:runs/megadlms-1.7b-mdm/checkpoints"
    assert sft.tokens_per_step == 256 * 1024 and sft.train_iters == math.ceil(2e9 / sft.tokens_per_step) == 7630
    # LLaDA's SFT schedule (arXiv:2502.09992 sec. 2.3): 2.5e-5 to 2.5e-6, linear over the last 10%
    t = sft.spec.train
    assert (t.lr, t.min_lr, t.lr_warmup_iters, t.lr_decay_style, t.lr_wsd_decay_style) == (2.5e-5, 2.5e-6, 50, "WSD", "linear")
    assert t.lr_wsd_decay_iters == sft.train_iters // 10


#: The keys whose bundled values follow the spec's name (dlmspec.spec.names).
RUN_PATHS = ("checkpoint.save", "logging.tensorboard_dir")


def _raw(path: Path, key: str):
    import tomllib

    node = tomllib.loads(path.read_text(encoding="utf-8"))
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_a_renamed_child_of_a_bundled_spec_gets_folders_of_its_own(path: Path, tmp_path: Path) -> None:
    """The bundled specs write their run paths as runs/{name}/..., so a spec that
    extends one and changes `name` saves, resumes and logs in runs/<its name>/, and no rule
    says it inherits another run's folder."""
    for key in RUN_PATHS:
        written = _raw(path, key)
        assert written is None or written.startswith("runs/{name}/"), (key, written)
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{path.as_posix()}"\nname = "child"\n', encoding="utf-8")
    spec = load(child).spec
    assert spec.checkpoint.save == "runs/child/checkpoints"
    assert spec.logging.tensorboard_dir == "runs/child/tensorboard"
    assert not [i for i in issues_for("validate", load(child)) if i.rule == "checkpoint-inherited"]


def test_the_starter_spec_paths_follow_its_name(tmp_path: Path) -> None:
    out = tmp_path / "starter.toml"
    assert CliRunner().invoke(app, ["new", str(out), "--preset", "qwen3-0.6b"]).exit_code == 0
    assert _raw(out, "checkpoint.save") == "runs/{name}/checkpoints"
    assert _raw(out, "logging.tensorboard_dir") == "runs/{name}/tensorboard"
    child = tmp_path / "child.toml"
    child.write_text('extends = "starter.toml"\nname = "child"\n', encoding="utf-8")
    assert load(child).spec.checkpoint.save == "runs/child/checkpoints"
