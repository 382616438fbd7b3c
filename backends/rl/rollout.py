"""Rollouts, rewards, advantages and the policy loss of one data-parallel rank, in pure torch (no
megatron): the :class:`RolloutEngine` that :class:`dlmspec.backends.rl.stage.RLStage` drives, and
what the stage reports. See :mod:`dlmspec.backends.rl.stage` for the algorithm."""

from __future__ import annotations

import atexit
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

#: ``stage.rl.algorithm`` -> its default estimator (the names of backends/rl/estimators.py).
ALGORITHM_ESTIMATOR = {"diffu-grpo": "one-step", "coupled-grpo": "coupled", "grpo": "ar"}
#: Estimators that score a masked-diffusion model.
DIFFUSION_ESTIMATORS = ("one-step", "coupled", "mc-elbo")
#: Report key of the policy-loss statistics (per microbatch): see :data:`LOSS_FIELDS`.
LOSS_REPORT = "rl loss"
#: Report key of the rollout statistics (once per rollout batch and rank): see :meth:`RolloutStats.vector`.
ROLLOUT_REPORT = "rl rollout"
#: Entries of :data:`LOSS_REPORT` (sums over microbatches).
LOSS_FIELDS = ("microbatches", "kl", "clip_fraction", "ratio_mean", "rows_trained")
#: The file of rollout samples in ``logging.run_dir``.
SAMPLES_FILE = "rollouts.jsonl"


@dataclass(frozen=True)
class RLConfig:
    """``[stage.rl]`` and the rollout sampler's ``[generate]`` settings as the runtime reads them
    (the compiled ``train.py``'s ``build_rl()``; names as :class:`dlmspec.spec.models.RLSpec`).

    Attributes:
        generate: keyword arguments of :class:`dlmspec.generate_settings.GenerateConfig` but the
            token ids (``gen_length``, ``steps``, ``block_length``, ``remasking``, ``threshold``,
            ``temperature``, ``top_k``, ``top_p``, ``cfg_scale``, ``seed``).
        rewards: ``((function, weight), ...)``, ``function`` = ``"file.py:name"`` or ``"builtin:name"``.
        The others: see ``RLSpec``.
    """

    algorithm: str = "diffu-grpo"
    estimator: Optional[str] = None
    elbo_samples: int = 4
    prompts: str = ""
    prompts_on_error: str = "error"
    chat_template: str = "chatml"
    rewards: Tuple[Tuple[str, float], ...] = (("builtin:exact_match", 1.0),)
    reward_workers: int = 2
    reward_timeout_s: float = 10.0
    grpo_group_size: int = 8
    grpo_prompts_per_step: int = 8
    grpo_iterations: int = 1
    grpo_clamp_eps_lower: float = 0.2
    grpo_clamp_eps_upper: float = 0.2
    grpo_kl_beta: float = 0.04
    ref_model_sync_steps: Optional[int] = 64
    prompt_mask_prob: float = 0.15
    advantage_scale: str = "std"
    filter_groups: bool = False
    loss_normalization: str = "token"
    truncated_completions: str = "keep"
    sample_log_interval: int = 10
    generate: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHM_ESTIMATOR:
            raise ValueError(f"stage.rl.algorithm must be one of {sorted(ALGORITHM_ESTIMATOR)}, got {self.algorithm!r}")
        if self.truncated_completions not in ("keep", "mask", "zero_reward"):
            raise ValueError("stage.rl.truncated_completions must be 'keep', 'mask' or 'zero_reward', got "
                             f"{self.truncated_completions!r}")
        if self.grpo_group_size < 1 or self.grpo_prompts_per_step < 1 or self.grpo_iterations < 1:
            raise ValueError("stage.rl.grpo_group_size, grpo_prompts_per_step and grpo_iterations must be >= 1")

    @property
    def estimator_name(self) -> str:
        """The estimator: ``estimator``, else the algorithm's (:data:`ALGORITHM_ESTIMATOR`)."""
        return self.estimator or ALGORITHM_ESTIMATOR[self.algorithm]

    @property
    def diffusion(self) -> bool:
        """Whether the policy is a masked-diffusion model (its estimator says)."""
        return self.estimator_name in DIFFUSION_ESTIMATORS


