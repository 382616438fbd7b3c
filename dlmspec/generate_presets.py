"""Pinned evaluation protocols: named sampler settings (``[generate] preset = "NAME"``, and
``--model_args preset=NAME`` of ``dlmspec-lm-eval``) with the settings LLaDA, Dream and Fast-dLLM
report GSM8K, HumanEval and MMLU with, so that a number states its protocol.

Each :class:`Preset` holds the ``[generate]`` values it sets (:attr:`Preset.settings`), the
protocol facts that are not sampler settings (few-shot count, chat template, cache, the peer's
own remasking name: :attr:`Preset.protocol`), its source (paper section or repository file), and
:attr:`Preset.unconfirmed`: every value that the source did not state and that is therefore
dlmspec's reading, not the peer's (do not quote it as theirs).

Resolution (:func:`apply_preset`, run before ``[generate]`` is validated and by the lm-eval
model): the preset's settings fill every key the table does not write; written values win; the
table keeps ``preset`` so every output records the name. Settings a build of dlmspec has no
field for (``cache`` before block KV caches exist) stay in :attr:`Preset.protocol` only, and a
setting the peer uses that dlmspec's sampler does not have (Dream's ``alg = "entropy"``) is named
there with the closest setting dlmspec applies. Plain Python: no torch import.

Sources (file paths at the repositories' default branches; where the text was read from a copy,
the copy is named):

- LLaDA (Nie et al. 2025, arXiv:2502.09992): the evaluation notes of github:ML-GSAI/LLaDA
  (``EVAL.md``: the Instruct table of gen_length / block_length per benchmark, "pure diffusion
  sampling"; the semi-autoregressive GSM8K row gen_length 256, block_length 8, 78.6), read as
  stored in a public code index (the file's text; its repository was not shown there).
- Fast-dLLM (Wu et al. 2025, arXiv:2505.22618): github:NVlabs/Fast-dLLM ``llada/eval_gsm8k.sh``
  (``length=256 block_length=32 num_fewshot=5``, ``threshold=0.9``, ``use_cache=True
  dual_cache=True``; read from forks that keep the script's text, and cited by docs/generate.md
  at commit 24cc59e) and ``v1/llada/eval_humaneval.sh`` (read from NVlabs/Fast-dLLM itself: the
  same settings, no ``--num_fewshot``).
- Dream (Ye et al. 2025, arXiv:2508.15487): github:DreamLM/Dream ``eval_instruct/eval.sh``
  (read as the copy ``Dream/eval_instruct/eval.sh`` of github:zhangshuibai/llada-reproduce):
  ``gsm8k_cot`` 0-shot ``max_new_tokens=256 diffusion_steps=256 temperature=0.1 top_p=0.9
  alg="entropy"``; ``mmlu_generative`` 4-shot 128/128; ``humaneval_instruct`` 0-shot 768/768;
  all with ``--apply_chat_template``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

__all__ = ["Preset", "PRESETS", "PresetError", "apply_preset", "preset_record", "SAMPLER_FIELDS"]

#: ``[generate]`` keys a preset may set (the sampler's settings; ``cache`` and ``cache_refresh``
#: apply where the build's ``GenerateConfig`` has them).
SAMPLER_FIELDS = ("gen_length", "steps", "block_length", "remasking", "threshold", "temperature", "top_k", "top_p",
                  "cfg_scale", "cache", "cache_refresh")


class PresetError(ValueError):
    """``preset`` names no preset: ``value`` and the names that exist (``fix``)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.fix = "one of: " + ", ".join(sorted(PRESETS))
        super().__init__(f"preset = {value!r}: not a preset; {self.fix}")


