"""The RL stage's training forward (``backends/rl/stage._training_logits``) of an AR model is causal,
with and without the key-padding mask it passes for left-padded prompts: the logits that score
completion token k (position P + k - 1) never see token k or later. A bidirectional layer does see
them (so the check can fail). megatron-core's own softmax drops its causal mask when a mask is passed;
the local layer spec's SDPA core attention combines them."""

from __future__ import annotations

import pytest
import torch

from cpu_world_kit import megatron_cpu_world


def _logits_fn(attention: str):
    from megatron.core.models.gpt import GPTModel

    from dlmspec.backends.megatron.layers import build_layer_spec
    from dlmspec.backends.rl.stage import _training_logits
    from rl_loop_kit import _config  # the RL tests' tiny TransformerConfig

    torch.manual_seed(0)
    model = GPTModel(config=_config(), transformer_layer_spec=build_layer_spec(attention=attention,
                                                                               use_transformer_engine=False),
                     vocab_size=128, max_sequence_length=32, position_embedding_type="rope")
    return _training_logits(model, 1)


@pytest.mark.parametrize("padded", [False, True])
def test_the_ar_update_forward_does_not_see_later_tokens(tmp_path_factory, monkeypatch, padded):
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        tokens = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))
        changed = tokens.clone()
        changed[:, 8] = (changed[:, 8] + 1) % 100
        attention = None
        if padded:  # left padding, as the rollout passes it for prompts of different lengths
            attention = torch.ones(2, 12, dtype=torch.bool)
            attention[1, :3] = False
        spread = {}
        for kind in ("causal", "bidirectional"):
            fn = _logits_fn(kind)
            with torch.no_grad():
                before, after = fn(tokens, attention), fn(changed, attention)
            spread[kind] = float((before[:, :8] - after[:, :8]).abs().max())
        assert spread["causal"] == 0.0
        assert spread["bidirectional"] > 1e-4
