"""The compiled train.py of the bundled SFT specs on CPU: it builds SftStage from build_run() and
build_sft(), whose setup checks the data and the layers and whose data gives microbatches the
objective noises on response tokens only (megatron-core's model is not run: no GPU here; the
keywords against megatron-core are tests/unit/render/test_compile_megatron.py's, which compiles every
bundled spec)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from dlmspec.backends.megatron.sft import SftConfig, SftStage
from dlmspec.backends.megatron.stage import StageContext
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from sft_files import write_sft

ROOT = Path(__file__).resolve().parents[3]
GPT2_EOD = 50256


def _train_py(spec: str, folder: Path):
    resolved = resolve(load(ROOT / "specs" / f"{spec}.toml").spec)
    path = folder / f"{spec}_train.py"
    path.write_text(render(resolved, f"specs/{spec}.toml")["train.py"], encoding="utf-8")
    module_spec = importlib.util.spec_from_file_location(f"train_{spec.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _conversations(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        p, r = int(torch.randint(3, 40, (1,), generator=g)), int(torch.randint(1, 20, (1,), generator=g))
        rows.append((torch.randint(0, 50000, (p,), generator=g).tolist(), torch.randint(0, 50000, (r,), generator=g).tolist()))
    return rows


@pytest.fixture()
def demo_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".data").mkdir()
    write_sft(".data/demo-sft-train_text_document", _conversations(40, 0), eod=GPT2_EOD, vocab_size=50257)
    write_sft(".data/demo-sft-heldout_text_document", _conversations(8, 1), eod=GPT2_EOD, vocab_size=50257)
    return tmp_path


def _setup(module, sft: SftConfig | None = None, **run_changes):
    run = module.build_run()
    run = dataclasses.replace(run, data=dataclasses.replace(run.data, num_workers=0), **run_changes)
    transformer_config, model_kwargs, _, _ = module.build_configs()
    stage = SftStage(run, sft or module.build_sft())
    stage.setup(StageContext(run, torch.device("cpu"), 0, 1), layer_spec=module.build_layer(), model_kwargs=model_kwargs)
    return run, stage


def test_demo_sft_train_py_trains_on_response_tokens(demo_data: Path) -> None:
    module = _train_py("demo-dlm-sft", demo_data)
    assert module.build_sft() == SftConfig(packed_sequence=False, over_long="skip", pad_eos_tokens=None, mask_prompt=True)
    run, stage = _setup(module)
    assert run.objective.loss_normalization == "sequence" and run.checkpoint.init_from == "mcore:runs/demo-dlm/checkpoints"
    assert stage.kind == "sft-mdm" and stage.checkpoint_metadata()["sft"]["packed_sequence"] is False
    data = stage.build_data(consumed_samples=0, num_chunks=1)
    try:
        data.train.start(0)
        item = next(data.train.data_iterator())
        ob, position_ids, mask = stage._forward_step.prepare(item)
        assert ob.input_ids.shape == (run.schedule.micro_batch_size, run.data.seq_length) and mask is None
        prompt = item.batch["loss_mask"] == 0
        assert not ob.masked[prompt].any() and (ob.loss_weights[prompt] == 0).all()
        assert (ob.input_ids == run.objective.mask_token_id).any()
        assert int(ob.num_tokens) == run.schedule.micro_batch_size  # "sequence": one per response
        assert stage.stats.conversations == 40 and stage.stats.skipped_over_long == 0
        assert data.valid is not None
    finally:
        data.train.close()


def test_packed_sft_passes_a_mask_and_is_refused_on_transformer_engine(demo_data: Path) -> None:
    module = _train_py("demo-dlm-sft", demo_data)
    run, stage = _setup(module, SftConfig(packed_sequence=True))
    data = stage.build_data(consumed_samples=0, num_chunks=1)
    try:
        data.train.start(0)
        _, _, mask = stage._forward_step.prepare(next(data.train.data_iterator()))
        assert mask is not None and mask.shape[-2:] == (run.data.seq_length, run.data.seq_length)
    finally:
        data.train.close()
    transformer_config, model_kwargs, _, _ = module.build_configs()
    te = SftStage(run, SftConfig(packed_sequence=True))
    layer = module.build_layer()
    import dlmspec.backends.megatron.sft as sft_module

    original = sft_module.layer_spec_backend
    try:
        sft_module.layer_spec_backend = lambda spec: "transformer_engine"
        with pytest.raises(ValueError, match="local\\+sdpa"):
            te.setup(StageContext(run, torch.device("cpu"), 0, 1), layer_spec=layer, model_kwargs=model_kwargs)
    finally:
        sft_module.layer_spec_backend = original


def test_missing_response_masks_are_refused_at_start(demo_data: Path) -> None:
    module = _train_py("demo-dlm-sft", demo_data)
    for suffix in (".bin", ".idx"):
        (demo_data / f".data/demo-sft-heldout_text_document_response{suffix}").unlink()
    with pytest.raises(SystemExit) as info:
        _setup(module)
    assert info.value.code == 2


def test_megadlms_sft_train_py_builds_its_stage(tmp_path: Path) -> None:
    module = _train_py("megadlms-1.7b-sft", tmp_path)
    run = module.build_run()
    assert module.build_sft() == SftConfig()
    assert run.objective.loss_normalization == "sequence" and run.objective.variable_length_prob == 0.0
    assert run.checkpoint.init_from == "mcore:runs/megadlms-1.7b-mdm/checkpoints"
    transformer_config, *_ = module.build_configs()
    assert transformer_config.calculate_per_token_loss is False