@dataclass(frozen=True)
class Preset:
    """One pinned protocol.

    Attributes:
        name: the preset's name (``"llada-gsm8k"``).
        model, benchmark: whose protocol, for which benchmark.
        settings: ``[generate]`` values (:data:`SAMPLER_FIELDS`).
        protocol: the rest of the protocol (``num_fewshot``, ``chat_template``, ``cache``,
            ``peer_remasking``, the reported score), recorded, not applied.
        source: paper section and repository file the values come from.
        unconfirmed: keys (of ``settings`` or ``protocol``) the source does not state.
    """

    name: str
    model: str
    benchmark: str
    settings: Dict[str, Any]
    protocol: Dict[str, Any]
    source: str
    unconfirmed: Tuple[str, ...] = field(default=())


_LLADA_EVAL = "LLaDA arXiv:2502.09992 App. B.4 / B.6; github:ML-GSAI/LLaDA EVAL.md (LLaDA-8B-Instruct table)"
_FAST_DLLM = "Fast-dLLM arXiv:2505.22618 sec. 4; github:NVlabs/Fast-dLLM llada/eval_gsm8k.sh"
_DREAM = "Dream arXiv:2508.15487; github:DreamLM/Dream eval_instruct/eval.sh"

PRESETS: Dict[str, Preset] = {p.name: p for p in (
    Preset("llada-gsm8k", "LLaDA-8B-Instruct", "GSM8K",
           {"gen_length": 512, "block_length": 512, "steps": 512, "remasking": "low_confidence", "temperature": 0.0},
           {"num_fewshot": None, "chat_template": True, "cache": "none", "confidence_eos_eot_inf": True,
            "reported": "69.4 (internal toolkit), 68.8 (OpenCompass)"},
           _LLADA_EVAL, ("steps", "num_fewshot")),
    Preset("llada-gsm8k-semi-ar", "LLaDA-8B-Instruct", "GSM8K",
           {"gen_length": 256, "block_length": 8, "steps": 256, "remasking": "low_confidence", "temperature": 0.0},
           {"num_fewshot": None, "chat_template": True, "cache": "none", "confidence_eos_eot_inf": False,
            "reported": "78.6 (internal toolkit), 78.9 (OpenCompass)"},
           _LLADA_EVAL + " (semi-autoregressive row)", ("steps", "num_fewshot")),
    Preset("llada-humaneval", "LLaDA-8B-Instruct", "HumanEval",
           {"gen_length": 512, "block_length": 512, "steps": 512, "remasking": "low_confidence", "temperature": 0.0},
           {"num_fewshot": None, "chat_template": True, "cache": "none", "logits_eos_inf": True,
            "reported": "49.4 (internal toolkit), 47.0 (OpenCompass)"},
           _LLADA_EVAL, ("steps", "num_fewshot")),
    Preset("llada-mmlu", "LLaDA-8B-Instruct", "MMLU (generation)",
           {"gen_length": 3, "block_length": 3, "steps": 3, "remasking": "low_confidence", "temperature": 0.0},
           {"num_fewshot": None, "chat_template": True, "cache": "none",
            "reported": "65.5 (internal toolkit), 65.4 (OpenCompass)"},
           _LLADA_EVAL, ("steps", "num_fewshot")),
    Preset("fast-dllm-gsm8k", "LLaDA-8B-Instruct with Fast-dLLM", "GSM8K",
           {"gen_length": 256, "block_length": 32, "steps": 256, "remasking": "threshold", "threshold": 0.9,
            "temperature": 0.0, "cache": "dual"},
           {"num_fewshot": 5, "chat_template": False, "cache": "dual",
            "reported": "78.5 at 54.4 tokens/s, length 256 (paper: 79.3 without cache or parallel decoding)"},
           _FAST_DLLM, ("chat_template",)),
    Preset("fast-dllm-humaneval", "LLaDA-8B-Instruct with Fast-dLLM", "HumanEval",
           {"gen_length": 256, "block_length": 32, "steps": 256, "remasking": "threshold", "threshold": 0.9,
            "temperature": 0.0, "cache": "dual"},
           {"num_fewshot": 0, "chat_template": False, "cache": "dual", "postprocess": "postprocess_code.py"},
           "Fast-dLLM arXiv:2505.22618 sec. 4; github:NVlabs/Fast-dLLM v1/llada/eval_humaneval.sh",
           ("num_fewshot",)),
    Preset("dream-gsm8k", "Dream-v0-Instruct-7B", "GSM8K (gsm8k_cot)",
           {"gen_length": 256, "block_length": 256, "steps": 256, "remasking": "low_confidence", "temperature": 0.1,
            "top_p": 0.9},
           {"num_fewshot": 0, "chat_template": True, "cache": "none",
            "peer_remasking": "alg=entropy (not in dlmspec's sampler: low_confidence applied instead)"},
           _DREAM, ("block_length", "remasking")),
    Preset("dream-humaneval", "Dream-v0-Instruct-7B", "HumanEval (humaneval_instruct)",
           {"gen_length": 768, "block_length": 768, "steps": 768, "remasking": "low_confidence", "temperature": 0.1,
            "top_p": 0.9},
           {"num_fewshot": 0, "chat_template": True, "cache": "none",
            "peer_remasking": "alg=entropy (not in dlmspec's sampler: low_confidence applied instead)"},
           _DREAM, ("block_length", "remasking")),
    Preset("dream-mmlu", "Dream-v0-Instruct-7B", "MMLU (mmlu_generative)",
           {"gen_length": 128, "block_length": 128, "steps": 128, "remasking": "low_confidence", "temperature": 0.1,
            "top_p": 0.9},
           {"num_fewshot": 4, "chat_template": True, "cache": "none",
            "peer_remasking": "alg=entropy (not in dlmspec's sampler: low_confidence applied instead)"},
           _DREAM, ("block_length", "remasking")),
)}


