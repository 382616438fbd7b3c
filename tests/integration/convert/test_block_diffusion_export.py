"""`mcore-to-hf` of a block-diffusion LM (BD3-LM): the training checkpoint's record gives the block
and the clean half's attention, config.json records them with the input and mask convention, the
exported model's logits on x_t (+) x_0 under the block-diffusion mask (its 4-D mask, SDPA and eager)
equal dlmspec's megatron-core model's, and hf-to-mcore then mcore-to-hf gives the same config and
logits back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from dlmspec.backends.convert import ConversionError, hf_to_mcore, mcore_to_hf  # noqa: E402
from dlmspec.backends.convert.block_diffusion import bd3_attention_mask, bd3_inputs, megatron_bd3_logits  # noqa: E402
from dlmspec.backends.convert.tiny import make_tiny_hf  # noqa: E402

ATOL = 1e-4
MASK, L, BLOCK = 99, 8, 4


@pytest.fixture(scope="module")
def mcore(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bd3")
    src, _ = make_tiny_hf("llama", root / "hf", seed=7)
    hf_to_mcore(src, root / "mcore")
    return root / "mcore"


def _training_checkpoint(mcore: Path, where: Path, *, ar_loss_weight: float = 0.0) -> Path:
    """``mcore`` as a bd3lm training checkpoint: the record and ObjectiveConfig dlmspec.json holds."""
    ckpt = where / "iter_0000020"
    shutil.copytree(mcore, ckpt)
    record = {"objective.kind": "bd3lm", "objective.mask_token_id": MASK, "objective.attention_mask": "bidirectional",
              "objective.block_size": BLOCK}
    objective = {"kind": "bd3lm", "mask_token_id": MASK,
                 "options": {"block_size": BLOCK, "noise_range": [1e-3, 1.0], "ar_loss_weight": ar_loss_weight}}
    (ckpt / "dlmspec.json").write_text(json.dumps({"iteration": 20, "spec": {"record": record},
                                                   "objective": objective}))
    return ckpt


def _x(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, MASK, (2, L), generator=g)
    masked = torch.rand(2, L, generator=g) < 0.5
    return torch.where(masked, torch.full_like(x0, MASK), x0), x0


def _hf_logits(path: Path, x_t, x0, *, clean_causal=False, eager=False):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, **({"attn_implementation": "eager"} if eager else {})).eval()
    input_ids, position_ids = bd3_inputs(x_t, x0)
    mask = bd3_attention_mask(L, BLOCK, clean_causal=clean_causal, dtype=torch.float32 if eager else None)
    with torch.no_grad():
        return model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask).logits


@pytest.mark.parametrize("eager", [False, True])
def test_the_exported_block_diffusion_lm_gives_dlmspecs_logits_on_the_doubled_input(mcore, tmp_path, eager) -> None:
    ckpt = _training_checkpoint(mcore, tmp_path)
    mcore_to_hf(ckpt, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["is_causal"] is False and config["architectures"] == ["LlamaForCausalLM"]
    assert config["dlmspec"] == {"objective": "bd3lm", "attention": "block_diffusion", "block_size": BLOCK,
                                 "clean_attention": "block_causal", "input": "x_t (+) x_0",
                                 "position_ids": "repeated", "mask_token_id": MASK}
    x_t, x0 = _x()
    got = _hf_logits(tmp_path / "out", x_t, x0, eager=eager)
    want = megatron_bd3_logits(ckpt, x_t, x0, BLOCK)
    assert got.shape == want.shape == (2, 2 * L, want.shape[-1])
    assert float((got - want).abs().max()) <= ATOL
    # the mask matters: without it (bidirectional over 2L) the x_t half's logits differ
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).eval()
    with torch.no_grad():
        unmasked = model(input_ids=torch.cat([x_t, x0], 1), position_ids=bd3_inputs(x_t, x0)[1]).logits
    assert float((unmasked[:, :L] - want[:, :L]).abs().max()) > 1e-2


def test_an_ar_loss_run_exports_its_causal_clean_half(mcore, tmp_path) -> None:
    ckpt = _training_checkpoint(mcore, tmp_path, ar_loss_weight=0.5)
    mcore_to_hf(ckpt, tmp_path / "out")
    record = json.loads((tmp_path / "out" / "config.json").read_text())["dlmspec"]
    assert record["clean_attention"] == "causal"
    x_t, x0 = _x(4)
    got = _hf_logits(tmp_path / "out", x_t, x0, clean_causal=True)
    want = megatron_bd3_logits(ckpt, x_t, x0, BLOCK, clean_causal=True)
    assert float((got - want).abs().max()) <= ATOL
    block_causal = megatron_bd3_logits(ckpt, x_t, x0, BLOCK)
    assert float((block_causal[:, L:] - want[:, L:]).abs().max()) > 1e-3  # the clean half's attention differs


def test_hf_to_mcore_and_back_keeps_the_block_diffusion_record_and_logits(mcore, tmp_path) -> None:
    ckpt = _training_checkpoint(mcore, tmp_path)
    mcore_to_hf(ckpt, tmp_path / "out")
    hf_to_mcore(tmp_path / "out", tmp_path / "mcore2")
    mcore_to_hf(tmp_path / "mcore2", tmp_path / "out2")
    first = json.loads((tmp_path / "out" / "config.json").read_text())
    second = json.loads((tmp_path / "out2" / "config.json").read_text())
    assert second["dlmspec"] == first["dlmspec"] and second["is_causal"] is False
    x_t, x0 = _x(5)
    want = megatron_bd3_logits(ckpt, x_t, x0, BLOCK)
    assert float((megatron_bd3_logits(tmp_path / "mcore2", x_t, x0, BLOCK) - want).abs().max()) <= ATOL
    assert float((_hf_logits(tmp_path / "out2", x_t, x0) - want).abs().max()) <= ATOL


def test_a_block_diffusion_export_needs_its_block_size(mcore, tmp_path) -> None:
    with pytest.raises(ConversionError, match="no block size"):
        mcore_to_hf(mcore, tmp_path / "bad", objective="bd3lm", mask_token_id=MASK)
    mcore_to_hf(mcore, tmp_path / "out", objective="bd3lm", mask_token_id=MASK, block_size=2)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dlmspec"]["block_size"] == 2
    with pytest.raises(ConversionError, match="block_size given for objective = 'mdm'"):
        mcore_to_hf(mcore, tmp_path / "bad2", objective="mdm", mask_token_id=MASK, block_size=2)
    with pytest.raises(ConversionError, match="not a block length"):
        mcore_to_hf(mcore, tmp_path / "bad3", objective="bd3lm", mask_token_id=MASK, block_size=0)


def test_the_convert_command_exports_a_block_diffusion_checkpoint_and_names_its_block(mcore, tmp_path) -> None:
    from typer.testing import CliRunner

    from dlmspec.cli.commands import app

    ckpt = _training_checkpoint(mcore, tmp_path)
    result = CliRunner().invoke(app, ["convert", "mcore-to-hf", str(ckpt), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "block-diffusion (blocks of 4" in result.output
    result = CliRunner().invoke(app, ["convert", "mcore-to-hf", str(mcore), str(tmp_path / "out2"), "--objective",
                                      "bd3lm", "--mask-token-id", str(MASK), "--block-size", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out2" / "config.json").read_text())["dlmspec"]["block_size"] == 2
    result = CliRunner().invoke(app, ["convert", "mcore-to-hf", str(mcore), str(tmp_path / "out3"), "--objective",
                                      "bd3lm", "--mask-token-id", str(MASK), "--block-size", "0"])
    assert result.exit_code == 2 and "--block-size" in result.output
