"""What the generation-evaluation tests share: a word-level tokenizer of the addition task's text,
addition rows, an oracle logits function that answers chosen rows right and the rest wrong, and a
tiny megatron-core GPTModel on CPU (as tests/integration/generate/test_generate_gptmodel.py builds it)."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

WORDS = [f" {d}" for d in range(10)] + [" +", " ="]
EOS = len(WORDS)          # 12
MASK = EOS + 1            # 13
VOCAB = MASK + 1          # 14 logits columns (the mask's is never chosen: the sampler masks it out)


class WordTokenizer:
    """``" 1 2 + 3 ="`` <-> ids, one id per space-separated word; EOS decodes to ``<|endoftext|>``."""

    vocab_size = EOS + 1  # the mask id is outside the tokenizer's vocabulary, as GPT-2's padded slot

    def tokenize(self, text: str) -> List[int]:
        return [WORDS.index(" " + w) for w in text.split()]

    def detokenize(self, ids: List[int]) -> str:
        return "".join(WORDS[i] if i < len(WORDS) else "<|endoftext|>" for i in ids)


def addition_rows(pairs) -> List[Dict[str, str]]:
    """``{"prompt", "answer"}`` rows of ``a + b`` for each ``(a, b)``, digits space-separated."""
    def spaced(n: int) -> str:
        return "".join(" " + d for d in str(n))
    return [{"prompt": f"{spaced(a)} +{spaced(b)} =", "answer": spaced(a + b)} for a, b in pairs]


class Oracle:
    """Logits that put all mass on ``prompt + answer + EOS...`` for each row (the answer of rows
    whose prompt is in ``wrong`` off by one): as a diffusion LM (column ``j`` predicts token ``j``)
    or an AR one (column ``j`` predicts token ``j + 1``). Left padding is read from the mask."""

    def __init__(self, rows: List[Dict[str, str]], wrong: set, causal: bool) -> None:
        tok = WordTokenizer()
        self.targets = {}
        for row in rows:
            answer = tok.tokenize(row["answer"])
            if row["prompt"] in wrong:
                answer = tok.tokenize(" " + " ".join(str((int(row["answer"].replace(" ", "")) + 1))))
            self.targets[tuple(tok.tokenize(row["prompt"]))] = answer
        self.causal = causal

    def __call__(self, tokens: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        b, s = tokens.shape
        logits = torch.full((b, s, VOCAB), -10.0)
        for r in range(b):
            pads = 0 if attention_mask is None else int((~attention_mask[r].bool()).sum())
            row = tokens[r, pads:].tolist()
            prompt = next(p for p in self.targets if tuple(row[:len(p)]) == p)
            target = list(prompt) + self.targets[prompt] + [EOS] * s
            for j in range(s - pads):
                t = target[j + 1] if self.causal else target[j]
                logits[r, pads + j, t] = 10.0
        return logits


def tiny_gpt(bidirectional: bool = True):
    """A one-layer megatron-core GPTModel over :data:`VOCAB` ids (call inside megatron_cpu_world)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        kv_channels=8, normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )
    (model,) = build_model(
        config, layer_spec=build_layer_spec(attention="bidirectional" if bidirectional else "causal",
                                            qk_layernorm=False, use_transformer_engine=False),
        vocab_size=VOCAB, max_sequence_length=64, position_embedding_type="rope",
    )
    return model
