"""generate and convert build a model's TransformerConfig one way
(dlmspec.backends.model_config.transformer_config_from_record), and a converted masked-diffusion
model's mask token comes from its own config or tokenizer, never from a family's hard-coded id."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

from dlmspec.backends.convert.hf_config import dims_from_hf_config  # noqa: E402
from dlmspec.backends.convert.hf_io import read_hf_config  # noqa: E402
from dlmspec.backends.convert.mcore_model import transformer_config_kwargs  # noqa: E402
from dlmspec.backends.convert.tiny import make_tiny_hf  # noqa: E402
from dlmspec.backends.generate.load import LoadError, build_transformer_config, load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def config_values(config) -> dict:
    """The config's fields; an init-method partial compared by what it calls with what."""
    def plain(value):
        if isinstance(value, functools.partial):
            return (value.func, value.args, tuple(sorted(value.keywords.items())))
        return value
    return {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


@pytest.mark.parametrize("family", ["qwen3", "llada", "qwen3_moe"])
def test_generate_and_convert_build_the_same_transformer_config(tmp_path, family) -> None:
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.model_config import record_from_dims

    src, _ = make_tiny_hf(family, tmp_path / family)
    dims = dims_from_hf_config(read_hf_config(src), source=str(src / "config.json"))
    converted = TransformerConfig(**transformer_config_kwargs(dims))
    generated = build_transformer_config(record_from_dims(dims), tp=1, dtype="fp32", cpu=True)
    assert config_values(generated) == config_values(converted)


def test_a_transformer_config_is_built_in_one_place() -> None:
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("backends/generate", "backends/convert")
             for path in sorted((ROOT / folder).glob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bTransformerConfig\(", line.split("#", 1)[0])]
    assert found == [], "build it with dlmspec.backends.model_config.transformer_config_from_record"


def llada_without_mask_id(tmp_path: Path, mask_token: str | None) -> Path:
    """A tiny LLaDA folder whose config.json names no mask token; its tokenizer names
    ``mask_token`` (id 97) when given."""
    src, _ = make_tiny_hf("llada", tmp_path / "llada", seed=1)
    config = json.loads((src / "config.json").read_text())
    del config["mask_token_id"]
    (src / "config.json").write_text(json.dumps(config))
    if mask_token is not None:
        (src / "tokenizer_config.json").write_text(json.dumps({"mask_token": mask_token}))
        (src / "tokenizer.json").write_text(json.dumps({
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 97, "content": mask_token, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True}],
            "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "a": 1}, "unk_token": "<unk>"}}))
    return src


def test_a_converted_diffusion_model_takes_its_tokenizers_mask_token(tmp_path) -> None:
    model = load_model(str(llada_without_mask_id(tmp_path, "<|mdm_mask|>")), device="cpu")
    try:
        assert (model.kind, model.mask_token_id) == ("mdm", 97)
    finally:
        model.close()


def test_a_converted_diffusion_model_naming_no_mask_token_asks_for_one(tmp_path) -> None:
    with pytest.raises(LoadError, match="--mask-token-id") as info:
        load_model(str(llada_without_mask_id(tmp_path, None)), device="cpu")
    assert "names one" in info.value.why
