"""The settings of one generation run: :class:`GenerateConfig`, frozen, validated, recordable.

Every output of the sampler records ``GenerateConfig.to_dict()`` beside it, so a number can be
reproduced from its settings (other tools' users cannot reproduce each other's results
because ``steps`` / ``block_length`` / ``gen_length`` go unrecorded). The defaults are LLaDA's
(github:ML-GSAI/LLaDA generate.py, ``generate()``): 128 steps, 128 tokens, one block of 128,
temperature 0, no guidance, low-confidence remasking; the threshold 0.9 is Fast-dLLM's
(github:NVlabs/Fast-dLLM llada/eval_gsm8k.sh). Plain Python: no torch import.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional

from dlmspec import objectives


def __getattr__(name: str) -> Any:
    """``KINDS``: the decoding rules, the registered ``[objective] kind`` values
    (:func:`dlmspec.objectives.kinds`: "mdm", masked diffusion, and "ar", left to right, first),
    read from the registry each time so a plugin's kind counts."""
    if name == "KINDS":
        return objectives.kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: Which masked positions a step commits (docs/generate.md, "Remasking").
REMASKING = ("low_confidence", "random", "threshold", "factor")
#: The remasking rules whose block ends when it has no mask left (not after ``steps_per_block``).
PARALLEL_REMASKING = ("threshold", "factor")
#: Block KV caches of semi-autoregressive decoding (docs/generate.md, "Block KV caches"):
#: Fast-dLLM's prefix and dual caches (arXiv:2505.22618 Sec. 3.2, github:NVlabs/Fast-dLLM
#: llada/generate.py ``generate_with_prefix_cache`` / ``generate_with_dual_cache``).
CACHES = ("none", "prefix", "dual")
#: Token ids are int64 in torch (``torch.long`` tensors): the largest id + 1 any model can have.
MAX_ID = 1 << 63
#: ``torch.Generator.manual_seed`` takes a 64-bit seed; the sampler seeds batch ``b`` with
#: ``seed + b x batch_size``, so the seed leaves half the range for that.
MAX_SEED = 1 << 62


class GenerateConfigError(ValueError):
    """A setting of :class:`GenerateConfig` that cannot work.

    A ``ValueError`` whose message names the field, the value and a value that works; the same
    three are attributes, for a CLI that reports them as a table (``SpecIssue`` of
    :mod:`dlmspec.errors`).

    Attributes:
        field: the :class:`GenerateConfig` field, e.g. ``"block_length"``.
        value: the value given.
        fix: a value or change that works, e.g. ``"block_length = 32 (divides gen_length = 128)"``.
    """

    def __init__(self, field: str, value: Any, why: str, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"{field} = {value!r}: {why}; use {fix}")


