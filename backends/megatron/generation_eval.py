"""Generation accuracy during training (``[eval.generation]``): at every ``every``-th step the
current model samples completions of a task's prompts with the sampler
(:func:`dlmspec.backends.generate.sampler.generate` for a diffusion LM, :func:`~dlmspec.backends.
generate.sampler.generate_ar` for an AR one, through :func:`~dlmspec.backends.generate.models.
gpt_logits_fn`), a checker scores them (:mod:`dlmspec.tasks.check`), and the ``eval`` record
``{"iteration", "generation_accuracy", "generation_correct", "generation_count",
"generation_interval_95", ...}`` is logged beside the validation loss (TensorBoard and W&B:
``eval/generation_accuracy``). The interval is Wilson's 95 % score interval
(:func:`dlmspec.backends.generate.likelihood.wilson_interval`).

Prompts are split over the data-parallel ranks (rank ``r`` of ``d`` takes rows ``r, r + d, ...``),
the counts summed over the data-parallel group; the tensor-parallel ranks of a data-parallel rank
sample the same rows (``gpt_logits_fn`` gathers the vocabulary slices). Pipeline parallelism is
refused by validate (rule ``eval-generation-layout``). Each sampler call's generator is seeded
with ``[generate] seed`` plus the file index of its first row; greedy decoding (temperature 0, the
task specs' setting) draws nothing, so its completions do not depend on the batch size or the
data-parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from dlmspec import objectives
from dlmspec.tasks.check import exact_match

#: The checkers ``[eval.generation] checker`` names: ``(completion, answer) -> bool``.
CHECKERS: Dict[str, Callable[[str, str], bool]] = {"exact_match": exact_match}


@dataclass
class GenerationEvalConfig:
    """``[eval.generation]`` as train.py writes it.

    Attributes:
        prompts: JSONL of ``{"prompt", "answer"}`` rows (:func:`dlmspec.tasks.rows.read_task_rows`).
        every: steps between evaluations (a multiple of ``ScheduleConfig.eval_interval``).
        max_prompts: the file's first rows scored.
        batch_size: prompts per sampler call (per data-parallel rank).
        checker: a name of :data:`CHECKERS`.
        generate: ``GenerateConfig`` keyword arguments (``[generate]``'s values, without the model's
            token ids, which come from the run).
        preset: ``[generate] preset`` (recorded).
        tokenizer: :func:`dlmspec.tokenizers.build_tokenizer` arguments (``tokenizer_type``, files).
    """

    prompts: str
    every: int
    max_prompts: int = 500
    batch_size: int = 64
    checker: str = "exact_match"
    generate: Dict[str, Any] = field(default_factory=dict)
    preset: Optional[str] = None
    tokenizer: Dict[str, Any] = field(default_factory=dict)


class GenerationEvalError(ValueError):
    """The evaluation cannot start (its prompts file, tokenizer or settings); the message names
    the file or key and a fix."""


def score_prompts(logits_fn: Callable[..., torch.Tensor], rows: Sequence[Dict[str, Any]], *,
                  encode: Callable[[str], List[int]], decode: Callable[[List[int]], str], config: Any,
                  batch_size: int, device: Any, checker: Callable[[str, str], bool] = exact_match,
                  noise_schedule: Any = None, indices: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Sample a completion of each row's ``prompt`` and score it against its ``answer``.

    Args:
        logits_fn: the model (``(tokens [B, S], attention_mask [B, S]) -> logits [B, S, V]``).
        rows: ``{"prompt", "answer"}`` dicts.
        encode, decode: text <-> token ids.
        config: a ``GenerateConfig`` (``kind`` picks the sampler); row ``i`` is sampled with seed
            ``config.seed + indices[i]``, one prompt per generator draw.
        batch_size: rows per sampler call; rows of one call share a generator seeded with the first
            row's seed (greedy decoding does not draw, so its completions do not depend on it).
        device: where the canvas lives.
        checker: ``(completion, answer) -> bool``.
        noise_schedule: the diffusion model's masking schedule (``None``: linear).
        indices: each row's index in the file (default ``0 .. len(rows) - 1``).

    Returns:
        ``{"correct", "count", "forward_passes", "completions"}``; ``completions`` holds
        ``{"index", "completion", "correct"}`` per row.
    """
    from dlmspec.backends.generate.sampler import generate, generate_ar

    indices = list(range(len(rows))) if indices is None else list(indices)
    sampler = generate if objectives.get(config.kind).diffusion else generate_ar
    correct, passes, completions = 0, 0, []
    for first in range(0, len(rows), batch_size):
        batch = rows[first:first + batch_size]
        prompts = [encode(r["prompt"]) for r in batch]
        gen = torch.Generator(device=device).manual_seed(config.seed + indices[first])
        kwargs = {"noise_schedule": noise_schedule} if sampler is generate else {}
        out = sampler(logits_fn, prompts, config, generator=gen, device=device, **kwargs)
        passes += out.forward_passes
        for i, (row, ids) in enumerate(zip(batch, out.generated)):
            text = decode(ids)
            ok = bool(checker(text, row["answer"]))
            correct += ok
            completions.append({"index": indices[first + i], "completion": text, "correct": ok})
    return {"correct": correct, "count": len(rows), "forward_passes": passes, "completions": completions}