# ----------------------------------------------------------------------------------------------
# The RL package's modules (backends/rl/{advantages,loss,estimators,rewards,prompts}.py), read late
# so that this module imports without them (a test passes its own).


@dataclass
class RLCore:
    """The functions a :class:`RolloutEngine` uses, by the RL module contract.

    Attributes:
        group_advantages: ``(rewards [N], group_size, *, scale) -> [N]``.
        varying_groups: ``(rewards [N], group_size) -> bool [N // G]``.
        policy_loss: ``(logp, old_logp, advantages, mask, cfg, ref_logp=, group_size=) -> (loss, stats)``.
        loss_config: ``PolicyLossConfig(eps_low=, eps_high=, kl_beta=, normalisation=)``.
        estimator: the log-probability estimator (``name``, ``forward_passes``, ``__call__``).
        read_prompts: ``(path, *, on_error) -> (rows, skipped)``.
        make_scorer: ``(rewards ((function, weight), ...), workers, timeout_s) -> object`` with
            ``score(rows) -> RewardScores`` and ``close()``.
    """

    group_advantages: Callable[..., Tensor]
    varying_groups: Callable[..., Tensor]
    policy_loss: Callable[..., Tuple[Tensor, Dict[str, float]]]
    loss_config: Callable[..., Any]
    estimator: Any
    read_prompts: Callable[..., Tuple[List[Dict[str, Any]], int]]
    make_scorer: Callable[..., Any]


def default_core(config: RLConfig) -> RLCore:
    """:class:`RLCore` of ``dlmspec.backends.rl`` (the estimator of ``config``; ``mc-elbo`` with
    ``elbo_samples`` masks).

    Raises:
        ImportError: the RL package's modules are not installed.
    """
    from dlmspec.backends.rl import advantages, estimators, loss, prompts, rewards

    name = config.estimator_name
    try:
        estimator = estimators.get(name, k=config.elbo_samples) if name == "mc-elbo" else estimators.get(name)
    except TypeError:
        estimator = estimators.get(name)

    def make_scorer(functions, workers, timeout_s):
        return rewards.RewardPool([rewards.RewardFunction(f, float(w)) for f, w in functions], workers=workers,
                                  timeout_s=timeout_s)

    return RLCore(advantages.group_advantages, advantages.varying_groups, loss.policy_loss, loss.PolicyLossConfig,
                  estimator, prompts.read_prompts, make_scorer)


# ----------------------------------------------------------------------------------------------
# Rollouts


@dataclass
class Rollout:
    """One rank's share of a rollout batch (``N`` = prompts x ``G`` rows, group-major).

    Attributes:
        index: The rollout batch's number (0-based, over the run).
        tokens: ``[N, P + T]`` left-padded prompts and completions.
        attention: ``[N, P + T]`` bool, ``False`` on prompt padding, or ``None`` (no padding).
        prompt_length: ``P``.
        completion_mask: ``[N, T]`` bool: completion tokens up to and including the first EOS.
        advantages: ``[N]`` float.
        keep: ``[N]`` bool: rows in the loss (not failed, not filtered, not a masked truncation).
        old_logp: per inner iteration ``[N, T]`` or ``None`` (``None`` in place of the list:
            ``grpo_iterations = 1``). A ``None`` entry (the first inner iteration's) takes the ratio
            against the training forward's own log-probabilities, detached: the policy has not
            changed since the rollout, so they are the rollout policy's.
        ref_logp: per inner iteration ``[N, T]`` of the reference (``None``: no KL).
        stats: :class:`RolloutStats`.
        samples: the rows as text (prompt, completion, rewards), for the samples file.
    """

    index: int
    tokens: Tensor
    attention: Optional[Tensor]
    prompt_length: int
    completion_mask: Tensor
    advantages: Tensor
    keep: Tensor
    old_logp: Optional[List[Optional[Tensor]]] = None
    ref_logp: Optional[List[Optional[Tensor]]] = None
    stats: Optional["RolloutStats"] = None
    samples: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return int(self.tokens.shape[0])

    def state(self) -> Dict[str, Any]:
        """Tensors and numbers only (a checkpoint's stage state)."""
        return {"index": self.index, "tokens": self.tokens.cpu(), "attention": None if self.attention is None else
                self.attention.cpu(), "prompt_length": self.prompt_length, "completion_mask": self.completion_mask.cpu(),
                "advantages": self.advantages.cpu(), "keep": self.keep.cpu(),
                "old_logp": move_logps(self.old_logp, "cpu"), "ref_logp": move_logps(self.ref_logp, "cpu")}

    @classmethod
    def from_state(cls, state: Dict[str, Any]) -> "Rollout":
        return cls(**{k: state[k] for k in ("index", "tokens", "attention", "prompt_length", "completion_mask",
                                            "advantages", "keep", "old_logp", "ref_logp")})


