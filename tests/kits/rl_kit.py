"""What the RL stage's CPU tests share (not a test module): a character tokenizer, a tiny torch
model usable as masked-diffusion or causal LM, and an :class:`RLCore` written from the RL module
contract (the formulas of GRPO / d1 / DiffuCoder on plain tensors; rewards scored in this process),
so that the stage runs without ``backends/rl``'s own modules."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import Tensor

from dlmspec.backends.rl.rollout import RLConfig, RLCore, RolloutEngine

CHARS = "0123456789+-=?#: abcdefghijklmnopqrstuvwxyz\n<>|_/"
EOS, MASK, PAD = len(CHARS), len(CHARS) + 1, len(CHARS) + 2
VOCAB = len(CHARS) + 3


class CharTokenizer:
    """One id per character of :data:`CHARS` (others dropped); EOS, [MASK] and PAD after them."""

    eod = EOS
    vocab_size = VOCAB

    def tokenize(self, text: str) -> List[int]:
        return [CHARS.index(c) for c in text if c in CHARS]

    def detokenize(self, ids: List[int]) -> str:
        return "".join(CHARS[i] for i in ids if 0 <= i < len(CHARS))


class TinyLM(torch.nn.Module):
    """Embedding + one transformer layer + output layer; ``causal`` for an AR model. Called as
    ``model(tokens, attention)`` with ``attention`` ``[b, s]`` bool (``False``: padding) or ``None``."""

    def __init__(self, causal: bool = False, seed: int = 0, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.causal = causal
        self.embed = torch.nn.Embedding(VOCAB, width)
        self.pos = torch.nn.Embedding(256, width)
        self.layer = torch.nn.TransformerEncoderLayer(width, 2, 64, dropout=0.0, batch_first=True)
        self.out = torch.nn.Linear(width, VOCAB)

    def forward(self, tokens: Tensor, attention: Optional[Tensor] = None) -> Tensor:
        b, s = tokens.shape
        h = self.embed(tokens) + self.pos(torch.arange(s).unsqueeze(0).expand(b, s))
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), 1) if self.causal else None
        padding = None if attention is None else ~attention.bool()
        return self.out(self.layer(h, src_mask=causal, src_key_padding_mask=padding)).float()


# ---------------------------------------------------------------------------------------------
# The RL module contract, written out


def group_advantages(rewards: Tensor, group_size: int, *, scale: str = "std", eps: float = 1e-4) -> Tensor:
    g = rewards.view(-1, group_size)
    centred = g - g.mean(1, keepdim=True)
    if scale == "std":
        centred = centred / (g.std(1, keepdim=True) + eps)
    return centred.reshape(-1)


def varying_groups(rewards: Tensor, group_size: int) -> Tensor:
    g = rewards.view(-1, group_size)
    return (g != g[:, :1]).any(1)


@dataclass
class PolicyLossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_beta: float = 0.0
    normalisation: str = "token"


def policy_loss(logp, old_logp, advantages, mask, cfg, ref_logp=None, group_size=None):
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    kl = torch.zeros_like(logp)
    if ref_logp is not None and cfg.kl_beta > 0:
        d = ref_logp - logp
        kl = torch.exp(d) - d - 1
        per_token = per_token + cfg.kl_beta * kl
    m = mask.float()
    if cfg.normalisation == "token":
        loss = (per_token * m).sum() / m.sum().clamp(min=1)
    else:
        loss = ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    clip = ((ratio - clipped).abs() > 0).float()
    ratio, kl = ratio.detach(), kl.detach()
    return loss, {"kl": float((kl * m).sum() / m.sum().clamp(min=1)),
                  "clip_fraction": float((clip * m).sum() / m.sum().clamp(min=1)),
                  "ratio_mean": float((ratio * m).sum() / m.sum().clamp(min=1))}


class OneStep:
    """d1's estimator: completion all masked, each prompt token masked with ``prompt_mask_prob``, one pass."""

    name, forward_passes = "one-step", 1

    def __call__(self, model_fn, prompt, completion, completion_mask, *, mask_id, generator, prompt_mask_prob=0.0):
        masked_prompt = torch.rand(prompt.shape, generator=generator, device=prompt.device) < prompt_mask_prob
        x = torch.cat([prompt.masked_fill(masked_prompt, mask_id), torch.full_like(completion, mask_id)], 1)
        logits = model_fn(x)[:, prompt.shape[1]:]
        return torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)


class Exact:
    """AR log-probabilities: the logits at ``i`` score token ``i + 1``."""

    name, forward_passes = "ar", 1

    def __call__(self, model_fn, prompt, completion, completion_mask, *, mask_id, generator, prompt_mask_prob=0.0):
        x = torch.cat([prompt, completion], 1)
        logits = model_fn(x)[:, prompt.shape[1] - 1:-1]
        return torch.log_softmax(logits, -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)


