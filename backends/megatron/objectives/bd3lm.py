"""Block diffusion (``objective.kind = "bd3lm"``), runtime half: BD3-LM's training input and loss
(Arriola et al., ICLR 2025, arXiv:2503.09573; kuleshov-group/bd3lms ``diffusion.py``:
``_sample_t``, ``q_xt``, ``_forward_pass_diffusion``). Compiler half:
:mod:`dlmspec.objectives.bd3lm`; docs/block-diffusion.md.

For clean ids ``x0 [b, L]`` and ``n = L / B`` blocks of ``B = block_size``:

* per block ``t[r, j] = low + (high - low) * u[r, j]``, ``u ~ U(0, 1)`` i.i.d. over rows and blocks
  (bd3lms ``_sample_t``; ``(low, high)`` is ``(eps, 1)`` or the clipped range);
* ``x_t[r, i] = [MASK]`` with probability ``1 - alpha(t[r, i // B])`` (``q_xt``), never at a
  position whose ``loss_mask`` is 0 (SFT prompts, padding: they stay clean and weigh 0);
* the model input is ``x_t (+) x0`` (``[b, 2L]``), its position ids the batch's repeated for the two
  halves, its attention :func:`~dlmspec.backends.megatron.masks.block_diffusion`;
* labels ``x0`` on the ``x_t`` half with weight ``-alpha'(t) / (1 - alpha(t))`` (linear ``1/t``) at
  masked positions, 0 elsewhere; on the ``x0`` half ``x0`` shifted left (next token) with weight
  ``ar_loss_weight`` (the last position, and positions whose next token has ``loss_mask`` 0, weigh 0);
* ``num_tokens`` = the counted data positions of the ``x_t`` half (``L`` per row without a loss
  mask): the reduced loss is the NELBO per token (bd3lms ``_loss``: ``nlls.sum() /
  attention_mask.sum()``) plus ``ar_loss_weight`` times the AR loss per token.

``block_size = L`` with one block per row is MDM's estimator over the same draws (one ``t`` per
sequence, the clean half then unseen by ``x_t``).

Without an AR loss the clean half's outputs carry no loss, so after :meth:`prepare_model` (no
sequence parallelism) the model's decoder hands only the ``x_t`` half to the output layer
(:func:`noised_half_output`): its logits and cross entropy (or the fused projection's hidden
states) are computed for ``L`` rows, not ``2 L``, and the batch's labels, weights and masks are
``[b, L]``. The loss and every gradient are the same as over ``2 L`` rows with the clean half
weighted 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

import torch
from torch import Tensor

from dlmspec.objectives.bd3lm import block_at
from dlmspec.objectives.schedules import POLYNOMIAL_EXPONENT_DEFAULT, masking_schedule

from .. import masks as mask_objects
from .base import ObjectiveBatch, ObjectiveRng, RuntimeObjective, check_tokens, register_runtime, valid_from_loss_mask


@dataclass(frozen=True, eq=False)
class NoisedHalfMask(mask_objects.MaskFunction):
    """The block-diffusion mask of a training micro-batch whose loss is on the ``x_t`` half only:
    the same mask function (and so the same cached ``BlockMask``), and the sign for
    :func:`noised_half_output` to pass only the first half of the decoder's output on."""