@dataclass(frozen=True)
class GenerateConfig:
    """Settings of a generation run (masked diffusion or autoregressive).

    Attributes:
        kind: ``"mdm"`` (masked-diffusion sampling, :func:`~dlmspec.backends.generate.sampler.generate`)
            or ``"ar"`` (left to right, :func:`~dlmspec.backends.generate.sampler.generate_ar`).
        gen_length: tokens generated after each prompt (LLaDA: 128).
        steps: denoising steps over all of ``gen_length``, divided equally over the blocks (LLaDA:
            128, ``steps % (gen_length // block_length) == 0``, ``steps <= gen_length``). Not used by
            ``remasking = "threshold"`` (a block ends when it has no mask left) nor by ``"ar"``.
        block_length: length of a semi-autoregressive block; blocks are decoded left to right, each
            over ``steps // num_blocks`` steps (LLaDA: 128 = one block; its instruct evaluations 32).
        remasking: ``"low_confidence"`` (commit the most confident predictions, LLaDA Sec. 2.4 /
            generate.py), ``"random"`` (commit random masked positions, LLaDA's baseline) or
            ``"threshold"`` (commit every prediction whose confidence is at least ``threshold``,
            at least one per step: Fast-dLLM's confidence-aware parallel decoding, arXiv:2505.22618,
            llada/generate.py ``get_transfer_index``).
            ``"factor"`` (Fast-dLLM's factor-based parallel decoding, llada/generate.py
            ``get_transfer_index_dynamic``: with the masked confidences sorted ``c_(1) >= c_(2) >= ...``,
            commit the ``n`` most confident for the largest ``n`` with ``c_(k) >= 1 - factor / (k + 1)``
            for every ``k <= n``, at least one).
        threshold: the confidence ``remasking = "threshold"`` commits at, in ``(0, 1]`` (Fast-dLLM: 0.9).
        factor: the ``f`` of ``remasking = "factor"``, > 0 (Fast-dLLM's examples: 1.0).
        cache: the block KV cache: ``"none"`` (every step runs the whole canvas), ``"prefix"`` (keys
            and values of the prompt and the finished blocks are computed at a block's first step and
            reused by its later steps, which run the current block and the suffix) or ``"dual"`` (the
            masked suffix's keys and values cached too; later steps run the current block only).
            Fast-dLLM (arXiv:2505.22618 Sec. 3.2). Exact on causal and block-causal models (block
            boundaries on the model's blocks); an approximation on bidirectional ones.
        cache_refresh: denoising steps between recomputations of the cache inside a block; ``None``
            recomputes at each block's first step only (Fast-dLLM's); ``1`` at every step (the
            no-cache tokens exactly).
        compile: run the model's block forwards through ``torch.compile(mode="reduce-overhead")``
            (CUDA graphs; shapes are static within a block); ``False`` by default.
        cuda_graph: run the model's forward as a replayed ``torch.cuda.CUDAGraph`` per shape
            (``backends/generate/cuda_graphs.py``; every cache): the same kernels as eager, without
            the eager forward's host time per step. On by default; a no-op, with the reason in the
            output's ``cuda_graph_fallback``, on the CPU, at TP > 1, with ``compile = true`` and
            for a model that is not a megatron-core ``GPTModel``.
        temperature: 0 is greedy (argmax); above 0 samples ``softmax(logits / temperature)`` by
            Gumbel-max with float64 noise (LLaDA ``add_gumbel_noise``).
        top_k: keep the ``top_k`` largest logits before sampling; ``None``: all.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (nucleus,
            Holtzman et al. 2020); ``None`` or 1.0: all.
        cfg_scale: classifier-free guidance ``w`` (LLaDA's unsupervised CFG, arXiv:2502.09992
            App. B.3): ``logits = u + (w + 1) (c - u)`` with ``u`` the logits with the prompt masked;
            0 is no guidance (and no second forward pass).
        mask_token_id: the model's mask token (required for ``kind = "mdm"``; LLaDA: 126336).
        eos_token_id: end of sequence; the output ends at the first EOS and later blocks of a row
            whose block came out all EOS are skipped. ``None``: no EOS handling.
        pad_token_id: the id written at left-padding positions (masked out of attention, so its
            value reaches no real position; ``None``: ``eos_token_id``, else 0).
        seed: seed of the generator the sampler draws from (Gumbel noise, random remasking).

    Raises:
        GenerateConfigError: (a ``ValueError``) on a setting that cannot work, naming the field,
            the value and a value that works.
    """

    kind: str = "mdm"
    gen_length: int = 128
    steps: int = 128
    block_length: int = 128
    remasking: str = "low_confidence"
    threshold: float = 0.9
    factor: float = 1.0
    cache: str = "none"
    cache_refresh: Optional[int] = None
    compile: bool = False
    cuda_graph: bool = True
    temperature: float = 0.0
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    cfg_scale: float = 0.0
    mask_token_id: Optional[int] = None
    eos_token_id: Optional[int] = None
    pad_token_id: Optional[int] = None
    seed: int = 0

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def num_blocks(self) -> int:
        """``gen_length // block_length``."""
        return self.gen_length // self.block_length

    @property
    def steps_per_block(self) -> int:
        """``steps // num_blocks`` (LLaDA generate.py)."""
        return self.steps // self.num_blocks

    @property
    def pad_id(self) -> int:
        """The id written at padding positions: ``pad_token_id``, else ``eos_token_id``, else 0."""
        if self.pad_token_id is not None:
            return self.pad_token_id
        return self.eos_token_id if self.eos_token_id is not None else 0

    def to_dict(self) -> Dict[str, Any]:
        """Every field by name (plain Python values), recorded with each output."""
        return dataclasses.asdict(self)


#: The fields that follow ``gen_length`` when they are not given (LLaDA's defaults are one length:
#: one block over all generated tokens, one token committed a step).
FOLLOW_GEN_LENGTH = ("steps", "block_length")


