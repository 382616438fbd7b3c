"""``[stage]`` and its tables (``[stage.sft]``, ``[stage.rl]`` and its rewards): which phase of
training a job is. Part of the spec's models; import them from :mod:`dlmspec.spec.models`."""

from typing import Any, Literal

from pydantic import Field

from dlmspec.spec.section import Bool, Float, NonNegInt, PosFloat, PosInt, Section


class SFTSpec(Section):
    """``[stage.sft]``: supervised fine-tuning on conversations (``dlmspec data prepare --sft``
    data: one document per conversation and its response mask, backends/megatron/sft.py)."""

    chat_template: Literal["chatml", "llama3", "plain", "tokenizer"] = Field(
        "chatml", description="The chat template the data was rendered with ('tokenizer': the tokenizer's own, "
        "through transformers' apply_chat_template); validate compares it with the dataset record."
    )
    mask_prompt: Bool = Field(True, description="Never mask (or train on) prompt tokens.")
    prompt_key: str = "prompt"
    response_key: str = "response"
    packed_sequence: Bool = Field(
        False,
        description="Pack several conversations into each sequence (Megatron-Bridge's packed sequences), "
        "attention kept inside each by a document mask (local layers only); false: one conversation per "
        "sequence, followed by EOS padding.",
    )
    over_long: Literal["skip", "truncate"] = Field(
        "skip", description="A conversation longer than train.seq_length is skipped or truncated; the runtime "
        "counts either at start."
    )
    pad_eos_tokens: NonNegInt | None = Field(
        None,
        description="How many EOS of the padding after a conversation count as response (its own final EOD "
        "always does). Unset: all of them for mdm (LLaDA sec. 2.3: the model learns to fill its generation "
        "length with EOS, which its fixed-length sampler needs), 0 for ar (an AR decoder stops at the first "
        "EOD). Packing leaves no padding inside a sequence: no effect with packed_sequence = true.",
    )


class RewardSpec(Section):
    """One entry of ``stage.rl.rewards``: a reward function and its weight in the total."""

    function: str = Field(
        description="'path/to/file.py:name' (a Python file, relative to the directory the job starts in, defining "
        "name(prompt: str, completion: str, **row) -> float) or 'builtin:exact_match' / 'builtin:format'. validate "
        "reads the file and checks that it defines the function; only the job imports it."
    )
    weight: Float = Field(1.0, description="Weight of this reward in the total (the weighted sum).")


