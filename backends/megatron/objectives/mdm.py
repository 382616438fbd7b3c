"""Masked diffusion (``objective.kind = "mdm"``), runtime half: LLaDA / MDM's estimator, its
weightings (``"llada"``: the schedule's ELBO weight, ``"realised"``, Dream's ``"cart"``), variable
length, Dream's shift, MegaDLMs' unshift window, and the masking schedules of
:mod:`dlmspec.objectives.schedules`. Compiler half: :mod:`dlmspec.objectives.mdm`. Sources:
docs/runtime.md, "Objectives"; docs/recipes.md.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor

from dlmspec.objectives.attention_anneal import anneal_ratio
from dlmspec.objectives.mdm import CART_P_DEFAULT
from dlmspec.objectives.schedules import POLYNOMIAL_EXPONENT_DEFAULT, masking_schedule

from .. import masks as mask_objects
from .base import ObjectiveBatch, ObjectiveRng, RuntimeObjective, check_tokens, register_runtime, valid_from_loss_mask

LOSS_WEIGHTINGS = ("llada", "realised", "cart")
#: ``objective.variable_length``: what a cut applies to (docs/recipes.md, "Variable length").
VARIABLE_LENGTHS = ("sequence", "micro_batch")


class MaskedDiffusionObjective(RuntimeObjective):
    """LLaDA / MDM masked-diffusion objective (see the module docstring).

    Args:
        mask_token_id: Token id written at masked positions; must be a valid
            input id of the model's embedding (``0 <= id < padded vocab``).
        eps: Lower bound of the noise level, ``t = eps + (1 - eps) * u``;
            ``0 <= eps < 1`` (LLaDA uses 1e-3).  Bounds the weight ``1/t`` by
            ``1/eps``.
        loss_weighting: ``"llada"`` (weight ``1/t``, LLaDA Eq. 3), ``"realised"`` (weight
            ``1/r`` with ``r`` the realised mask ratio of the sequence) or ``"cart"`` (Dream's
            context-adaptive weight, :func:`cart_weights`, no ``1/t``).
        variable_length_prob: Probability that a sequence (``variable_length =
            "sequence"``) or a whole micro-batch (``"micro_batch"``) is truncated to a
            length drawn uniformly from ``{1, ..., s}`` (LLaDA: 0.01).
        min_masked_tokens: A row with fewer masked positions (within its valid ones) gets the
            missing ones at uniformly drawn unmasked positions, drawn after every other draw
            (0: nothing drawn, the stream as before). MegaDLMs: 1
            (JinjieNi/MegaDLMs ``gpt_model.py:315-318``). With it, ``eps = 0`` and
            ``"realised"`` weighting, a row's weight is at most its length.
        variable_length: ``"sequence"`` (each sequence cut alone, the tail hidden by a
            key-padding mask) or ``"micro_batch"`` (:meth:`cut_length`: one cut for every
            row, from a rank-independent generator; dense).
        shift: Dream's shifted predictions (docs/recipes.md, "Shifted predictions"): the labels
            handed to ``GPTModel`` are the clean ids shifted left (``labels[:, i] = x0[:, i + 1]``)
            and the weights with them, so the logits of output position ``i - 1`` predict the
            token at ``i``, as in the AR model the weights come from (DreamLM/Dream@fac0a7f
            ``eval/eval.py:352-354``; DreamLM/Dream-Coder@87409da
            ``instruct/src/trainer/fsdp_sft_trainer.py:777-786``). Position 0 has no logit before it
            and is never masked (Dream: "bos always unmask", ``eval/eval.py:353``); the last output
            position has no target and weighs 0. The input stays the noised sequence, attention
            bidirectional.
        cart_p: ``"cart"``'s geometric parameter ``p``, ``0 < p < 1`` (at 1 Dream's formula is
            ``0 * log 0``); default :data:`CART_P_DEFAULT`.
        unshift: MegaDLMs' 2,049-token window (docs/recipes.md, "The sample window"): the dataset
            draws ``s + 1`` ids (:func:`dataset_extra_token`, megatron-core's
            ``add_extra_token_to_sequence``) and :meth:`prepare` drops the first of the ``s``
            tokens it is given (the forward step the first position id): the model sees and
            predicts ids ``1 .. s - 1`` at positions ``1 .. s - 1`` (JinjieNi/MegaDLMs@bdf7545
            ``megatron/core/models/difflm/gpt_model.py:427-431``), after the micro-batch cut
            (MegaDLMs' order, ``:418-431``), in training and evaluation alike.

        noise_schedule: the masking schedule ``alpha(t)`` (:mod:`dlmspec.objectives.schedules`:
            ``"linear"``, ``"cosine"``, ``"polynomial"``): a token is masked with probability
            ``1 - alpha(t)`` and ``"llada"`` weighs it by ``-alpha'(t) / (1 - alpha(t))`` (MDLM eq. 10;
            linear: ``t`` and ``1/t``, computed as before).
        noise_schedule_exponent: ``"polynomial"``'s exponent ``a`` (``alpha = 1 - t^a``).
        length_multiple: :meth:`cut_length`'s ``multiple`` (the layout's; default 1).
        attention_anneal_iters: DiffuLLaMA's attention annealing over the first ``K`` steps
            (``objective.attention_anneal_iters``; :mod:`dlmspec.objectives.attention_anneal`):
            at step ``k`` (:meth:`set_iteration`) a micro-batch's attention is the causal mask OR
            keys opened with probability ``min(1, (k + 1) / K)``
            (:func:`~dlmspec.backends.megatron.masks.annealed_causal`), its ``[s, s]`` uniforms
            drawn last from the masking generator (the other draws are as without it). 0 or 1:
            none (full attention from the first step).

    Raises:
        ValueError: On an out-of-range argument.
    """

    attention = "bidirectional"
    kind = "mdm"
    diffusion = True

    def __init__(
        self,
        mask_token_id: int,
        *,
        eps: float = 1e-3,
        loss_weighting: str = "llada",
        variable_length_prob: float = 0.0,
        min_masked_tokens: int = 0,
        variable_length: str = "sequence",
        shift: bool = False,
        cart_p: float = CART_P_DEFAULT,
        unshift: bool = False,
        noise_schedule: str = "linear",
        noise_schedule_exponent: float = POLYNOMIAL_EXPONENT_DEFAULT,
        length_multiple: int = 1,
        attention_anneal_iters: int = 0,
    ) -> None:
        if int(mask_token_id) < 0:
            raise ValueError(f"mask_token_id must be >= 0, got {mask_token_id}")
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {eps}")
        if loss_weighting not in LOSS_WEIGHTINGS:
            raise ValueError(f"loss_weighting must be one of {LOSS_WEIGHTINGS}, got {loss_weighting!r}")
        if not 0.0 <= variable_length_prob <= 1.0:
            raise ValueError(f"variable_length_prob must be in [0, 1], got {variable_length_prob}")
        self.mask_token_id = int(mask_token_id)
        self.eps = float(eps)
        self.loss_weighting = loss_weighting
        if isinstance(min_masked_tokens, bool) or int(min_masked_tokens) < 0:
            raise ValueError(f"min_masked_tokens must be an int >= 0, got {min_masked_tokens!r}")
        if variable_length not in VARIABLE_LENGTHS:
            raise ValueError(f"variable_length must be one of {VARIABLE_LENGTHS}, got {variable_length!r}")
        self.variable_length_prob = float(variable_length_prob)
        self.min_masked_tokens = int(min_masked_tokens)
        self.variable_length = variable_length
        if not 0.0 < float(cart_p) < 1.0:  # also refuses nan
            raise ValueError(f"cart_p must be in (0, 1), got {cart_p!r}")
        self.shift = bool(shift)
        self.cart_p = float(cart_p)
        self.unshift = bool(unshift)
        self.schedule = masking_schedule(noise_schedule, noise_schedule_exponent)
        self.length_multiple = max(1, int(length_multiple))
        self.draws_cut = self.variable_length == "micro_batch" and self.variable_length_prob > 0.0
        if isinstance(attention_anneal_iters, bool) or int(attention_anneal_iters) < 0:
            raise ValueError(f"attention_anneal_iters must be an int >= 0, got {attention_anneal_iters!r}")
        self.attention_anneal_iters = int(attention_anneal_iters)
        self.attention_anneal_ratio = anneal_ratio(0, self.attention_anneal_iters)

    def set_iteration(self, iteration: int) -> None:
        """The training step about to run (the stage's ``before_step``): with attention annealing,
        the step's ratio ``min(1, (k + 1) / K)`` (:func:`dlmspec.objectives.attention_anneal.anneal_ratio`)."""
        self.attention_anneal_ratio = anneal_ratio(int(iteration), self.attention_anneal_iters)

    def dataset_extra_token(self) -> bool:
        return self.unshift  # MegaDLMs' window: seq_length + 1 ids

    def cut_length(self, s: int, generator: torch.Generator, *, multiple: int = 1) -> Optional[int]:
        """The micro-batch cut (``variable_length = "micro_batch"``): ``None`` (no cut) or the
        length every row of the micro-batch is sliced to.

        Two draws from ``generator`` (build it with
        :func:`~dlmspec.backends.megatron.rng.variable_length_generator`, a CPU generator seeded
        from seed, iteration and micro-batch index only, so every rank draws the same): a coin
        ``u ~ U(0, 1)`` and ``L ~ U{1 .. s}``; a cut when ``u < variable_length_prob``
        (MegaDLMs ``gpt_model.py:269-297``, there ``U{2 .. s}`` before its unshift). ``L`` is
        rounded down to a multiple of ``multiple`` (what the layout splits a sequence by: ``2 *
        cp``, TP under sequence parallelism), never below it; a cut to ``s`` is no cut.

        Args:
            s: The micro-batch's sequence length.
            generator: A CPU ``torch.Generator``.
            multiple: >= 1.

        With ``unshift`` the range is MegaDLMs' ``U{2 .. s}`` (the unshift then leaves ``L - 1``
        positions; the multiple applies to ``L``).

        Returns:
            ``None`` or an int in ``[min(multiple, s), s)``.
        """
        coin = float(torch.rand(1, generator=generator)[0])
        # unshift: MegaDLMs' U{2 .. s} of the s tokens, one of which the unshift then drops
        length = int(torch.randint(2 if self.unshift else 1, s + 1, (1,), generator=generator)[0])
        if self.variable_length_prob <= 0.0 or coin >= self.variable_length_prob:
            return None
        multiple = max(1, int(multiple))
        length = max(multiple, length // multiple * multiple)
        return length if length < s else None

    def prepare_batch(self, batch: Mapping[str, Optional[Tensor]], rng: ObjectiveRng, *,
                      length_multiple: Optional[int] = None) -> ObjectiveBatch:
        """Noise a batch of clean sequences.

        With ``variable_length = "micro_batch"`` and a ``cut_generator`` the batch is first
        sliced to :meth:`cut_length` (every row alike; no ``cut_generator``, as in evaluation:
        no cut). Then the draws are made in a fixed order with ``generator`` (``u`` [b], then
        the per-token uniforms [b, s], then - only if ``variable_length = "sequence"`` and
        ``variable_length_prob > 0`` - the truncation coin [b] and lengths [b], then - only if
        ``min_masked_tokens > 0`` - the forced positions' uniforms [b, s]), so the same
        generator state always yields the same batch.

        Args:
            batch: ``"tokens"``: ``[b, s]`` integer clean token ids ``x0``; ``"loss_mask"``
                (optional ``[b, s]``): positions with ``loss_mask == 0`` (padding) are never
                masked, get weight 0 and are not counted; ``"labels"``: ignored (MDM predicts the
                input positions themselves; the shifted labels of megatron's ``GPTDataset`` are
                for AR); ``"position_ids"`` (optional ``[b, s]``): cut and unshifted as the tokens.
            rng: ``masking``: generator on ``tokens.device`` (see
                :func:`dlmspec.backends.megatron.rng.masking_generator`); ``cut``: the micro-batch
                cut's generator (``"micro_batch"`` only; ``None``: no cut, as in evaluation).
            length_multiple: :meth:`cut_length`'s ``multiple`` for this call (default: the
                objective's ``length_multiple``).

        Returns:
            An :class:`ObjectiveBatch` with ``labels = tokens`` (``shift``: ``tokens`` shifted left
            by one, the last column a copy of the last id with weight 0); ``masked`` and
            ``token_mask`` are in input positions, ``loss_weights`` in output positions;
            ``attention_mask`` the ``[b, 1, 1, s]`` key padding of cut rows, or (annealing) a mask
            object: the annealed causal mask, AND the key padding where a row was cut.

        Raises:
            ValueError: If ``tokens`` is not ``[b, s]`` integer or ``loss_mask``
                has another shape.
        """
        tokens, loss_mask, position_ids = batch["tokens"], batch.get("loss_mask"), batch.get("position_ids")
        generator, cut_generator = rng.masking, rng.cut
        if length_multiple is None:
            length_multiple = self.length_multiple
        check_tokens(tokens)
        if self.variable_length == "micro_batch" and cut_generator is not None:
            cut = self.cut_length(tokens.shape[1], cut_generator, multiple=length_multiple)
            if cut is not None:
                tokens = tokens[:, :cut]
                loss_mask = loss_mask[:, :cut] if loss_mask is not None else None
                position_ids = position_ids[:, :cut] if position_ids is not None else None
        if self.unshift:
            tokens = unshift_window(tokens)
            loss_mask = unshift_window(loss_mask) if loss_mask is not None else None
            position_ids = unshift_window(position_ids) if position_ids is not None else None
        b, s = tokens.shape
        device = tokens.device
        valid = valid_from_loss_mask(tokens, loss_mask)

        u = torch.rand(b, generator=generator, device=device, dtype=torch.float32)
        t = self.eps + (1.0 - self.eps) * u
        # linear: p(mask) = t exactly (1 - (1 - t) would round differently)
        # another schedule: 1 - alpha(t) evaluated in float64 on the [b] noise levels, then float32
        p_mask = t if self.schedule.is_linear else (
            self.schedule.mask_probability(t.double(), torch).clamp(0.0, 1.0).to(torch.float32))
        draws = torch.rand(b, s, generator=generator, device=device, dtype=torch.float32)

        attention_mask = None
        lengths = torch.full((b,), s, dtype=torch.int64, device=device)
        if self.variable_length == "sequence" and self.variable_length_prob > 0.0:
            coin = torch.rand(b, generator=generator, device=device, dtype=torch.float32)
            random_lengths = torch.randint(
                1, s + 1, (b,), generator=generator, device=device, dtype=torch.int64
            )
            truncate = coin < self.variable_length_prob
            lengths = torch.where(truncate, random_lengths, lengths)
            positions = torch.arange(s, device=device)
            beyond = positions.unsqueeze(0) >= lengths.unsqueeze(1)  # [b, s]
            valid = valid & ~beyond
            if bool(truncate.any()):
                attention_mask = beyond.view(b, 1, 1, s)

        # shift: position 0 has no logit before it, so it is never masked (Dream's "bos always unmask")
        maskable = valid
        if self.shift:
            maskable = valid & (torch.arange(s, device=device) > 0).unsqueeze(0)
        masked = (draws < p_mask.unsqueeze(1)) & maskable
        if self.min_masked_tokens > 0:
            masked = self._force_masks(masked, maskable, generator)
        input_ids = torch.where(masked, torch.full_like(tokens, self.mask_token_id), tokens)

        masked_f = masked.to(torch.float32)
        if self.loss_weighting == "llada":
            # where(): an unmasked position weighs 0 even at t = 0 (eps = 0), never 0 / 0
            if self.schedule.is_linear:
                loss_weights = torch.where(masked, 1.0 / t.unsqueeze(1), torch.zeros_like(masked_f))
            else:  # the ELBO weight -alpha'(t) / (1 - alpha(t)) (MDLM eq. 10)
                weight = self.schedule.weight(t.double(), torch).to(torch.float32)
                loss_weights = torch.where(masked, weight.unsqueeze(1), torch.zeros_like(masked_f))
        elif self.loss_weighting == "cart":
            # the clean context is every position of the row's length that is not [MASK] (Dream counts
            # prompt tokens too); a per-sequence cut's hidden tail is no context
            present = torch.arange(s, device=device).unsqueeze(0) < lengths.unsqueeze(1)
            loss_weights = cart_weights(masked, present, self.cart_p)
        else:
            n_masked = masked_f.sum(dim=1)
            n_valid = maskable.to(torch.float32).sum(dim=1)
            ratio = n_masked / n_valid.clamp(min=1.0)
            # A sequence with nothing masked has all-zero weights (0 / clamp).
            loss_weights = masked_f / ratio.clamp(min=1e-12).unsqueeze(1)

        if self.attention_anneal_ratio < 1.0:
            # drawn after every other draw: the batch is the one without annealing, plus its mask
            anneal = mask_objects.annealed_causal(s, self.attention_anneal_ratio, generator, device)
            attention_mask = mask_objects.combine(mask_objects.from_megatron(attention_mask), anneal)

        labels_out = tokens.to(torch.int64)
        if self.shift:
            # output position i predicts x0[i + 1]; the last one predicts nothing (weight 0, any valid id)
            labels_out = torch.cat([labels_out[:, 1:], labels_out[:, -1:]], dim=1)
            loss_weights = torch.cat([loss_weights[:, 1:], torch.zeros_like(loss_weights[:, :1])], dim=1)

        return ObjectiveBatch(
            input_ids=input_ids,
            labels=labels_out,
            loss_weights=loss_weights,
            num_tokens=valid.sum().to(torch.int),
            token_mask=valid,
            attention_mask=attention_mask,
            mask_ratio=t,
            masked=masked,
            lengths=lengths,
            shifted=self.shift,
            position_ids=position_ids,
            source_ids=tokens,
        )

    def _force_masks(self, masked: Tensor, valid: Tensor, generator: torch.Generator) -> Tensor:
        """``masked`` with at least ``min(min_masked_tokens, valid positions)`` masked positions per
        row: a row short of them gets the missing ones at the unmasked valid positions of smallest
        fresh uniform score (a uniformly drawn subset; for one missing, one uniform position as
        MegaDLMs' ``torch.randint(0, l)``)."""
        b, s = masked.shape
        scores = torch.rand(b, s, generator=generator, device=masked.device, dtype=torch.float32)
        need = (self.min_masked_tokens - masked.sum(dim=1)).clamp(min=0)  # [b]
        free = valid & ~masked
        scores = torch.where(free, scores, torch.full_like(scores, 2.0))  # taken or invalid: last
        rank = scores.argsort(dim=1).argsort(dim=1)  # rank of each position's score in its row
        return masked | (free & (rank < need.unsqueeze(1)))


def unshift_window(x: Tensor) -> Tensor:
    """MegaDLMs' unshift of a ``[b, s]`` batch tensor (tokens, position ids, a loss mask): ``x[:, 1:]``,
    ``[b, s - 1]`` (``gpt_model.py:427-431``: ``input_ids[:, 1:]``, ``position_ids[:, 1:]``; its
    ``labels[:, :-1]`` are the same ids as ``tokens[:, 1:]``, ``text[1 : s]``).

    Raises:
        ValueError: ``x`` is not ``[b, s]`` with ``s >= 2``.
    """
    if x.dim() != 2 or x.shape[1] < 2:
        raise ValueError(f"unshift needs [batch, seq >= 2], got shape {tuple(x.shape)}")
    return x[:, 1:]


_CART_MATRICES: Dict[Tuple[int, float, str], Tensor] = {}


def _cart_matrix(s: int, p: float, device: torch.device) -> Tensor:
    """``G[i, n] = 1/2 * p * (1 - p)^(|n - i| - 1)`` for ``i != n``, 0 on the diagonal: ``[s, s]``
    float32 (``4 s^2`` bytes: 16 MiB at s = 2048), computed as Dream-Coder does
    (``exp(log p + (|k| - 1) log(1 - p)) * 0.5``, ``fsdp_sft_trainer.py:99-105``) and kept per
    (s, p, device)."""
    key = (int(s), float(p), str(device))
    matrix = _CART_MATRICES.get(key)
    if matrix is None:
        idx = torch.arange(s, device=device)
        k = (idx.unsqueeze(1) - idx.unsqueeze(0)).abs()
        matrix = (math.log(p) + (k - 1).clamp(min=0).to(torch.float32) * math.log(1.0 - p)).exp() * 0.5
        matrix = matrix.masked_fill(k == 0, 0.0)
        if len(_CART_MATRICES) > 8:
            _CART_MATRICES.clear()
        _CART_MATRICES[key] = matrix
    return matrix


def cart_weights(masked: Tensor, present: Tensor, p: float) -> Tensor:
    """Dream's CART weight ("context-adaptive token-level noise rescheduling", arXiv:2508.15487) of
    each masked position.

    ``w[j, n] = 1/2 * sum_{i != n} c[j, i] * p * (1 - p)^(|n - i| - 1)`` for a masked ``n``, 0
    elsewhere, with ``c[j, i] = present[j, i] and not masked[j, i]`` (the clean tokens of the row;
    ``Geo(p, k) = p (1 - p)^k`` is the geometric pmf, so near clean tokens count most). It replaces
    the ``1/t`` factor: the loss is ``sum_n w_n CE_n``. Source, the Dream team's trainer:
    DreamLM/Dream-Coder@87409da7db991fd24c9299f5ec4ed358b94e4631
    ``instruct/src/trainer/fsdp_sft_trainer.py:93-112`` (``context_adaptive_reweight``, the matrix)
    and ``:802-818`` (``non_mask.matmul(matrix).masked_fill(non_mask, 0)``, used instead of ``1/t``
    at ``:824``; Dream-Coder's SFT run selects it, ``instruct/examples/training/run_sft.sh:3,8``).
    DreamLM/DreamOn@8a0a549's config carries the same ``cart_p: 0.1``
    (``src/trainer/config/sft_trainer.yaml:63``) but its trainer does not read it.
    One ``[b, s] x [s, s]`` float32 product (``2 b s^2`` FLOPs: under 0.01% of a 7B model's step).

    Args:
        masked: ``[b, s]`` bool, the masked positions.
        present: ``[b, s]`` bool, the positions that are part of the row (not beyond a cut).
        p: The geometric parameter, ``0 < p < 1``.

    Returns:
        ``[b, s]`` float32 weights.

    Raises:
        ValueError: ``p`` outside ``(0, 1)`` or the shapes differ.
    """
    if not 0.0 < float(p) < 1.0:
        raise ValueError(f"cart_p must be in (0, 1), got {p!r}")
    if masked.shape != present.shape or masked.dim() != 2:
        raise ValueError(f"masked {tuple(masked.shape)} and present {tuple(present.shape)} must be the same [b, s]")
    clean = (present & ~masked).to(torch.float32)
    weights = clean @ _cart_matrix(masked.shape[1], float(p), masked.device)
    return torch.where(masked, weights, torch.zeros_like(weights))


def _from_config(config: Any, *, length_multiple: int = 1) -> MaskedDiffusionObjective:
    """The objective of an ``ObjectiveConfig`` (``mask_token_id`` required).

    Raises:
        ValueError: no ``mask_token_id`` or a setting out of range.
    """
    if getattr(config, "mask_token_id", None) is None:
        raise ValueError("the mdm objective needs mask_token_id")
    return MaskedDiffusionObjective(
        config.mask_token_id, eps=config.eps, loss_weighting=config.loss_weighting,
        variable_length_prob=config.variable_length_prob, min_masked_tokens=config.min_masked_tokens,
        variable_length=config.variable_length, shift=config.shift, cart_p=config.cart_p,
        unshift=config.unshift, noise_schedule=getattr(config, "noise_schedule", "linear"),
        noise_schedule_exponent=getattr(config, "noise_schedule_exponent", POLYNOMIAL_EXPONENT_DEFAULT),
        length_multiple=length_multiple,
        attention_anneal_iters=int((getattr(config, "options", None) or {}).get("attention_anneal_iters", 0)))


register_runtime("mdm", _from_config)