def move_logps(logps: Optional[List[Optional[Tensor]]], device: Any) -> Optional[List[Optional[Tensor]]]:
    """``logps`` (a :class:`Rollout`'s ``old_logp`` / ``ref_logp``) on ``device``, ``None`` entries kept."""
    return None if logps is None else [None if t is None else t.to(device) for t in logps]


@dataclass
class RolloutStats:
    """What one rank's rollout batch measured (summed over ranks by the step's report).

    ``reward_sums`` / ``reward_squares``: per reward function (finite values only) and
    ``reward_counts`` their counts; ``total_*``: the weighted total. ``seconds``: the sampler's
    (synchronised with the GPU); ``reward_seconds``: the completions' detokenisation and their
    scoring by the reward functions, host work the plan does not price.
    """

    completions: int = 0
    total_sum: float = 0.0
    total_square: float = 0.0
    total_count: int = 0
    reward_sums: List[float] = field(default_factory=list)
    reward_squares: List[float] = field(default_factory=list)
    reward_counts: List[int] = field(default_factory=list)
    correct: int = 0
    judged: int = 0
    failures: int = 0
    groups: int = 0
    flat_groups: int = 0
    filtered_groups: int = 0
    completion_tokens: int = 0
    eos_terminated: int = 0
    truncated: int = 0
    seconds: float = 0.0
    generated_tokens: int = 0
    reward_seconds: float = 0.0

    def vector(self) -> List[float]:
        """The stats as one list of numbers (:data:`ROLLOUT_REPORT`), fixed length for a run."""
        head = [self.completions, self.total_sum, self.total_square, self.total_count, self.correct, self.judged,
                self.failures, self.groups, self.flat_groups, self.filtered_groups, self.completion_tokens,
                self.eos_terminated, self.truncated, self.seconds, self.generated_tokens, self.reward_seconds, 1.0]
        return [float(x) for x in head + self.reward_sums + self.reward_squares + self.reward_counts]


_HEAD = ("completions", "total_sum", "total_square", "total_count", "correct", "judged", "failures", "groups",
         "flat_groups", "filtered_groups", "completion_tokens", "eos_terminated", "truncated", "seconds",
         "generated_tokens", "reward_seconds", "ranks")


def rollout_metrics(vector: Sequence[float], functions: Sequence[str]) -> Dict[str, Optional[float]]:
    """The ``train`` record entries of summed :meth:`RolloutStats.vector` s (``rl/...`` keys).

    Reward std is the population std of all completions' finite rewards; tokens/s is generated
    tokens over the mean rollout seconds of the ranks (they roll out at the same time); reward
    seconds are the ranks' mean too.
    """
    v = [float(x) for x in vector]
    h = dict(zip(_HEAD, v[:len(_HEAD)]))
    f = len(functions)
    sums, squares, counts = v[len(_HEAD):len(_HEAD) + f], v[len(_HEAD) + f:len(_HEAD) + 2 * f], v[len(_HEAD) + 2 * f:]

    def mean_std(s: float, q: float, n: float) -> Tuple[Optional[float], Optional[float]]:
        if n <= 0:
            return None, None
        mean = s / n
        return mean, math.sqrt(max(q / n - mean * mean, 0.0))

    out: Dict[str, Optional[float]] = {}
    out["rl/reward_mean"], out["rl/reward_std"] = mean_std(h["total_sum"], h["total_square"], h["total_count"])
    for name, s, q, n in zip(functions, sums, squares, counts):
        label = name.rsplit(":", 1)[-1]
        out[f"rl/reward/{label}_mean"], out[f"rl/reward/{label}_std"] = mean_std(s, q, n)
    out["rl/accuracy"] = h["correct"] / h["judged"] if h["judged"] else None
    out["rl/reward_failures"] = h["failures"]
    groups = h["groups"]
    out["rl/flat_group_share"] = h["flat_groups"] / groups if groups else None
    out["rl/filtered_group_share"] = h["filtered_groups"] / groups if groups else None
    n = h["completions"]
    out["rl/completion_length"] = h["completion_tokens"] / n if n else None
    out["rl/eos_share"] = h["eos_terminated"] / n if n else None
    out["rl/truncated_share"] = h["truncated"] / n if n else None
    ranks = max(h["ranks"], 1.0)
    seconds = h["seconds"] / ranks
    out["rl/rollout_seconds"] = seconds
    out["rl/rollout_tokens_per_s"] = h["generated_tokens"] / seconds if seconds > 0 else None
    out["rl/reward_seconds"] = h["reward_seconds"] / ranks
    return out


