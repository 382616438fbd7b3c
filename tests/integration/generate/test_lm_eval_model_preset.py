"""`dlmspec-lm-eval --model_args preset=NAME` (backends/generate/lm_eval_model.py): the preset's
sampler settings fill the arguments not given, given ones win, the name is in the model info, and
an unknown name is refused with the names that exist."""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")

from dlmspec.backends.generate.lm_eval_model import DlmspecLM, ModelArgsError  # noqa: E402
from tiny_lm import TinyTransformer  # noqa: E402

EOS, MASK, VOCAB = 30, 31, 32


class _Chars:
    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 30 for c in text]

    def detokenize(self, ids: list[int]) -> str:
        return "".join(chr(97 + i % 26) for i in ids)


def _lm(**kwargs) -> DlmspecLM:
    return DlmspecLM(logits_fn=TinyTransformer(VOCAB, seed=1), tokenizer=_Chars(), kind="mdm", mask_token_id=MASK,
                     eos_token_id=EOS, progress=False, max_length=1024, **kwargs)


def test_a_preset_fills_the_sampler_settings_and_given_ones_win():
    lm = _lm(preset="fast-dllm-gsm8k", threshold="0.8")
    assert lm.generate_args["block_length"] == 32 and lm.generate_args["remasking"] == "threshold"
    assert lm.generate_args["threshold"] == 0.8 and lm.generate_args["gen_length"] == 256
    assert lm.get_model_info()["dlmspec_preset"] == "fast-dllm-gsm8k"
    config = lm._config({"max_gen_toks": 64})
    assert (config.gen_length, config.block_length, config.remasking) == (256, 32, "threshold")


def test_an_unknown_preset_is_refused_naming_the_presets():
    with pytest.raises(ModelArgsError, match="preset='gsm8k'.*llada-gsm8k"):
        _lm(preset="gsm8k")