def follow_gen_length(values: Any) -> Any:
    """``values`` (a ``[generate]`` table or the settings given) with ``steps`` and ``block_length``
    set to ``gen_length`` where ``gen_length`` is given and they are not; anything else unchanged.

    Source: LLaDA generate.py's defaults (``steps = gen_length = block_length = 128``). Used by
    ``GenerateSpec`` (before validation, also by the fast loader), by ``dlmspec generate`` (on the
    settings' origins) and by the lm-eval model (``max_gen_toks`` as ``gen_length``).
    """
    if not isinstance(values, dict) or "gen_length" not in values:
        return values
    out = dict(values)
    for field in FOLLOW_GEN_LENGTH:
        out.setdefault(field, values["gen_length"])
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _validate(c: GenerateConfig) -> None:
    if c.kind not in objectives.kinds():
        raise GenerateConfigError("kind", c.kind, "not a decoding rule",
                                  f'one of {", ".join(map(repr, objectives.kinds()))}')
    for name in ("gen_length", "steps", "block_length"):
        value = getattr(c, name)
        if not _is_int(value) or value < 1:
            raise GenerateConfigError(name, value, "must be a whole number >= 1", f"{name} = 128 (LLaDA's)")
    if c.remasking not in REMASKING:
        raise GenerateConfigError(
            "remasking", c.remasking, "not a remasking rule", f'one of {", ".join(map(repr, REMASKING))}'
        )
    if not _is_number(c.threshold) or not 0.0 < c.threshold <= 1.0:
        raise GenerateConfigError("threshold", c.threshold, "a confidence is in (0, 1]", "threshold = 0.9 (Fast-dLLM's)")
    if not _is_number(c.factor) or c.factor <= 0.0:
        raise GenerateConfigError("factor", c.factor, "the factor rule's f must be a number > 0", "factor = 1.0 (Fast-dLLM's)")
    if c.cache not in CACHES:
        raise GenerateConfigError("cache", c.cache, "not a block KV cache", f'one of {", ".join(map(repr, CACHES))}')
    if c.cache_refresh is not None and (not _is_int(c.cache_refresh) or c.cache_refresh < 1):
        raise GenerateConfigError("cache_refresh", c.cache_refresh, "must be a whole number >= 1 or None",
                                  "cache_refresh = None (recompute at each block's first step, Fast-dLLM's)")
    if not isinstance(c.compile, bool):
        raise GenerateConfigError("compile", c.compile, "must be true or false", "compile = false")
    if not isinstance(c.cuda_graph, bool):
        raise GenerateConfigError("cuda_graph", c.cuda_graph, "must be true or false", "cuda_graph = true")
    if not _is_number(c.temperature) or c.temperature < 0.0:
        raise GenerateConfigError("temperature", c.temperature, "must be >= 0", "temperature = 0.0 (greedy) or 1.0")
    if c.top_k is not None and (not _is_int(c.top_k) or c.top_k < 1):
        raise GenerateConfigError("top_k", c.top_k, "must be a whole number >= 1 or None", "top_k = None (all tokens) or 50")
    if c.top_p is not None and (not _is_number(c.top_p) or not 0.0 < c.top_p <= 1.0):
        raise GenerateConfigError("top_p", c.top_p, "must be in (0, 1] or None", "top_p = None (all tokens) or 0.95")
    if not _is_number(c.cfg_scale) or c.cfg_scale < 0.0:
        raise GenerateConfigError("cfg_scale", c.cfg_scale, "must be >= 0", "cfg_scale = 0.0 (no guidance)")
    for name in ("mask_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(c, name)
        if value is not None and (not _is_int(value) or not 0 <= value < MAX_ID):
            raise GenerateConfigError(name, value, f"a token id is a whole number in 0..{MAX_ID - 1}",
                                      f"{name} = None or the tokenizer's id")
    if not _is_int(c.seed) or not 0 <= c.seed < MAX_SEED:
        raise GenerateConfigError("seed", c.seed, f"must be a whole number in 0..{MAX_SEED - 1}", "seed = 0")
    if not objectives.get(c.kind).diffusion:  # c.kind is registered (checked above)
        if c.cfg_scale != 0.0:
            raise GenerateConfigError("cfg_scale", c.cfg_scale, "guidance is built for kind = 'mdm' only", "cfg_scale = 0.0")
        return
    if c.mask_token_id is None:
        raise GenerateConfigError(
            "mask_token_id", None, "masked-diffusion sampling writes the model's mask token",
            "the id of [objective] mask_token_id (LLaDA: 126336)",
        )
    if c.eos_token_id is not None and c.eos_token_id == c.mask_token_id:
        raise GenerateConfigError(
            "eos_token_id", c.eos_token_id, "equals mask_token_id, so a committed EOS reads as a mask",
            "the tokenizer's EOS id",
        )
    if c.gen_length % c.block_length:
        fits = [d for d in _divisors(c.gen_length) if d <= c.block_length] or [c.gen_length]
        raise GenerateConfigError(
            "block_length", c.block_length, f"must divide gen_length = {c.gen_length} (LLaDA generate.py)",
            f"block_length = {fits[-1]}",
        )
    if c.remasking not in PARALLEL_REMASKING:
        if c.steps > c.gen_length:
            raise GenerateConfigError(
                "steps", c.steps, f"more steps than tokens (gen_length = {c.gen_length}) leaves steps that commit nothing",
                f"steps = {c.gen_length}",
            )
        if c.steps % c.num_blocks:
            fit = max(c.num_blocks, (c.steps // c.num_blocks) * c.num_blocks)
            raise GenerateConfigError(
                "steps", c.steps,
                f"must be a multiple of the number of blocks gen_length / block_length = {c.num_blocks} (LLaDA generate.py)",
                f"steps = {fit}",
            )