def completion_mask(completions: Tensor, eos_id: Optional[int]) -> Tuple[Tensor, Tensor]:
    """``(mask [N, T] bool, ended [N] bool)``: a completion's tokens up to and including its first
    EOS (d1 / TRL's GRPO: what follows the first EOS is not the completion), all of them when it
    has none; ``ended``: whether it has one."""
    n, t = completions.shape
    if eos_id is None or t == 0:
        return torch.ones(n, t, dtype=torch.bool, device=completions.device), torch.zeros(n, dtype=torch.bool,
                                                                                           device=completions.device)
    is_eos = completions == eos_id
    ended = is_eos.any(dim=1)
    first = torch.where(ended, is_eos.int().argmax(dim=1), torch.full_like(ended, t, dtype=torch.long))
    columns = torch.arange(t, device=completions.device).unsqueeze(0)
    return columns <= first.unsqueeze(1), ended


def render_prompt(text: str, template: str) -> str:
    """``text`` as one user turn with the assistant's turn opened (the SFT stage's built-in chat
    templates, :func:`dlmspec.data.chat.render`); ``template = "none"``: ``text`` itself.

    Raises:
        ValueError: a template that is not built in (``"tokenizer"``: the RL stage renders
            built-in templates only).
    """
    if template == "none":
        return text
    if template == "tokenizer":
        raise ValueError("stage.rl.chat_template = 'tokenizer' is not available to the RL stage: use 'chatml', "
                         "'llama3', 'plain' or 'none'")
    from dlmspec.data.chat import render, text_of

    return text_of(render(template, [{"role": "user", "content": text}], add_generation_prompt=True))


def estimator_generator(seed: int, rollout: int, inner: int, rank: int, microbatch: int,
                        device: Any = None) -> torch.Generator:
    """The estimator's masks for rows of microbatch ``microbatch`` in inner iteration ``inner`` of
    rollout batch ``rollout`` on data-parallel rank ``rank``: the same draws for the rollout
    policy's, the reference's and the trained policy's log-probabilities of those rows (so the
    ratio is exactly 1 before the first update), fresh ones at each inner iteration (d1)."""
    g = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    mixed = (int(seed) * 1_000_003 + int(rollout) * 10_007 + int(inner) * 101 + int(rank)) * 1_009 + int(microbatch)
    g.manual_seed(mixed % (2 ** 63 - 1))
    return g