def noised_half_output(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
    """A forward hook (``with_kwargs=True``) of megatron-core's ``TransformerBlock`` (``GPTModel.decoder``):
    called with a :class:`NoisedHalfMask`, its output ``[2L, b, h]`` becomes the first half ``[L, b, h]``
    (the ``x_t`` positions), so ``GPTModel`` projects and scores only those; any other call is left
    as it is (``None``)."""
    if isinstance(kwargs.get("attention_mask"), NoisedHalfMask) and isinstance(output, Tensor) \
            and output.shape[0] % 2 == 0:
        return output[: output.shape[0] // 2]
    return None


class BlockDiffusionObjective(RuntimeObjective):
    """BD3-LM's objective (see the module docstring).

    Args:
        mask_token_id: id written at masked positions (``0 <= id < padded vocab``).
        block_size: ``B``; every sequence length the objective is given must be a multiple of it.
        noise_range: ``(low, high)`` of the per-block noise level, ``0 <= low < high <= 1``
            (``(eps, 1)``; the clipped schedule ``(beta, omega)``, paper sec. 5.2).
        ar_loss_weight: weight of the next-token loss on the clean half (``>= 0``); above 0 the clean
            half attends causally within itself.
        noise_schedule, noise_schedule_exponent: ``alpha(t)`` (:mod:`dlmspec.objectives.schedules`).
        block_size_schedule: ``[(step, block_size), ...]`` from step 0 (LLaDA 2.0's warm-up / stable /
            decay of the block): :meth:`set_iteration` sets ``block_size`` to the step's
            (:func:`dlmspec.objectives.bd3lm.block_at`); ``None``: ``block_size`` throughout.

    Raises:
        ValueError: an argument out of range.
    """

    kind = "bd3lm"
    attention = "bidirectional"
    diffusion = True

    def __init__(self, mask_token_id: int, *, block_size: int, noise_range: Sequence[float] = (1e-3, 1.0),
                 ar_loss_weight: float = 0.0, noise_schedule: str = "linear",
                 noise_schedule_exponent: float = POLYNOMIAL_EXPONENT_DEFAULT,
                 block_size_schedule: Optional[Sequence[Sequence[int]]] = None) -> None:
        if int(mask_token_id) < 0:
            raise ValueError(f"mask_token_id must be >= 0, got {mask_token_id}")
        if isinstance(block_size, bool) or int(block_size) < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        low, high = (float(x) for x in noise_range)
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"noise_range must satisfy 0 <= low < high <= 1, got {tuple(noise_range)}")
        if not float(ar_loss_weight) >= 0.0:  # also refuses nan
            raise ValueError(f"ar_loss_weight must be >= 0, got {ar_loss_weight!r}")
        self.mask_token_id = int(mask_token_id)
        self.block_size = int(block_size)
        self.noise_range = (low, high)
        self.ar_loss_weight = float(ar_loss_weight)
        self.schedule = masking_schedule(noise_schedule, noise_schedule_exponent)
        self.noised_half_loss = False  # set by prepare_model where the decoder passes on the x_t half only
        self.block_size_schedule = None
        if block_size_schedule:
            self.block_size_schedule = [(int(s), int(b)) for s, b in block_size_schedule]
            if any(b < 1 for _, b in self.block_size_schedule):
                raise ValueError(f"block_size_schedule sizes must be >= 1, got {block_size_schedule!r}")
            self.set_iteration(0)

    def set_iteration(self, iteration: int) -> None:
        """The training step about to run (the stage's ``before_step``): with a block-size schedule
        the block (and so the mask and the number of noise levels) becomes the step's."""
        if self.block_size_schedule:
            self.block_size = block_at(self.block_size_schedule, int(iteration))

    @property
    def clean_causal(self) -> bool:
        """Whether the clean half attends causally within itself (an AR loss is trained on it)."""
        return self.ar_loss_weight > 0.0

    def mask(self, seq_len: int) -> mask_objects.MaskFunction:
        """The attention mask of an input of ``2 * seq_len`` positions (a :class:`NoisedHalfMask`
        when the loss is on the ``x_t`` half only)."""
        mask = mask_objects.block_diffusion(seq_len, self.block_size, clean_causal=self.clean_causal)
        if self.noised_half_loss:
            return NoisedHalfMask(mask.fn, block_size=mask.block_size, name=mask.name)
        return mask

    def sample_t(self, b: int, num_blocks: int, generator: Optional[torch.Generator], device) -> Tensor:
        """``[b, num_blocks]`` float32 noise levels, ``low + (high - low) * u``, one uniform per block."""
        low, high = self.noise_range
        u = torch.rand(b, num_blocks, generator=generator, device=device, dtype=torch.float32)
        return low + (high - low) * u

    def prepare_batch(self, batch: Mapping[str, Optional[Tensor]], rng: ObjectiveRng, **options: Any) -> ObjectiveBatch:
        """Noise a batch per block and build the ``x_t (+) x_0`` input.

        Draws, in this order, from ``rng.masking``: ``u [b, n]`` (the blocks' noise levels), then
        the per-token uniforms ``[b, L]``.

        Args:
            batch: ``"tokens"`` ``[b, L]`` clean ids (``L`` a multiple of ``block_size``);
                ``"loss_mask"`` (optional ``[b, L]``): 0 = never masked, weight 0, not counted
                (SFT prompts, padding); ``"position_ids"`` (optional ``[b, L]``, default
                ``arange(L)``), repeated for the two halves.

        Returns:
            :class:`ObjectiveBatch` of ``[b, 2L]`` tensors (``input_ids``, ``labels``,
            ``loss_weights``, ``token_mask``, ``masked``, ``position_ids``, ``source_ids``), the
            mask object as ``attention_mask``, ``mask_ratio`` ``[b]`` the row's mean ``t``.

        Raises:
            ValueError: ``tokens`` not ``[b, L]`` integer, ``L`` not a multiple of ``block_size``, or
                a ``loss_mask``/``position_ids`` of another shape.
        """
        tokens, loss_mask, position_ids = batch["tokens"], batch.get("loss_mask"), batch.get("position_ids")
        check_tokens(tokens)
        b, L = tokens.shape
        if L % self.block_size:
            raise ValueError(f"sequence length {L} is not a multiple of block_size {self.block_size}")
        device = tokens.device
        valid = valid_from_loss_mask(tokens, loss_mask)
        n = L // self.block_size
        t_blocks = self.sample_t(b, n, rng.masking, device)  # [b, n]
        t = t_blocks.repeat_interleave(self.block_size, dim=1)  # [b, L]
        if self.schedule.is_linear:
            p_mask = t
            weight = 1.0 / t.clamp(min=torch.finfo(torch.float32).tiny)
        else:
            p_mask = self.schedule.mask_probability(t.double(), torch).clamp(0.0, 1.0).to(torch.float32)
            weight = self.schedule.weight(t.double(), torch).to(torch.float32)
        draws = torch.rand(b, L, generator=rng.masking, device=device, dtype=torch.float32)
        masked = (draws < p_mask) & valid
        x0 = tokens.to(torch.int64)
        xt = torch.where(masked, torch.full_like(x0, self.mask_token_id), x0)

        zeros = torch.zeros(b, L, dtype=torch.float32, device=device)
        dlm_weights = torch.where(masked, weight, zeros)
        ar_labels = torch.cat([x0[:, 1:], x0[:, -1:]], dim=1)
        if self.ar_loss_weight > 0.0:
            has_next = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=1)
            ar_weights = has_next.to(torch.float32) * self.ar_loss_weight
        else:
            ar_weights = zeros
        if position_ids is None:
            position_ids = torch.arange(L, device=device).unsqueeze(0).expand(b, L)
        elif tuple(position_ids.shape) != (b, L):
            raise ValueError(f"position_ids shape {tuple(position_ids.shape)} != tokens shape {(b, L)}")
        false = torch.zeros_like(valid)
        if self.noised_half_loss:  # the model scores the x_t half only: labels and weights of L positions
            return ObjectiveBatch(
                input_ids=torch.cat([xt, x0], dim=1), labels=x0, loss_weights=dlm_weights,
                num_tokens=valid.sum().to(torch.int), token_mask=valid, attention_mask=self.mask(L),
                mask_ratio=t_blocks.mean(dim=1), masked=masked,
                lengths=torch.full((b,), L, dtype=torch.int64, device=device),
                position_ids=torch.cat([position_ids, position_ids], dim=1).to(torch.int64),
                source_ids=torch.cat([x0, x0], dim=1))
        return ObjectiveBatch(
            input_ids=torch.cat([xt, x0], dim=1),
            labels=torch.cat([x0, ar_labels], dim=1),
            loss_weights=torch.cat([dlm_weights, ar_weights], dim=1),
            num_tokens=valid.sum().to(torch.int),
            token_mask=torch.cat([valid, false], dim=1),
            attention_mask=self.mask(L),
            mask_ratio=t_blocks.mean(dim=1),
            masked=torch.cat([masked, false], dim=1),
            lengths=torch.full((b,), L, dtype=torch.int64, device=device),
            position_ids=torch.cat([position_ids, position_ids], dim=1).to(torch.int64),
            source_ids=torch.cat([x0, x0], dim=1),
        )

    def prepare_model(self, model: List[torch.nn.Module]) -> None:
        """Make RoPE follow the position ids of the doubled input (:func:`repeat_rotary_halves`);
        without an AR loss and without sequence parallelism, let the decoder pass only the ``x_t``
        half to the output layer (:func:`noised_half_output`) and the batches carry ``[b, L]``
        labels and weights (:attr:`noised_half_loss`)."""
        halved = []
        for chunk in model:
            repeat_rotary_halves(chunk)
            module = _gpt_model(chunk)
            if getattr(module, "post_process", False):
                halved.append(self.ar_loss_weight == 0.0 and _pass_noised_half(module))
        self.noised_half_loss = bool(halved) and all(halved)


