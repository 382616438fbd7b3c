"""`mcore-to-hf` of a masked-diffusion LM: the Hugging Face checkpoint loads in stock `transformers`
with bidirectional attention (``is_causal: false``), its logits equal megatron-core's bidirectional
logits of the same checkpoint, the objective is read from a training checkpoint's record, an AR
export stays causal, and the sampler generates with the exported model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from dlmspec.backends.convert import ConversionError, hf_to_mcore, mcore_to_hf, verify  # noqa: E402
from dlmspec.backends.convert.api import megatron_checkpoint_logits  # noqa: E402
from dlmspec.backends.convert.tiny import make_tiny_hf  # noqa: E402
from dlmspec.cli.commands import app  # noqa: E402

ATOL = 1e-4
MASK = 99  # the tiny vocabulary's last id


@pytest.fixture(scope="module")
def mcore(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bidi")
    src, _ = make_tiny_hf("llama", root / "hf", seed=5)
    hf_to_mcore(src, root / "mcore")
    return root / "mcore"


def _load(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _tokens(seed: int = 3, shape=(2, 9)) -> torch.Tensor:
    return torch.randint(0, MASK, shape, generator=torch.Generator().manual_seed(seed))


def test_mdm_export_runs_bidirectionally_and_matches_megatron(mcore: Path, tmp_path: Path) -> None:
    mcore_to_hf(mcore, tmp_path / "out", objective="mdm", mask_token_id=MASK)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["is_causal"] is False and config["architectures"] == ["LlamaForCausalLM"]
    assert config["dlmspec"] == {"objective": "mdm", "attention": "bidirectional", "mask_token_id": MASK}
    model = _load(tmp_path / "out")
    tokens = _tokens()
    with torch.no_grad():
        got = model(input_ids=tokens).logits
        changed = tokens.clone()
        changed[:, -1] = (changed[:, -1] + 1) % MASK
        later = model(input_ids=changed).logits
    assert float((got[:, 0] - later[:, 0]).abs().max()) > 1e-4  # position 0 sees the last token
    bidi = megatron_checkpoint_logits(mcore, tokens, causal=False)
    causal = megatron_checkpoint_logits(mcore, tokens)
    assert float((got - bidi).abs().max()) <= ATOL
    assert float((got - causal).abs().max()) > 1e-2  # not silently causal
    # verify() reads is_causal from the exported config and compares bidirectionally
    result = verify(tmp_path / "out", mcore, atol=ATOL)
    assert result.ok, result.max_abs_diff


def test_left_padding_is_hidden_from_bidirectional_attention(mcore: Path, tmp_path: Path) -> None:
    from dlmspec.backends.generate.hf_model import hf_logits_fn

    mcore_to_hf(mcore, tmp_path / "out", objective="mdm", mask_token_id=MASK)
    logits_fn = hf_logits_fn(_load(tmp_path / "out"))
    row = _tokens(shape=(1, 6))
    padded = torch.cat([torch.full((1, 3), 7), row], dim=1)
    attn = torch.tensor([[False] * 3 + [True] * 6])
    alone = logits_fn(row)
    with_pad = logits_fn(padded, attn)[:, 3:]
    assert float((alone - with_pad).abs().max()) <= ATOL


def test_the_objective_comes_from_a_training_checkpoints_record(mcore: Path, tmp_path: Path) -> None:
    import shutil

    ckpt = tmp_path / "iter_0000010"
    shutil.copytree(mcore, ckpt)
    record = {"objective.kind": "mdm", "objective.mask_token_id": 42, "objective.attention_mask": "bidirectional"}
    (ckpt / "dlmspec.json").write_text(json.dumps({"iteration": 10, "spec": {"record": record}}))
    mcore_to_hf(ckpt, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["is_causal"] is False and config["dlmspec"]["mask_token_id"] == 42

    record["objective.attention_mask"] = "block_causal"
    (ckpt / "dlmspec.json").write_text(json.dumps({"spec": {"record": record}}))
    with pytest.raises(ConversionError, match="block_causal"):
        mcore_to_hf(ckpt, tmp_path / "out2")


def test_an_ar_export_stays_causal(mcore: Path, tmp_path: Path) -> None:
    mcore_to_hf(mcore, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "is_causal" not in config and "dlmspec" not in config
    with pytest.raises(ConversionError, match="objective"):
        mcore_to_hf(mcore, tmp_path / "bad", objective="diffusion")
    with pytest.raises(ConversionError, match="mask_token_id"):
        mcore_to_hf(mcore, tmp_path / "bad", objective="ar", mask_token_id=3)


def test_the_sampler_generates_with_the_exported_model(mcore: Path, tmp_path: Path) -> None:
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.hf_model import hf_logits_fn
    from dlmspec.backends.generate.sampler import generate

    mcore_to_hf(mcore, tmp_path / "out", objective="mdm", mask_token_id=MASK)
    config = GenerateConfig(gen_length=4, steps=4, block_length=4, mask_token_id=MASK)
    prompts = [[5, 6, 7], [8, 9]]
    out = generate(hf_logits_fn(_load(tmp_path / "out")), prompts, config)

    def megatron_fn(tokens, attention_mask=None):  # the source checkpoint, bidirectional, row by row
        rows = []
        for b in range(tokens.shape[0]):
            keep = attention_mask[b] if attention_mask is not None else torch.ones_like(tokens[b], dtype=torch.bool)
            logits = megatron_checkpoint_logits(mcore, tokens[b:b + 1, keep], causal=False)
            full = torch.zeros(1, tokens.shape[1], logits.shape[-1])
            full[:, keep] = logits
            rows.append(full)
        return torch.cat(rows)

    expected = generate(megatron_fn, prompts, config)
    assert out.generated == expected.generated
    assert all(len(g) == 4 and MASK not in g for g in out.generated)


def test_cli_mcore_to_hf_takes_the_objective(mcore: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["convert", "mcore-to-hf", str(mcore), str(tmp_path / "out"),
                                      "--objective", "mdm", "--mask-token-id", str(MASK)])
    assert result.exit_code == 0, result.output
    assert "bidirectional" in result.output
    assert json.loads((tmp_path / "out" / "config.json").read_text())["is_causal"] is False
    result = CliRunner().invoke(app, ["convert", "mcore-to-hf", str(mcore), str(tmp_path / "bad"),
                                      "--objective", "diffusion"])
    assert result.exit_code == 2
    assert "--objective" in result.output and "mdm" in result.output