class RolloutEngine:
    """Rollouts, rewards, advantages and log-probabilities of one data-parallel rank (pure torch:
    no megatron; the :class:`RLStage` lends it the model).

    Args:
        config: :class:`RLConfig`.
        core: :class:`RLCore` (default: :func:`default_core`).
        tokenizer: ``tokenize(text) -> ids`` and ``detokenize(ids) -> text``.
        mask_id: The mask token (masked diffusion), else ``None``.
        eos_id: The EOS/EOD token ending a completion.
        pad_id: The id of prompt padding.
        seed: The run's seed.
        rank, ranks: This rank's data-parallel rank and the data-parallel size.
        micro_batch_size: Rows per microbatch (old / reference log-probabilities are computed in
            these chunks, with the training forward step's estimator draws).
        device: Where rollouts are made.
        noise_schedule: The objective's masking schedule for the sampler (``None``: linear).
        rows: Prompt rows instead of reading ``config.prompts`` (tests).

    Raises:
        PromptFileError (``read_prompts``): a malformed prompts file with ``prompts_on_error = "error"``.
        ValueError: no prompt, or ``grpo_prompts_per_step`` does not split over ``ranks``.
    """

    def __init__(self, config: RLConfig, *, tokenizer: Any, mask_id: Optional[int], eos_id: Optional[int],
                 pad_id: int, seed: int, rank: int = 0, ranks: int = 1, micro_batch_size: int = 1,
                 device: Any = "cpu", core: Optional[RLCore] = None, noise_schedule: Any = None,
                 rows: Optional[List[Dict[str, Any]]] = None) -> None:
        self.config = config
        self.core = core if core is not None else default_core(config)
        self.tokenizer, self.mask_id, self.eos_id, self.pad_id = tokenizer, mask_id, eos_id, int(pad_id)
        self.seed, self.rank, self.ranks = int(seed), int(rank), int(ranks)
        self.micro_batch_size = int(micro_batch_size)
        self.device = torch.device(device)
        self.noise_schedule = noise_schedule
        if config.grpo_prompts_per_step % self.ranks:
            raise ValueError(f"stage.rl.grpo_prompts_per_step = {config.grpo_prompts_per_step} does not split over "
                             f"{self.ranks} data-parallel ranks")
        if rows is None:
            rows, self.skipped = self.core.read_prompts(config.prompts, on_error=config.prompts_on_error)
        else:
            self.skipped = 0
        if not rows:
            raise ValueError(f"{config.prompts or 'the prompts'}: no prompt to roll out")
        self.rows = list(rows)
        self.prompt_ids = [list(self.tokenizer.tokenize(render_prompt(str(r["prompt"]), config.chat_template)))
                           for r in self.rows]
        self.functions = [f for f, _ in config.rewards]
        self.exact = [i for i, f in enumerate(self.functions) if f == "builtin:exact_match"]
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed((self.seed * 7_919 + 17 * self.rank + 1) % (2 ** 63 - 1))
        self.epoch, self.cursor, self.rollouts = 0, 0, 0
        self.order = self._order(0)
        self._scorer = None

    # -- prompt order ------------------------------------------------------------------------
    def _order(self, epoch: int) -> Tensor:
        g = torch.Generator()
        g.manual_seed((self.seed * 104_729 + epoch) % (2 ** 63 - 1))  # the same on every rank
        return torch.randperm(len(self.rows), generator=g)

    def next_prompts(self) -> List[int]:
        """This rank's prompts of the next rollout batch (indices into :attr:`rows`): the global
        batch is the next ``grpo_prompts_per_step`` of the epoch's order; when fewer are left, the
        tail is dropped and a new seeded order starts (a batch holds each prompt once, unless the
        file has fewer prompts than a batch). Rank ``r`` takes its ``r``-th equal share."""
        per_step = self.config.grpo_prompts_per_step
        picked: List[int] = []
        if len(self.order) - self.cursor < per_step <= len(self.order):
            self.cursor = len(self.order)  # the epoch's tail is dropped: a batch holds a prompt once
        while len(picked) < per_step:
            if self.cursor >= len(self.order):
                self.epoch += 1
                self.order, self.cursor = self._order(self.epoch), 0
            take = min(per_step - len(picked), len(self.order) - self.cursor)
            picked += [int(i) for i in self.order[self.cursor:self.cursor + take]]
            self.cursor += take
        share = per_step // self.ranks
        return picked[self.rank * share:(self.rank + 1) * share]

    # -- rewards -----------------------------------------------------------------------------
    @property
    def scorer(self) -> Any:
        if self._scorer is None:
            c = self.config
            self._scorer = self.core.make_scorer(c.rewards, c.reward_workers, c.reward_timeout_s)
            atexit.register(self.close)  # the stage has no end hook: stop the workers when the job exits
        return self._scorer

    def close(self) -> None:
        """Stop the reward workers (idempotent)."""
        if self._scorer is not None:
            scorer, self._scorer = self._scorer, None
            scorer.close()

    # -- the rollout -------------------------------------------------------------------------
    def generate_config(self) -> Any:
        from dlmspec.generate_settings import GenerateConfig

        kind = "mdm" if self.config.diffusion else "ar"
        return GenerateConfig(kind=kind, mask_token_id=self.mask_id if self.config.diffusion else None,
                              eos_token_id=self.eos_id, pad_token_id=self.pad_id, **self.config.generate)

    def sample(self, logits_fn: Callable[..., Tensor], prompt_ids: List[List[int]]) -> Any:
        """The sampler's :class:`GenerateOutput` of ``G`` completions per prompt (group-major)."""
        from dlmspec.backends.generate.sampler import generate, generate_ar

        expanded = [ids for ids in prompt_ids for _ in range(self.config.grpo_group_size)]
        gen_config = self.generate_config()
        if self.config.diffusion:
            return generate(logits_fn, expanded, gen_config, generator=self.generator, device=self.device,
                            noise_schedule=self.noise_schedule)
        return generate_ar(logits_fn, expanded, gen_config, generator=self.generator, device=self.device)

    def rollout(self, logits_fn: Callable[..., Tensor], *, policy_fn: Optional[Callable[..., Tensor]] = None,
                reference_fn: Optional[Callable[..., Tensor]] = None) -> Rollout:
        """The next rollout batch of this rank (see the module docstring, steps 1-5).

        Args:
            logits_fn: The policy as the sampler's ``LogitsFn`` (no gradients).
            policy_fn: ``(tokens, attention) -> logits`` of the policy without gradients, for the
                rollout policy's log-probabilities (needed with ``grpo_iterations > 1``).
            reference_fn: the same of the reference model (needed with ``grpo_kl_beta > 0``).
        """
        c, G = self.config, self.config.grpo_group_size
        picked = self.next_prompts()
        start = time.perf_counter()
        out = self.sample(logits_fn, [self.prompt_ids[i] for i in picked])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        tokens, P = out.sequences.to(self.device), int(out.prompt_length)
        T = tokens.shape[1] - P
        if T < int(c.generate.get("gen_length", T)):  # AR stopped early: pad to one length
            tokens = torch.cat([tokens, torch.full((tokens.shape[0], int(c.generate["gen_length"]) - T), self.pad_id,
                                                   dtype=tokens.dtype, device=tokens.device)], dim=1)
            T = tokens.shape[1] - P
        lengths = [len(self.prompt_ids[i]) for i in picked for _ in range(G)]
        attention = None
        if min(lengths) != P:
            columns = torch.arange(P + T, device=self.device).unsqueeze(0)
            attention = columns >= torch.tensor([P - n for n in lengths], device=self.device).unsqueeze(1)
        mask, ended = completion_mask(tokens[:, P:], self.eos_id)
        truncated = torch.tensor([r == "length" for r in out.finish_reasons], dtype=torch.bool, device=self.device)

        scoring = time.perf_counter()
        rows = []
        for j, i in enumerate(picked):
            for k in range(G):
                n = j * G + k
                rows.append({**self.rows[i], "prompt": str(self.rows[i]["prompt"]),
                             "prompt_id": self.rows[i].get("prompt_id", int(i)),
                             "completion": self.tokenizer.detokenize(list(out.generated[n]))})
        scores = self.scorer.score(rows)
        values = scores.values.to(torch.float32).cpu()
        reward_seconds = time.perf_counter() - scoring
        total = scores.total.to(torch.float32).cpu().clone()
        failed = ~torch.isfinite(total)
        if c.truncated_completions == "zero_reward":
            total[truncated.cpu() & ~failed] = 0.0
        stats = self._stats(values, total, failed, scores, mask, ended, truncated, seconds, picked)
        stats.reward_seconds = reward_seconds

        # a failed reward gets its group's mean (no advantage) and no gradient
        grouped = total.view(-1, G)
        finite = torch.isfinite(grouped)
        means = torch.where(finite, grouped, torch.zeros_like(grouped)).sum(1) / finite.sum(1).clamp(min=1)
        filled = torch.where(finite, grouped, means.unsqueeze(1)).view(-1)
        advantages = self.core.group_advantages(filled, G, scale=c.advantage_scale)
        varying = self.core.varying_groups(filled, G).to(torch.bool).cpu()
        keep = ~failed
        stats.flat_groups = int((~varying).sum())
        if c.filter_groups:
            keep &= varying.repeat_interleave(G)
            stats.filtered_groups = stats.flat_groups
        if c.truncated_completions == "mask":
            keep &= ~truncated.cpu()
        advantages = torch.where(keep, advantages.float(), torch.zeros_like(advantages.float()))

        rollout = Rollout(self.rollouts, tokens, attention, P, mask, advantages.to(self.device), keep.to(self.device),
                          stats=stats)
        if c.grpo_iterations > 1 and policy_fn is not None:
            rollout.old_logp = self.score_all(policy_fn, rollout, start=1)
        if c.grpo_kl_beta > 0 and reference_fn is not None:
            rollout.ref_logp = self.score_all(reference_fn, rollout)
        rollout.samples = [{"rollout": self.rollouts, "prompt_id": r["prompt_id"], "prompt": r["prompt"],
                            "completion": r["completion"],
                            "rewards": {f: (None if not math.isfinite(v) else v) for f, v in zip(self.functions, vals)},
                            "total": None if not math.isfinite(t) else t, "advantage": float(a),
                            "finish_reason": reason}
                           for r, vals, t, a, reason in zip(rows, values.tolist(), total.tolist(),
                                                             advantages.tolist(), out.finish_reasons)]
        self.rollouts += 1
        return rollout

    def _stats(self, values: Tensor, total: Tensor, failed: Tensor, scores: Any, mask: Tensor, ended: Tensor,
               truncated: Tensor, seconds: float, picked: List[int]) -> RolloutStats:
        s = RolloutStats(completions=int(total.numel()), seconds=float(seconds))
        good = total[~failed]
        s.total_sum, s.total_square, s.total_count = float(good.sum()), float((good * good).sum()), int(good.numel())
        for f in range(values.shape[1]):
            col = values[:, f]
            col = col[torch.isfinite(col)]
            s.reward_sums.append(float(col.sum()))
            s.reward_squares.append(float((col * col).sum()))
            s.reward_counts.append(int(col.numel()))
        for f in self.exact:
            col = values[:, f]
            s.correct += int((col == 1.0).sum())
            s.judged += int(torch.isfinite(col).sum())
        s.failures = len(getattr(scores, "failures", []) or [])
        s.groups = len(picked)
        s.completion_tokens = int(mask.sum())
        s.eos_terminated = int(ended.sum())
        s.truncated = int(truncated.sum())
        s.generated_tokens = int(mask.sum())
        return s

    # -- log-probabilities -------------------------------------------------------------------
    def model_fn(self, logits: Callable[..., Tensor], attention: Optional[Tensor]) -> Callable[[Tensor], Tensor]:
        """The estimator's ``model_fn(tokens [M, P + T]) -> logits`` over rows whose padding is
        ``attention`` (repeated when an estimator stacks several noised copies of the rows)."""

        def fn(tokens: Tensor) -> Tensor:
            if attention is None:
                return logits(tokens, None)
            reps = tokens.shape[0] // attention.shape[0]
            return logits(tokens, attention.repeat(reps, 1) if reps > 1 else attention)

        return fn

    def logp(self, logits: Callable[..., Tensor], rollout: Rollout, rows: slice, inner: int, microbatch: int) -> Tensor:
        """``[m, T]`` per-token log-probabilities of the completions of ``rows`` (:meth:`scored`'s first)."""
        return self.scored(logits, rollout, rows, inner, microbatch)[0]

    def scored(self, logits: Callable[..., Tensor], rollout: Rollout, rows: slice, inner: int,
               microbatch: int) -> Tuple[Tensor, Optional[Tensor]]:
        """``(log_probs [m, T], weights [m, T] or None)`` of the completions of ``rows`` by the
        estimator's ``score`` (its ``__call__`` and ``None`` for one without ``score``), with the
        draws of (rollout, inner iteration, rank, microbatch) (:func:`estimator_generator`)."""
        tokens = rollout.tokens[rows]
        P = rollout.prompt_length
        attention = None if rollout.attention is None else rollout.attention[rows]
        generator = estimator_generator(self.seed, rollout.index, inner, self.rank, microbatch, tokens.device)
        estimator = self.core.estimator
        score = getattr(estimator, "score", None)
        args = (self.model_fn(logits, attention), tokens[:, :P], tokens[:, P:], rollout.completion_mask[rows])
        kwargs = dict(mask_id=self.mask_id if self.mask_id is not None else -1, generator=generator,
                      prompt_mask_prob=self.config.prompt_mask_prob if self.config.diffusion else 0.0)
        if score is None:
            return estimator(*args, **kwargs), None
        return score(*args, **kwargs)

    @torch.no_grad()
    def score_all(self, logits: Callable[..., Tensor], rollout: Rollout, *, start: int = 0) -> List[Optional[Tensor]]:
        """Per inner iteration ``i``, ``[N, T]`` log-probabilities of every row, microbatch by
        microbatch (the training step's chunks and draws); ``None`` for ``i < start``. An estimator
        whose values do not depend on its draws (``deterministic``: ``ar``) is run once, and every
        iteration from ``start`` on shares that tensor."""
        once = getattr(self.core.estimator, "deterministic", False)  # an estimator plugin may not say: draws
        out: List[Optional[Tensor]] = [None] * start
        for inner in range(start, self.config.grpo_iterations):
            if once and len(out) > start:
                out.append(out[-1])
                continue
            out.append(torch.cat([self.logp(logits, rollout, slice(s, s + self.micro_batch_size), inner, k).float()
                                  for k, s in enumerate(range(0, rollout.rows, self.micro_batch_size))]))
        return out

    def loss(self, logits: Callable[..., Tensor], rollout: Rollout, rows: slice, inner: int,
             microbatch: int) -> Tuple[Tensor, Dict[str, float]]:
        """The policy loss of ``rows`` at inner iteration ``inner`` (with gradients through
        ``logits``): ``policy_loss`` over completion tokens of the kept rows."""
        c = self.config
        logp, weight = self.scored(logits, rollout, rows, inner, microbatch)
        olds = rollout.old_logp
        old = olds[inner][rows] if olds is not None and olds[inner] is not None else logp.detach()
        ref = rollout.ref_logp[inner][rows] if rollout.ref_logp is not None else None
        mask = rollout.completion_mask[rows] & rollout.keep[rows].unsqueeze(1)
        if not bool(mask.any()):
            zero = logp.sum() * 0.0
            return zero, {"kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 1.0}
        cfg = self.core.loss_config(eps_low=c.grpo_clamp_eps_lower, eps_high=c.grpo_clamp_eps_upper,
                                    kl_beta=c.grpo_kl_beta, normalisation=c.loss_normalization)
        extra = {} if weight is None else {"token_weight": weight}
        return self.core.policy_loss(logp, old, rollout.advantages[rows], mask, cfg, ref_logp=ref,
                                     group_size=c.grpo_group_size, **extra)

    # -- checkpoint state --------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The rollout generator's state, the prompt order, cursor and epoch, and the rollout count."""
        return {"generator": self.generator.get_state(), "order": self.order.clone(), "cursor": self.cursor,
                "epoch": self.epoch, "rollouts": self.rollouts}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.order, self.cursor, self.epoch = state["order"].clone(), int(state["cursor"]), int(state["epoch"])
        self.rollouts = int(state["rollouts"])


def write_samples(run_dir: str, samples: List[Dict[str, Any]], step: int) -> None:
    """Append ``samples`` as JSON lines to ``<run_dir>/rollouts.jsonl`` (``dlmspec.files.append_text``:
    never through a link), each with ``step``."""
    from dlmspec.files import append_text

    os.makedirs(run_dir, exist_ok=True)
    text = "".join(json.dumps({"step": step, **s}, ensure_ascii=False, allow_nan=False) + "\n" for s in samples)
    append_text(os.path.join(run_dir, SAMPLES_FILE), text)