def _available_fields() -> frozenset[str]:
    """The :data:`SAMPLER_FIELDS` this build's ``GenerateConfig`` has (``cache`` only once the
    block KV caches exist)."""
    import dataclasses

    from dlmspec.generate_settings import GenerateConfig

    names = {f.name for f in dataclasses.fields(GenerateConfig)}
    return frozenset(k for k in SAMPLER_FIELDS if k in names)


def apply_preset(values: Any) -> Any:
    """``values`` (a ``[generate]`` table, or lm-eval model arguments) with its ``preset``'s
    settings filled in under the written keys, then ``steps`` / ``block_length`` following
    ``gen_length`` (:func:`dlmspec.generate_settings.follow_gen_length`). Where the table writes
    ``gen_length``, a preset's ``steps`` or ``block_length`` equal to its own ``gen_length`` (one
    token per step, one block) follows the written length instead. ``preset`` stays in the result
    (it is recorded). Anything that is not a dict, or has no ``preset``, only follows ``gen_length``.

    Raises:
        PresetError: ``preset`` names no preset (a ``ValueError``: pydantic reports it on the key).
    """
    from dlmspec.generate_settings import follow_gen_length

    if isinstance(values, dict) and values.get("preset") is not None:
        name = values["preset"]
        preset = PRESETS.get(name) if isinstance(name, str) else None
        if preset is None:
            raise PresetError(name)
        fields = _available_fields()
        filled = {k: v for k, v in preset.settings.items() if k in fields}
        if "gen_length" in values:  # a preset's "one length" (steps or block = gen_length) follows a written gen_length
            for key in ("steps", "block_length"):
                if filled.get(key) == filled.get("gen_length"):
                    filled.pop(key, None)
        values = {**filled, **values}
    return follow_gen_length(values)


def preset_record(name: str) -> Dict[str, Any]:
    """What outputs record of preset ``name``: its name, model, benchmark, settings, protocol,
    source, unconfirmed keys, and the settings this build could not apply.

    Raises:
        PresetError: ``name`` names no preset.
    """
    preset = PRESETS.get(name)
    if preset is None:
        raise PresetError(name)
    fields = _available_fields()
    return {"name": preset.name, "model": preset.model, "benchmark": preset.benchmark,
            "settings": dict(preset.settings), "protocol": dict(preset.protocol), "source": preset.source,
            "unconfirmed": list(preset.unconfirmed),
            "not_applied": sorted(k for k in preset.settings if k not in fields)}