class RLSpec(Section):
    """``[stage.rl]``: reinforcement learning from verifiable rewards (GRPO, Shao et al. 2024, for
    autoregressive models; d1's diffu-GRPO, Zhao et al. 2025, and DiffuCoder's coupled-GRPO, Gong et
    al. 2025, for masked diffusion). Names are Megatron-LM's (``--grpo-*``) where it has one.
    Rollouts use the sampler settings of ``[generate]`` (temperature included)."""

    algorithm: Literal["diffu-grpo", "coupled-grpo", "grpo"] = Field(
        "diffu-grpo", description="'diffu-grpo' (d1: completion fully masked, prompt masked with prompt_mask_prob, "
        "one forward pass), 'coupled-grpo' (DiffuCoder: complementary mask pairs, every completion token scored "
        "once per pair), 'grpo' (autoregressive: exact token log-probabilities)."
    )
    estimator: Literal["one-step", "coupled", "mc-elbo", "ar"] | None = Field(
        None, description="The log-probability estimator (backends/rl/estimators.py); unset: the algorithm's "
        "(diffu-grpo: one-step, coupled-grpo: coupled, grpo: ar)."
    )
    elbo_samples: PosInt = Field(4, description="estimator = 'mc-elbo': masks drawn per log-probability (K).")
    prompts: str | None = Field(
        None, description="JSONL file of {\"prompt\", \"answer\", ...} rows (extra fields reach the rewards as **row)."
    )
    prompts_on_error: Literal["error", "skip"] = Field(
        "error", description="A malformed prompt row stops the job naming file and line ('error'), or is skipped "
        "and counted ('skip')."
    )
    chat_template: Literal["chatml", "llama3", "plain", "none"] = Field(
        "chatml", description="How a prompt is rendered before tokenising: one user turn of the SFT stage's built-in "
        "templates (dlmspec.data.chat), or 'none': the prompt text as written (a model pre-trained on the task's text)."
    )
    rewards: list[RewardSpec] = Field(
        [], description="The reward functions and weights; the total reward is their weighted sum. Empty: "
        "[{function = \"builtin:exact_match\"}] (the final answer against the row's \"answer\").",
    )
    reward_workers: PosInt = Field(2, description="Worker processes scoring completions (outside the training process).")
    reward_timeout_s: PosFloat = Field(10.0, description="Seconds one reward call may take before it counts as failed.")
    grpo_group_size: PosInt = Field(8, description="Completions sampled per prompt (G).")
    grpo_prompts_per_step: PosInt = Field(
        8, description="Prompts per rollout batch; prompts x group size must equal train.global_batch_size."
    )
    grpo_iterations: PosInt = Field(
        1, description="Optimizer steps on each rollout batch (d1's mu); above 1 the ratio to the rollout policy is clipped."
    )
    grpo_clamp_eps_lower: Float = Field(0.2, ge=0.0, lt=1.0, description="Ratio clip below: 1 - eps.")
    grpo_clamp_eps_upper: Float = Field(0.2, ge=0.0, description="Ratio clip above: 1 + eps (DAPO raises it).")
    grpo_kl_beta: Float = Field(
        0.04, ge=0.0, description="KL penalty to the frozen reference model (k3 estimator); 0 builds no reference."
    )
    ref_model_sync_steps: PosInt | None = Field(
        64, description="Copy the policy into the reference every this many steps (d1, DiffuCoder: 64); unset: never."
    )
    prompt_mask_prob: Float = Field(
        0.15, ge=0.0, lt=1.0, description="diffu-grpo / mc-elbo: probability of masking each prompt token when "
        "scoring (d1: 0.15), a fresh mask per inner iteration."
    )
    advantage_scale: Literal["std", "none"] = Field(
        "std", description="Divide each group's centred rewards by its std ('std', GRPO) or not ('none', Dr. GRPO)."
    )
    filter_groups: Bool = Field(
        False, description="Drop groups whose rewards are all equal (DAPO's dynamic sampling filter): they carry no "
        "advantage; the share dropped is logged."
    )
    loss_normalization: Literal["token", "sequence", "group"] = Field(
        "token", description="Policy loss averaged over completion tokens ('token', DAPO), per sequence then over "
        "sequences ('sequence', GRPO / d1), or per group ('group')."
    )
    truncated_completions: Literal["keep", "mask", "zero_reward"] = Field(
        "keep", description="A completion that reached gen_length without EOS: trained as scored ('keep'), left out "
        "of the loss ('mask', DAPO's overlong filter), or given reward 0 ('zero_reward')."
    )
    sample_log_interval: NonNegInt = Field(
        10, description="Every this many rollout batches, write prompts, completions and rewards to "
        "<run_dir>/rollouts.jsonl; 0: never."
    )


def _registered_stage_kinds(schema: dict[str, Any]) -> None:
    """The JSON Schema of ``stage.kind``: an enum of the kinds registered when the schema is made
    (:data:`dlmspec.stages.STAGE_KINDS`; the loader takes any string, rule ``stage-kind-known``
    refuses the others, as ``cluster.gpu``'s catalog)."""
    from dlmspec.stages import STAGE_KINDS

    schema["enum"] = list(STAGE_KINDS)


class StageSpec(Section):
    """``[stage]``: which phase of training this job is."""

    kind: str = Field(
        "pretrain",
        description="The stage: 'pretrain', 'sft', 'rl' or a kind a plugin registers (dlmspec.stages); validate "
        "refuses a kind no stage registers (rule stage-kind-known).",
        json_schema_extra=_registered_stage_kinds,
    )
    sft: SFTSpec | None = None
    rl: RLSpec | None = None