@dataclass
class Scores:
    values: Tensor
    total: Tensor
    failures: List[Any] = field(default_factory=list)


class InProcessScorer:
    """Rewards called here (the real pool uses worker processes): a function raising or returning a
    non-number gives NaN and a failure."""

    def __init__(self, functions: List[Callable[..., Any]], weights: List[float]) -> None:
        self.functions, self.weights, self.calls, self.closed = functions, weights, 0, False

    def score(self, rows: List[Dict[str, Any]]) -> Scores:
        self.calls += 1
        values = torch.full((len(rows), len(self.functions)), float("nan"))
        failures = []
        for i, row in enumerate(rows):
            extra = {k: v for k, v in row.items() if k not in ("prompt", "completion")}
            for j, fn in enumerate(self.functions):
                try:
                    v = fn(row["prompt"], row["completion"], **extra)
                    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                        raise TypeError("not a number")
                    values[i, j] = float(v)
                except Exception as exc:  # noqa: BLE001 - every failure is reported
                    failures.append((row["prompt_id"], j, str(exc)))
        total = (values * torch.tensor(self.weights)).sum(1)
        return Scores(values, total, failures)

    def close(self) -> None:
        self.closed = True


def exact_match(prompt: str, completion: str, answer: str = "", **row: Any) -> float:
    return 1.0 if completion.strip() == str(answer).strip() else 0.0


def starts_with_digit(prompt: str, completion: str, **row: Any) -> float:
    return 1.0 if completion[:1].isdigit() else 0.0


def read_prompts(path, *, on_error="error"):
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    return rows, 0


def core(functions: Optional[List[Callable[..., Any]]] = None, weights: Optional[List[float]] = None,
         causal: bool = False) -> RLCore:
    """An :class:`RLCore` of the contract's formulas; rewards ``functions`` (default: exact match
    and a starts-with-a-digit format reward) scored in this process."""
    functions = functions or [exact_match, starts_with_digit]
    weights = weights or ([1.0, 0.5] if len(functions) == 2 else [1.0] * len(functions))
    scorer = InProcessScorer(functions, weights)
    return RLCore(group_advantages, varying_groups, policy_loss, PolicyLossConfig, Exact() if causal else OneStep(),
                  read_prompts, lambda rewards, workers, timeout: scorer)


ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (0, 7), (6, 2)]]


def config(**changes: Any) -> RLConfig:
    """A small diffu-GRPO config: 2 prompts x 4 completions, 6 generated tokens, sampled."""
    base = dict(algorithm="diffu-grpo", grpo_group_size=4, grpo_prompts_per_step=2, grpo_kl_beta=0.0,
                chat_template="plain", rewards=(("builtin:exact_match", 1.0), ("format.py:starts_with_digit", 0.5)),
                generate=dict(gen_length=6, steps=6, block_length=6, temperature=1.0))
    base.update(changes)
    return RLConfig(**base)


def engine(cfg: Optional[RLConfig] = None, *, rank: int = 0, ranks: int = 1, rl_core: Optional[RLCore] = None,
           seed: int = 7, micro_batch_size: int = 4) -> RolloutEngine:
    cfg = cfg or config()
    causal = not cfg.diffusion
    return RolloutEngine(cfg, tokenizer=CharTokenizer(), mask_id=None if causal else MASK, eos_id=EOS, pad_id=PAD,
                         seed=seed, rank=rank, ranks=ranks, micro_batch_size=micro_batch_size,
                         core=rl_core or core(causal=causal), rows=[dict(r) for r in ROWS])


def logits_fn(model: TinyLM) -> Callable[..., Tensor]:
    """The sampler's ``LogitsFn`` of ``model`` (no gradients)."""

    @torch.no_grad()
    def fn(tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        return model(tokens, attention_mask)

    return fn


def train_steps(eng: RolloutEngine, model: TinyLM, rollouts: int, *, lr: float = 0.05):
    """``rollouts`` rollout batches, each ``grpo_iterations`` optimizer steps over its microbatches
    (as the stage runs them); returns the rollouts and the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    made, losses = [], []
    for _ in range(rollouts):
        r = eng.rollout(logits_fn(model), policy_fn=logits_fn(model))
        made.append(r)
        for inner in range(eng.config.grpo_iterations):
            opt.zero_grad()
            step = 0.0
            for k, start in enumerate(range(0, r.rows, eng.micro_batch_size)):
                loss, _ = eng.loss(model, r, slice(start, start + eng.micro_batch_size), inner, k)
                loss.backward()
                step += float(loss)
            opt.step()
            losses.append(step)
    return made, losses