def model_logits_fn(chunk: torch.nn.Module, tensor_model_parallel_size: int = 1) -> Callable[..., torch.Tensor]:
    """:func:`~dlmspec.backends.generate.models.gpt_logits_fn` of the training model ``chunk``.

    Under ``[kernels] cross_entropy = "fused_linear"`` the training model's output layer returns
    its input (:func:`~dlmspec.backends.megatron.output_loss.defer_output_projection`), so the
    model gives hidden states ``[b, s, h]``; they are projected here with the same weight
    (``h @ W^T`` in fp32: the output layer's ``ColumnParallelLinear`` without bias; that kernel
    runs at tensor-parallel size 1 only), giving the logits ``[b, s, V_padded]``.
    """
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.generate.models import gpt_logits_fn

    from .output_loss import _hidden_passthrough

    base = gpt_logits_fn(chunk, tensor_model_parallel_size=tensor_model_parallel_size)
    inner = unwrap_model(chunk)
    layer = getattr(inner, "output_layer", None)
    if layer is None or getattr(layer.forward, "__func__", None) is not _hidden_passthrough:
        return base
    weight = inner.shared_embedding_or_output_weight() if inner.share_embeddings_and_output_weights else layer.weight

    @torch.no_grad()
    def projected(tokens: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return base(tokens, attention_mask) @ weight.float().t()

    return projected


class GenerationEvaluator:
    """Reads the prompts and builds the tokenizer once (at the start of training, so a bad file
    stops the run before the first step), then scores the model at :meth:`due` steps.

    Raises (``__init__``):
        GenerationEvalError: the prompts file cannot be used, the tokenizer cannot be built, or
            the settings are refused by ``GenerateConfig``.
    """

    def __init__(self, cfg: GenerationEvalConfig, *, kind: str, mask_token_id: Optional[int], eos_token_id: Optional[int],
                 noise_schedule: Any = None, tokenizer: Any = None) -> None:
        from dlmspec.backends.generate.config import GenerateConfig
        from dlmspec.generate_settings import GenerateConfigError
        from dlmspec.tasks.rows import TaskFileError, read_task_rows

        if cfg.checker not in CHECKERS:
            raise GenerationEvalError(f"[eval.generation] checker = {cfg.checker!r}: use one of {', '.join(CHECKERS)}")
        self.cfg, self.checker, self.noise_schedule = cfg, CHECKERS[cfg.checker], noise_schedule
        try:
            self.rows = read_task_rows(cfg.prompts, max_rows=cfg.max_prompts)
        except TaskFileError as exc:
            raise GenerationEvalError(f"[eval.generation] prompts: {exc}") from None
        if tokenizer is None:
            from dlmspec.tokenizers import TokenizerError, build_tokenizer

            try:
                tokenizer = build_tokenizer(**cfg.tokenizer)
            except (TokenizerError, OSError, ValueError) as exc:
                raise GenerationEvalError(f"[eval.generation] needs [data.tokenizer] to encode the prompts: {exc}") from None
        self.tokenizer = tokenizer
        diffusion = objectives.get(kind).diffusion
        settings = dict(cfg.generate)
        try:
            self.config = GenerateConfig(kind=kind, mask_token_id=mask_token_id if diffusion else None,
                                         eos_token_id=eos_token_id, pad_token_id=eos_token_id if eos_token_id is not None else 0,
                                         **settings)
        except GenerateConfigError as exc:
            raise GenerationEvalError(f"[generate] {exc}") from None

    def due(self, iteration: int) -> bool:
        """Whether step ``iteration`` evaluates (``every`` divides it)."""
        return iteration > 0 and iteration % self.cfg.every == 0

    def encode(self, text: str) -> List[int]:
        return list(self.tokenizer.tokenize(text))

    def decode(self, ids: List[int]) -> str:
        vocab = self.tokenizer.vocab_size
        return self.tokenizer.detokenize([i for i in ids if i < vocab])

    def run(self, model: List[torch.nn.Module], *, device: Any, tensor_model_parallel_size: int = 1,
            dp_rank: int = 0, dp_size: int = 1, dp_group: Any = None) -> Dict[str, Any]:
        """Score this rank's share of the prompts with ``model[0]`` (in eval mode, no gradients;
        the caller turns megatron DDP's parameter hooks off as for the validation loss), sum the
        counts over ``dp_group``, and return the record to log (module docstring)."""
        import time

        from dlmspec.backends.generate.likelihood import wilson_interval
        from dlmspec.backends.generate.load import logits_columns

        start = time.perf_counter()
        logits_fn, _ = logits_columns(model_logits_fn(model[0], tensor_model_parallel_size),
                                      self.tokenizer.vocab_size, {})
        mine = list(range(dp_rank, len(self.rows), dp_size))
        was_training = [m.training for m in model]
        for m in model:
            m.eval()
        try:
            result = score_prompts(logits_fn, [self.rows[i] for i in mine], encode=self.encode, decode=self.decode,
                                   config=self.config, batch_size=self.cfg.batch_size, device=device,
                                   checker=self.checker, noise_schedule=self.noise_schedule, indices=mine)
        finally:
            for m, flag in zip(model, was_training):
                m.train(flag)
            # the sampler's CUDA graphs ([generate] cuda_graph) are kept on the model object for its life;
            # here that is the training model, so they go with the evaluation: their memory pool
            # (static logits and activations) returns to training, which `plan` counts without it
            from dlmspec.backends.generate.cuda_graphs import release_model_graphs

            release_model_graphs(model[0])
        counts = torch.tensor([result["correct"], result["count"], result["forward_passes"]], dtype=torch.float64,
                              device=device)
        if dp_size > 1:
            torch.distributed.all_reduce(counts, group=dp_group)
        correct, count = int(counts[0]), int(counts[1])
        low, high = wilson_interval(correct, count)
        return {"generation_accuracy": correct / count, "generation_correct": correct, "generation_count": count,
                "generation_interval_95": [low, high], "generation_forward_passes": int(counts[2]),
                "generation_seconds": time.perf_counter() - start, "generation_checker": self.cfg.checker,
                "generation_preset": self.cfg.preset, "generation_settings": self.config.to_dict(),
                "generation_examples": result["completions"][:3]}


def build_generation_eval(run: Any) -> Optional[GenerationEvaluator]:
    """The :class:`GenerationEvaluator` of ``run.generation_eval`` (``None`` when it is not set),
    with the run's objective kind, mask and EOD ids and masking schedule.

    Raises:
        SystemExit: code 2 after the reason on stderr (rank 0), when it cannot start.
    """
    import sys

    cfg = getattr(run, "generation_eval", None)
    if cfg is None:
        return None
    registered = objectives.get(run.objective.kind)
    schedule = None
    if registered.diffusion and hasattr(registered, "schedule"):
        try:
            schedule = registered.schedule(run.objective)
        except (TypeError, ValueError, AttributeError):
            schedule = None
    try:
        return GenerationEvaluator(cfg, kind=run.objective.kind, mask_token_id=run.objective.mask_token_id,
                                   eos_token_id=run.data.eod_id, noise_schedule=schedule)
    except GenerationEvalError as exc:
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            print(f"train.py: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def log_generation_eval(evaluator: Optional[GenerationEvaluator], parts: Any, logger: Any, iteration: int,
                        tensor_model_parallel_size: int = 1) -> None:
    """At a step :meth:`GenerationEvaluator.due` evaluates: megatron DDP's parameter hooks off (as
    for the validation loss), :meth:`GenerationEvaluator.run`, hooks on, then the ``eval`` record
    and a console line on the logging rank."""
    if evaluator is None or not evaluator.due(iteration):
        return
    from megatron.core import parallel_state

    from .optim import set_param_sync_hooks

    set_param_sync_hooks(parts.model, parts.ddp_config, enable=False)
    try:
        with torch.no_grad():
            record = evaluator.run(parts.model, device=parts.device,
                                   tensor_model_parallel_size=tensor_model_parallel_size,
                                   dp_rank=parallel_state.get_data_parallel_rank(),
                                   dp_size=parallel_state.get_data_parallel_world_size(),
                                   dp_group=parallel_state.get_data_parallel_group())
    finally:
        set_param_sync_hooks(parts.model, parts.ddp_config, enable=True)
    low, high = record["generation_interval_95"]
    logger.text(f"iter {iteration:>7d} | generation accuracy {record['generation_accuracy']:.4f} "
                f"({record['generation_correct']}/{record['generation_count']}, Wilson 95 % {low:.3f}-{high:.3f})")
    logger.record("eval", {"iteration": iteration, **record}, step=iteration)
