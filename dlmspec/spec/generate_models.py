"""``[generate]`` (the sampler's settings) and ``[eval]`` / ``[eval.generation]`` (generation
accuracy during training). Part of the spec's models; import them from :mod:`dlmspec.spec.models`."""

from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from dlmspec.spec.section import Bool, Float, NonNegInt, PosInt, Section


class GenerateSpec(Section):
    """``[generate]``: the sampler's settings for ``dlmspec generate`` / ``eval`` (every field of
    ``dlmspec.generate_settings.GenerateConfig`` but the model's own: ``kind`` and the token
    ids come from ``[objective]`` and the tokenizer). Defaults are LLaDA's generate.py (threshold:
    Fast-dLLM's); flags of ``dlmspec generate`` override them, and every output records the values
    used. The rules that join fields (``block_length`` divides ``gen_length``, ``steps`` a multiple
    of the blocks) are ``GenerateConfig``'s: the rule ``generate-settings``
    (:mod:`dlmspec.check.generate`) and ``generate`` itself run them; pipeline-parallel generation is
    refused by the rule ``generate-pipeline`` (docs/generate.md)."""

    gen_length: PosInt = Field(128, description="Tokens generated after each prompt (LLaDA: 128).")
    steps: PosInt = Field(128, description="Denoising steps over gen_length, split equally over the blocks "
                               "(not used by remasking = 'threshold').")
    block_length: PosInt = Field(128, description="Semi-autoregressive block length; divides gen_length.")
    remasking: Literal["low_confidence", "random", "threshold", "factor"] = Field(
        "low_confidence", description="Which predictions a step commits: the most confident (LLaDA), random "
        "(LLaDA's baseline), all above `threshold` (Fast-dLLM) or Fast-dLLM's factor rule (`factor`).")
    threshold: Float = Field(0.9, gt=0.0, le=1.0, description="remasking = 'threshold': the confidence committed at.")
    factor: Float = Field(1.0, gt=0.0, description="remasking = 'factor': commit the n most confident while "
                          "the n-th confidence >= 1 - factor / (n + 1) (Fast-dLLM).")
    cache: Literal["none", "prefix", "dual"] = Field(
        "none", description="Block KV cache (Fast-dLLM): 'prefix' reuses the prompt's and finished blocks' keys "
        "and values inside a block, 'dual' the masked suffix's too.")
    cache_refresh: PosInt | None = Field(
        None, description="Denoising steps between cache recomputations inside a block (None: at each block's "
        "first step only, Fast-dLLM's; 1: every step, exact).")
    compile: Bool = Field(False, description="Run block forwards through torch.compile(mode='reduce-overhead') "
                          "(CUDA graphs).")
    cuda_graph: Bool = Field(True, description="Replay the model's forward as one CUDA graph per shape "
                             "(backends/generate/cuda_graphs.py): the same tokens as eager without its per-step host "
                             "time. A no-op with the reason recorded on CPU, at TP > 1, with compile = true.")
    temperature: Float = Field(0.0, ge=0.0, description="0 is greedy; above 0 samples softmax(logits / T).")
    top_k: PosInt | None = Field(None, description="Keep the top_k largest logits (None: all).")
    top_p: Float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling mass (None: all).")
    cfg_scale: Float = Field(0.0, ge=0.0, description="Classifier-free guidance w (LLaDA App. B.3); 0: none. MDM only.")
    seed: NonNegInt = Field(0, description="Seed of the sampler's random draws.")
    preset: str | None = Field(None, description="A pinned evaluation protocol (dlmspec.generate_presets: "
                               "'llada-gsm8k', 'fast-dllm-gsm8k', 'dream-gsm8k', ...): fills the keys not written; "
                               "recorded with every output.")

    @model_validator(mode="before")
    @classmethod
    def _follow_gen_length(cls, data: Any) -> Any:
        """The ``preset``'s settings fill the keys not written, then ``steps`` and ``block_length``
        not written follow ``gen_length`` (LLaDA's defaults are one length):
        :func:`dlmspec.generate_presets.apply_preset`.

        Raises:
            PydanticCustomError: ``unknown_generate_preset`` (context ``preset``: the name as
                written, ``fix``: the names that exist) for a name not in
                :data:`~dlmspec.generate_presets.PRESETS`; :mod:`dlmspec.spec.schema_errors` reports
                it at ``generate.preset``."""
        from dlmspec.generate_presets import PresetError, apply_preset

        try:
            return apply_preset(data)
        except PresetError as exc:
            raise PydanticCustomError("unknown_generate_preset", "not a [generate] preset; {fix}",
                                      {"preset": exc.value, "fix": exc.fix}) from None


class GenerationEvalSpec(Section):
    """``[eval.generation]``: generation accuracy during training. At every ``every``-th step
    (a multiple of ``train.eval_interval``; default: ``eval_interval``) the runtime samples the
    first ``max_prompts`` prompts of ``prompts`` (JSONL ``{"prompt", "answer"}`` a line, as
    ``dlmspec task make`` writes) with the current model and ``[generate]``'s settings, scores
    each with ``checker`` (:mod:`dlmspec.tasks.check`) and logs ``eval/generation_accuracy``
    with its count beside the validation loss (backends/megatron/generation_eval.py)."""

    prompts: str = Field(min_length=1, description="JSONL of {\"prompt\", \"answer\"} rows (extra keys ignored).")
    every: PosInt | None = Field(None, description="Steps between generation evaluations: a multiple of "
                                 "train.eval_interval (default: eval_interval).")
    max_prompts: PosInt = Field(500, description="Prompts scored each time (the file's first).")
    batch_size: PosInt = Field(64, description="Prompts sampled together.")
    checker: Literal["exact_match"] = Field("exact_match", description="How a completion is scored: the "
                                            "normalised final answer equals the answer's (dlmspec.tasks.check).")


class EvalSpec(Section):
    """``[eval]``: evaluations the runtime runs at ``train.eval_interval`` besides the validation
    loss: ``[eval.generation]`` (generation accuracy on a task)."""

    generation: GenerationEvalSpec | None = None