class RepeatedHalvesRotary(torch.nn.Module):
    """megatron-core's ``RotaryEmbedding`` for the ``x_t (+) x_0`` input: asked for ``2 n`` positions,
    it returns the angles of positions ``0 .. n-1`` twice (``[2n, 1, 1, d]``), so both halves carry
    the same positions (bd3lms ``models/dit.py`` applies one rotary of length ``n`` to each half);
    an odd length is passed through unchanged. ``GPTModel`` computes RoPE from the sequence
    length alone (``gpt_model.py _preprocess``: ``self.rotary_pos_emb(rotary_seq_len, ...)``), so the
    position ids cannot carry it.

    Args:
        inner: the model's ``RotaryEmbedding``.
    """

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, max_seq_len: int, *args: Any, **kwargs: Any) -> Tensor:
        if int(max_seq_len) % 2:
            return self.inner(max_seq_len, *args, **kwargs)
        half = self.inner(int(max_seq_len) // 2, *args, **kwargs)
        return torch.cat([half, half], dim=0)

    def get_rotary_seq_len(self, *args: Any, **kwargs: Any) -> int:
        return self.inner.get_rotary_seq_len(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)


def _gpt_model(chunk: torch.nn.Module) -> torch.nn.Module:
    module = chunk
    while hasattr(module, "module") and not hasattr(module, "decoder"):
        module = module.module
    return module


def _pass_noised_half(module: torch.nn.Module) -> bool:
    """Hook :func:`noised_half_output` on ``module.decoder`` once; ``False`` (nothing hooked) under
    sequence parallelism, where each rank's decoder output is a slice of the sequence."""
    decoder = getattr(module, "decoder", None)
    if decoder is None or getattr(getattr(module, "config", None), "sequence_parallel", False):
        return False
    if not getattr(decoder, "_dlmspec_noised_half", False):
        decoder.register_forward_hook(noised_half_output, with_kwargs=True)
        decoder._dlmspec_noised_half = True
    return True


def repeat_rotary_halves(chunk: torch.nn.Module) -> bool:
    """Wrap the ``rotary_pos_emb`` of the ``GPTModel`` inside ``chunk`` (DDP / Float16 wrappers
    unwrapped) in :class:`RepeatedHalvesRotary`, once. Returns whether one was wrapped (``False``:
    no RoPE, e.g. learned positions, which read the repeated position ids directly)."""
    module = chunk
    while hasattr(module, "module") and not hasattr(module, "rotary_pos_emb"):
        module = module.module
    rotary = getattr(module, "rotary_pos_emb", None)
    if rotary is None or isinstance(rotary, RepeatedHalvesRotary):
        return False
    module.rotary_pos_emb = RepeatedHalvesRotary(rotary)
    return True


def _from_config(config: Any, **_: Any) -> BlockDiffusionObjective:
    """The objective of an ``ObjectiveConfig`` whose ``options`` the compiler wrote
    (:meth:`dlmspec.objectives.bd3lm.BlockDiffusion.runtime_options`).

    Raises:
        ValueError: no ``mask_token_id``, no ``block_size``, or a setting out of range.
    """
    if getattr(config, "mask_token_id", None) is None:
        raise ValueError("the bd3lm objective needs mask_token_id")
    options = dict(getattr(config, "options", None) or {})
    if options.get("block_size") is None:
        raise ValueError("the bd3lm objective needs options['block_size'] (objective.block_size)")
    eps = float(getattr(config, "eps", 1e-3))
    return BlockDiffusionObjective(
        config.mask_token_id, block_size=int(options["block_size"]),
        noise_range=options.get("noise_range", (eps, 1.0)),
        ar_loss_weight=float(options.get("ar_loss_weight", 0.0)),
        noise_schedule=options.get("noise_schedule", getattr(config, "noise_schedule", "linear")),
        noise_schedule_exponent=options.get("noise_schedule_exponent",
                                            getattr(config, "noise_schedule_exponent", POLYNOMIAL_EXPONENT_DEFAULT)),
        block_size_schedule=options.get("block_size_schedule"))


register_runtime("bd3lm", _from_config)
