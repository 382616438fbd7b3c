"""Masked diffusion (``objective.kind = "mdm"``), compiler side: LLaDA / MDLM's absorbing-state
diffusion (docs/runtime.md, "Objectives"). Runtime half:
:mod:`dlmspec.backends.megatron.objectives.mdm`."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

from dlmspec.objectives.base import Objective, register
from dlmspec.objectives.schedules import MaskingSchedule, masking_schedule

from dlmspec.names import CART_P_DEFAULT  # noqa: F401 - objective.cart_p unset (its source: dlmspec.names)


def _get(objective: Any, key: str, default: Any = None) -> Any:
    value = getattr(objective, key, default)
    return default if value is None else value


class MaskedDiffusion(Objective):
    kind = "mdm"
    description = "masked diffusion (LLaDA / MDLM)"
    attention = "bidirectional"
    attentions = ("bidirectional", "block_causal")
    diffusion = True
    loss_row_fraction = 0.5
    input_bytes_per_token = 9
    predicts_next_token = False
    rl_algorithm = "diffu-grpo"
    adjective = "masked-diffusion"

    def masked_variable_length_prob(self, objective: Any) -> float:
        if (_get(objective, "variable_length", "sequence")) != "sequence":
            return 0.0  # a micro-batch cut is dense: no mask
        return float(_get(objective, "variable_length_prob", 0.0))

    def variable_length_prob(self, objective: Any) -> float:
        return float(_get(objective, "variable_length_prob", 0.0))

    def loss_row_fraction_of(self, objective: Any) -> float:
        """``E[1 - alpha(t)]`` over ``t ~ U(0, 1)``: the share of masked positions (which carry the
        loss). Linear 1/2; cosine ``int_0^1 cos(pi/2 (1 - t)) dt = 2/pi``; polynomial
        ``int_0^1 t^a dt = 1 / (a + 1)``."""
        schedule = self.schedule(objective)
        if schedule.is_linear:
            return self.loss_row_fraction
        if schedule.name == "cosine":
            return 2.0 / math.pi
        return 1.0 / (float(schedule.exponent) + 1.0)

    def dataset_extra_token(self, objective: Any, stage_kind: str) -> bool:
        # MegaDLMs' window (objective.unshift) draws seq_length + 1 ids; SFT never unshifts
        return bool(_get(objective, "unshift", False)) and stage_kind != "sft"

    def unsupervised_padding_segment(self, pad_eos_tokens: Optional[int]) -> bool:
        return pad_eos_tokens is not None

    def schedule(self, objective: Any) -> MaskingSchedule:
        return masking_schedule(_get(objective, "noise_schedule", "linear"),
                                _get(objective, "noise_schedule_exponent", None))

    def cart_p(self, objective: Any) -> Optional[float]:
        """``objective.cart_p`` with ``loss_weighting = "cart"`` (unset: :data:`CART_P_DEFAULT`);
        ``None`` with another weighting (it has no effect there)."""
        if _get(objective, "loss_weighting", "llada") != "cart":
            return None
        return float(_get(objective, "cart_p", CART_P_DEFAULT))

    def runtime_options(self, objective: Any) -> List[Tuple[str, Any, str]]:
        options: List[Tuple[str, Any, str]] = []
        p = self.cart_p(objective)
        if p is not None:
            options.append(("cart_p", p, "CART's geometric p: w_n = 1/2 sum_(i != n) clean_i p (1-p)^(|n-i|-1) "
                                         "(Dream-Coder fsdp_sft_trainer.py:93-112)"))
        schedule = self.schedule(objective)
        if schedule.name != "linear":
            formula = {"cosine": "alpha(t) = 1 - cos(pi/2 (1-t)), weight pi/2 tan(pi/2 (1-t))",
                       "polynomial": f"alpha(t) = 1 - t^{schedule.exponent:g}, weight {schedule.exponent:g}/t"}
            options.append(("noise_schedule", schedule.name,
                            f"{formula[schedule.name]} (MDLM eq. 10 weight -alpha'/(1-alpha))"))
            if schedule.name == "polynomial":
                options.append(("noise_schedule_exponent", float(schedule.exponent), "the polynomial's exponent a"))
        anneal = _get(objective, "attention_anneal_iters", None)
        if anneal is not None:
            options.append(("options", {"attention_anneal_iters": int(anneal)},
                            "attention annealing (DiffuLLaMA arXiv:2410.17891 sec. 3.2): step k attends the causal "
                            "mask OR each key with probability min(1, (k+1)/attention_anneal_iters)"))
        return options


MDM = register(MaskedDiffusion())
