"""The RL stage (``[stage] kind = "rl"``): GRPO for autoregressive models and diffu-GRPO /
coupled-GRPO for masked-diffusion models, on the training loop's stage seam.

One *rollout batch* is ``grpo_prompts_per_step`` prompts x ``grpo_group_size`` completions
(``train.global_batch_size`` sequences; each data-parallel rank rolls out whole groups of its
``grpo_prompts_per_step / dp`` prompts). Every ``grpo_iterations`` optimizer steps
:meth:`RLStage.before_step` makes a new one (:class:`RolloutEngine`):

1. its prompts, in a seeded order per epoch (:meth:`RolloutEngine.next_prompts`), rendered with
   the SFT stage's chat template and tokenised;
2. ``G`` completions each from the sampler with the current policy in eval mode
   (:func:`dlmspec.backends.generate.sampler.generate` for masked diffusion,
   :func:`~dlmspec.backends.generate.sampler.generate_ar` for AR; settings of ``[generate]``,
   through ``ctx.resources.logits_fn(chunk)``), drawn from the stage's rollout generator (kept in
   checkpoints);
3. rewards in worker processes (``backends/rl/rewards.py`` :class:`RewardPool`); a failed reward
   (raised, hung, not a number, crashed worker) leaves that completion out of the loss;
4. group-normalised advantages (GRPO, Shao et al. 2024, eq. 3: ``(r - mean_g) / (std_g + eps)``;
   ``advantage_scale = "none"``: Dr. GRPO, Liu et al. 2025), optionally dropping groups whose
   rewards do not vary (DAPO, Yu et al. 2025, sec. 3.2);
5. with ``grpo_iterations > 1`` the rollout policy's log-probabilities ("old", one per inner
   iteration after the first, each with that iteration's estimator masks: d1 draws a fresh prompt
   mask per inner iteration; the first iteration's are the training forward's own, detached, as the
   policy has not changed yet) and with ``grpo_kl_beta > 0`` the frozen reference's (one per inner
   iteration), in microbatches; the ``ar`` estimator draws nothing, so each is scored once per
   rollout batch and shared by its iterations.

The step's microbatches are the rollout batch's rows (``train.micro_batch_size`` each); the
forward step scores them with the estimator (``backends/rl/estimators.py``: one forward pass for
``one-step``, two for ``coupled``, K for ``mc-elbo``, one for ``ar``) and the loss function is
the clipped ratio objective (``backends/rl/loss.py`` :func:`policy_loss`: asymmetric bounds
``[1 - eps_lower, 1 + eps_upper]``, k3 KL to the reference), normalised within the microbatch.
Each microbatch reports ``num_tokens`` = 1 (:func:`_rl_loss_func`), so megatron's schedule
(``calculate_per_token_loss``) makes the step's loss the mean of its microbatches' losses.

Logged per step (``train`` records: metrics.jsonl, TensorBoard, W&B): reward mean/std in total and
per function, accuracy (the share of exact-match rewards equal to 1), KL, clip fraction, ratio,
the share of groups without reward variance and of those filtered, failed rewards, completion
length, the share of EOS-terminated completions, rollout and update seconds, rollout tokens/s.
Every ``sample_log_interval`` rollout batches the first rank writes its prompts, completions and
rewards to ``<run_dir>/rollouts.jsonl``.

Checkpoints keep, per rank (:meth:`RLStage.state_dict`), the rollout generator's state, the prompt
order and cursor, and the rollout batch in flight (a resume between two inner iterations trains
on the same rollouts): a resumed run draws the rollouts an uninterrupted one draws.

The reference model (``grpo_kl_beta > 0``) of a resumed run is the one an uninterrupted run holds
at that step. It is kept in the checkpoint's megatron-core distributed checkpoint, beside the
policy (:meth:`RLStage.sharded_state_dict`): ``reference_synced_at``, the step of its last refresh
(0: not refreshed since the start), and, when that is after the start or the run has no
``checkpoint.init_from``, its weights as the reference chunks' ``sharded_state_dict`` with every
key under ``rl_reference.`` (:data:`REFERENCE_PREFIX`), written once over all ranks as the policy's
weights are. A resume in any tensor- or data-parallel layout loads them, resharded
(:meth:`RLStage.load_sharded_state_dict`); a reference not refreshed since the start is loaded
again from ``checkpoint.init_from``
(:func:`~dlmspec.backends.megatron.init_from.initialize_from`), so a run with
``ref_model_sync_steps = 0`` keeps no reference weights in its checkpoints.

Checkpoints of earlier versions kept the reference's weights per rank (with the RNG states): they
resume in the layout they were saved in; in another layout their reference is reloaded from
``init_from`` when it had not been refreshed, and otherwise the resume is refused (exit 2, naming
the checkpoint: resume it once in its own layout, whose next checkpoint is of the sharded format).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from torch import Tensor

from dlmspec.names import CHECKPOINT_RECORD
from dlmspec.backends.megatron.stage import LM_LOSS, StageBase, StageData, sum_reports

from .rollout import (LOSS_REPORT, ROLLOUT_REPORT, RLConfig, RLCore, Rollout, RolloutEngine, RolloutStats,
                      default_core, move_logps, rollout_metrics, write_samples)

__all__ = ["REFERENCE_PREFIX", "RLConfig", "RLStage", "reference_prefix", "register"]

#: The key prefix of the reference model's tensors in a checkpoint (megatron-core distributed
#: checkpointing: the policy's keys are ``embedding...``, ``decoder...``, ``output_layer...``).
REFERENCE_PREFIX = "rl_reference."


def reference_prefix(chunk: int, chunks: int) -> str:
    """The key prefix of reference chunk ``chunk`` of ``chunks``: :data:`REFERENCE_PREFIX` for one
    chunk, ``rl_reference<i>.`` for virtual pipeline chunks (as the policy's ``model<i>``)."""
    return REFERENCE_PREFIX if chunks == 1 else f"rl_reference{chunk}."


# ----------------------------------------------------------------------------------------------
# The stage of the training loop (megatron-core)


def _training_logits(model: torch.nn.Module, tensor_model_parallel_size: int) -> Callable[..., Tensor]:
    """``(tokens [b, s], attention [b, s] or None) -> logits [b, s, V]`` float32 of a megatron-core
    ``GPTModel`` chunk, with gradients: :func:`dlmspec.backends.generate.models.gpt_logits_fn`'s
    positions and key-padding mask; the vocabulary gathered over tensor-parallel ranks
    (megatron-core's ``gather_from_tensor_model_parallel_region``, whose backward splits it)."""
    gather = None
    if tensor_model_parallel_size > 1:
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region as gather

    def fn(tokens: Tensor, attention: Optional[Tensor] = None) -> Tensor:
        b, s = tokens.shape
        if attention is None:
            position_ids = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
            hidden_mask = None
        else:
            position_ids = (attention.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden_mask = (~attention.bool()).view(b, 1, 1, s)
        logits = model(tokens, position_ids, hidden_mask)
        if gather is not None:
            logits = gather(logits.contiguous())
        return logits.float()

    return fn


class _RolloutRows:
    """The training feed's source: each ``next()`` is the next microbatch of the rollout batch in
    use (row slices; the forward step reads the rollout itself)."""

    def __init__(self, stage: "RLStage") -> None:
        self.stage = stage

    def __iter__(self) -> "_RolloutRows":
        return self

    def __next__(self) -> Dict[str, Any]:
        return self.stage._next_microbatch()


class RLStage(StageBase):
    """The RL stage of :func:`~dlmspec.backends.megatron.training.train` (see the module docstring).

    Args:
        run: The run's settings (``objective.kind`` picks the sampler; ``seed``; ``logging.run_dir``).
        options: :class:`RLConfig`.
        core: :class:`RLCore` (default :func:`default_core`).
        tokenizer: A tokenizer instead of the run's (``ctx.resources.tokenizer``, built from the
            spec record), for a run without one (tests).
    """

    def __init__(self, run: Any, options: Optional[RLConfig] = None, core: Optional[RLCore] = None,
                 tokenizer: Any = None) -> None:
        super().__init__(run)
        self.config = options if options is not None else RLConfig()
        self.core = core
        self.tokenizer = tokenizer
        self.kind = f"rl-{self.config.algorithm}"
        self.engine: Optional[RolloutEngine] = None
        self.rollout: Optional[Rollout] = None
        self.reference: Optional[List[torch.nn.Module]] = None
        #: the step whose policy the reference copies (0: the starting weights, ``init_from``'s)
        self.reference_synced_at = 0
        self._per_rank_state_loaded = False
        self._restored_per_rank = False
        self._ctx = None
        self._model: Optional[List[torch.nn.Module]] = None
        self._microbatch = 0
        self._inner = 0
        self._iteration = 0
        self._report_rollout = False
        self._step_start: Optional[float] = None
        self._update_seconds = 0.0

    # -- the seam ----------------------------------------------------------------------------
    def start_checks(self) -> None:
        """The prompts file is readable (``read_prompts``; a malformed row: exit 2 naming file and line)."""
        from dlmspec.backends.megatron.checks import refuse

        core = self.core or default_core(self.config)
        try:
            rows, skipped = core.read_prompts(self.config.prompts, on_error=self.config.prompts_on_error)
        except (OSError, ValueError) as exc:
            refuse(f"stage.rl.prompts: {exc}")
        if not rows:
            refuse(f"stage.rl.prompts: {self.config.prompts} holds no prompt")

    def setup(self, ctx: Any, *, layer_spec: Any, model_kwargs: Dict[str, Any]) -> None:
        """Refuse pipeline parallelism and layers that ignore the prompts' key-padding mask; build
        the rollout engine (the prompts read and tokenised).

        Raises:
            ValueError: what this stage cannot run here.
        """
        from megatron.core import parallel_state

        from dlmspec.backends.megatron.layers import layer_spec_backend, layer_spec_takes_key_padding

        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            raise ValueError("an RL stage samples through one model chunk holding the whole model: "
                             "pipeline_model_parallel_size must be 1")
        if layer_spec_backend(layer_spec) == "transformer_engine" and not layer_spec_takes_key_padding(layer_spec):
            raise ValueError("an RL stage left-pads prompts of different lengths and hides the padding with a key-padding "
                             "mask, which this Transformer Engine layer spec ignores: use dlmspec's build_layer_spec "
                             "(its TE layers apply it) or use_transformer_engine=False")
        self.start_checks()
        run = self.run
        self._ctx = ctx
        self._tp = parallel_state.get_tensor_model_parallel_world_size()
        resources = ctx.resources
        schedule = None
        if self.config.diffusion:
            from dlmspec import objectives

            try:
                schedule = objectives.get(run.objective.kind).schedule(run.objective)
            except (AttributeError, TypeError, ValueError):
                schedule = None
        eos = run.data.eod_id
        self.engine = RolloutEngine(
            self.config, tokenizer=self.tokenizer if self.tokenizer is not None else resources.tokenizer, mask_id=run.objective.mask_token_id, eos_id=eos,
            pad_id=eos if eos is not None else 0, seed=run.seed, rank=ctx.data_parallel_rank,
            ranks=ctx.data_parallel_size, micro_batch_size=run.schedule.micro_batch_size, device=ctx.device,
            core=self.core, noise_schedule=schedule)
        if ctx.data_parallel_rank == 0 and os.environ.get("RANK", "0") in ("", "0"):
            print(f"rl: {len(self.engine.rows)} prompts ({self.engine.skipped} malformed rows skipped), "
                  f"{self.config.algorithm} with the {self.config.estimator_name} estimator", flush=True)
            print(row_length_line(self.engine, run.data.seq_length), flush=True)

    def build_data(self, *, consumed_samples: int, num_chunks: int) -> Any:
        """A training feed over the rollout batch in use; no validation feed (held-out accuracy is
        ``dlmspec eval``'s)."""
        from dlmspec.backends.megatron.microbatches import MicrobatchFeed
        from dlmspec.backends.megatron.rng import TRAIN_STREAM

        return StageData(train=MicrobatchFeed(_RolloutRows(self), num_chunks, TRAIN_STREAM), valid=None)

    def prepare_model(self, model: List[torch.nn.Module]) -> str:
        """Keep the policy; build the frozen reference (``grpo_kl_beta > 0``) as a copy of the
        loaded policy (the ``init_from`` weights at the start) through the model factory."""
        self._model = model
        if self.config.grpo_kl_beta > 0:
            self.reference = self._ctx.resources.model_factory.frozen_copy(model)
        return f"{self.config.estimator_name} estimator"

    def _eval_logits(self, chunk: torch.nn.Module) -> Callable[..., Tensor]:
        from dlmspec.backends.generate.models import gpt_logits_fn

        return gpt_logits_fn(chunk, tensor_model_parallel_size=self._tp)

    def before_step(self, iteration: int, model: List[torch.nn.Module]) -> None:
        """A new rollout batch every ``grpo_iterations`` steps (policy in eval mode, no gradients);
        the reference refreshed every ``ref_model_sync_steps``; the samples file at its interval."""
        now = time.perf_counter()
        if self._step_start is not None:
            self._update_seconds = now - self._step_start
        c = self.config
        self._iteration = iteration
        if self.reference is not None and c.ref_model_sync_steps and iteration > 0 \
                and iteration % c.ref_model_sync_steps == 0:
            self._ctx.resources.model_factory.copy_weights(model, self.reference)
            self.reference_synced_at = iteration
        self._inner = iteration % c.grpo_iterations
        if self.rollout is None or self._inner == 0:  # a resume between inner iterations keeps its rollouts
            chunk = model[0]
            chunk.eval()
            try:
                policy = _no_grad(_training_logits(chunk, self._tp))
                reference = _no_grad(_training_logits(self.reference[0], self._tp)) if self.reference else None
                self.rollout = self.engine.rollout(self._eval_logits(chunk), policy_fn=policy, reference_fn=reference)
            finally:
                chunk.train()
            self._report_rollout = True
            interval = c.sample_log_interval
            if interval and self.rollout.index % interval == 0 and self._first_rank():
                write_samples(self.run.logging.run_dir, self.rollout.samples, iteration)
        self._microbatch = 0
        self._step_start = time.perf_counter()

    def _first_rank(self) -> bool:
        return self._ctx.data_parallel_rank == 0 and os.environ.get("RANK", "0") in ("", "0")

    def _next_microbatch(self) -> Dict[str, Any]:
        m = self.run.schedule.micro_batch_size
        start = self._microbatch * m
        if self.rollout is None or start >= self.rollout.rows:
            raise StopIteration
        index = self._microbatch
        self._microbatch += 1
        report_rollout = self._report_rollout and index == 0
        if report_rollout:
            self._report_rollout = False
        return {"start": start, "stop": start + m, "index": index, "rollout": report_rollout}

    def forward_step(self, data_iterator: Iterator[Any], model: torch.nn.Module):
        """``(log-probabilities [m, T], loss_func)`` of the next microbatch of rollout rows."""
        item = next(data_iterator)
        b = item.batch
        rows = slice(int(b["start"]), int(b["stop"]))
        logits = _training_logits(model, self._tp)
        loss, stats = self.engine.loss(logits, self.rollout, rows, self._inner, int(b["index"]))
        kept = int(self.rollout.keep[rows].sum())
        extra = {}
        if b["rollout"]:
            vector = self.rollout.stats.vector()
            extra[ROLLOUT_REPORT] = torch.tensor(vector, dtype=torch.float32, device=loss.device)
        extra["rl update seconds"] = torch.tensor([self._update_seconds if int(b["index"]) == 0 else 0.0],
                                                  device=loss.device)
        return loss, functools.partial(_rl_loss_func, stats, kept, extra)

    def reduce_reports(self, reports: List[Any], device: torch.device) -> Dict[str, Tensor]:
        """Every report summed over microbatches and data-parallel ranks; a rank that made no
        rollout this step adds zeros of the rollout report's length (the all-reduce needs the same
        keys on every rank)."""
        length = len(RolloutStats(reward_sums=[0.0] * len(self.config.rewards),
                                  reward_squares=[0.0] * len(self.config.rewards),
                                  reward_counts=[0] * len(self.config.rewards)).vector())
        if not any(isinstance(r, dict) and ROLLOUT_REPORT in r for r in reports):
            reports = list(reports) + [{ROLLOUT_REPORT: torch.zeros(length, device=device)}]
        return sum_reports(reports, device)

    def interval_metrics(self, sums: Dict[str, Tensor]) -> Dict[str, Optional[float]]:
        """``rl/...`` entries: the rollout batches' statistics (:func:`rollout_metrics`) and the
        policy loss's means over microbatches (``rl/kl``, ``rl/clip_fraction``, ``rl/ratio_mean``)."""
        out: Dict[str, Optional[float]] = {}
        roll = sums.get(ROLLOUT_REPORT)
        if roll is not None and float(roll[0]) > 0:
            out.update(rollout_metrics(roll.tolist(), [f for f, _ in self.config.rewards]))
        lv = sums.get(LOSS_REPORT)
        if lv is not None and float(lv[0]) > 0:
            n = float(lv[0])
            out["rl/kl"] = float(lv[1]) / n
            out["rl/clip_fraction"] = float(lv[2]) / n
            out["rl/ratio_mean"] = float(lv[3]) / n
            out["rl/rows_trained"] = float(lv[4])
        up = sums.get("rl update seconds")
        if up is not None:
            out["rl/update_seconds"] = float(up.sum())
        return out

    def samples_consumed(self, iteration: int) -> int:
        """Prompts: ``grpo_prompts_per_step`` on the step that rolled out, else 0."""
        return self.config.grpo_prompts_per_step if iteration % self.config.grpo_iterations == 0 else 0

    def state_dict(self) -> Dict[str, Any]:
        """This rank's state: the rollout engine's (:meth:`RolloutEngine.state_dict`) and the
        rollout batch in use. The reference model is in :meth:`sharded_state_dict`."""
        if self.engine is None:
            return {}
        return {"engine": self.engine.state_dict(), "rollout": None if self.rollout is None else self.rollout.state()}

    def _reference_weights_kept(self) -> bool:
        """Whether checkpoints keep the reference's weights: after its first refresh, or always
        without ``checkpoint.init_from`` (nothing else to rebuild it from)."""
        return self.reference_synced_at > 0 or not self.run.checkpoint.init_from

    def _reference_template(self) -> Dict[str, Any]:
        """The reference chunks' megatron-core sharded state dicts (``{"chunk<i>": ...}``): the
        module names as the policy's (so ``load_state_dict`` takes what a load returns), every
        checkpoint key under :func:`reference_prefix` (megatron-core's ``add_prefix_for_sharding``,
        which renames the ``ShardedTensor`` keys only)."""
        from megatron.core.dist_checkpointing.utils import add_prefix_for_sharding
        from megatron.core.utils import unwrap_model

        n, out = len(self.reference), {}
        for i, chunk in enumerate(self.reference):
            state = unwrap_model(chunk).sharded_state_dict()
            add_prefix_for_sharding(state, reference_prefix(i, n))
            out[f"chunk{i}"] = state
        return out

    def sharded_state_dict(self) -> Dict[str, Any]:
        """With a reference model: ``reference_synced_at`` (the step of its last refresh; 0: the
        starting weights), ``reference_saved`` and, when saved (:meth:`_reference_weights_kept`),
        ``reference``: its chunks' ``sharded_state_dict`` under the key prefix
        :data:`REFERENCE_PREFIX` (megatron-core distributed checkpointing, written beside the
        policy's tensors: any TP/PP/DP layout reads it back). ``{}`` without a reference."""
        if self.reference is None:
            return {}
        saved = self._reference_weights_kept()
        state: Dict[str, Any] = {"reference_synced_at": int(self.reference_synced_at), "reference_saved": saved}
        if saved:
            state["reference"] = self._reference_template()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if not state or self.engine is None:
            return
        self.engine.load_state_dict(state["engine"])
        if self.reference is not None:
            self._per_rank_state_loaded = True
            if "reference_synced_at" in state:  # the per-rank record of earlier versions
                self._restore_reference_per_rank(state)
        if state.get("rollout") is not None:
            r = Rollout.from_state(state["rollout"])
            device = self._ctx.device
            self.rollout = dataclasses.replace(
                r, tokens=r.tokens.to(device), attention=None if r.attention is None else r.attention.to(device),
                completion_mask=r.completion_mask.to(device), advantages=r.advantages.to(device),
                keep=r.keep.to(device),
                old_logp=move_logps(r.old_logp, device), ref_logp=move_logps(r.ref_logp, device))

    def load_sharded_state_dict(self, common: Optional[Dict[str, Any]],
                                load: Callable[[Dict[str, Any]], Dict[str, Any]], *, checkpoint: str,
                                iteration: int) -> None:
        """The reference of an uninterrupted run at the resumed step (module docstring): the saved
        weights (resharded to this run's layout), else ``init_from``'s when it was not refreshed
        since the start. A checkpoint of the per-rank format (no ``reference_synced_at`` in
        ``common``) was restored by :meth:`load_state_dict` in its own layout; in another layout
        its reference is reloaded from ``init_from`` when it had not been refreshed, else refused.

        Raises:
            SystemExit: code 2 (:func:`~dlmspec.backends.megatron.checks.refuse`) for a per-rank
                reference resumed in another layout, or recorded weights that cannot be read
                (:meth:`_read_reference`): the message names the checkpoint and the fix.
            ValueError: the saved weights do not fit the reference (other names or shapes).
        """
        if self.reference is None:
            return
        if common is not None and "reference_synced_at" in common:
            self.reference_synced_at = int(common["reference_synced_at"])
            if common.get("reference_saved"):
                self._load_reference(self._read_reference(load, checkpoint))
            else:
                self._reload_reference_from_init_from(checkpoint)
            return
        if self._restored_per_rank:
            return
        if self._per_rank_state_loaded:  # same layout, but no record of the reference at all
            if self._first_rank():
                print("rl: this checkpoint does not record the reference model; it is a copy of the loaded policy "
                      "until its next refresh", flush=True)
            return
        sync = int(self.config.ref_model_sync_steps or 0)
        # refreshed before step ``k x sync`` (before_step), after the checkpoint of step ``k x sync``
        refreshed = bool(sync) and iteration > sync
        if refreshed or not self.run.checkpoint.init_from:
            from dlmspec.backends.megatron.checks import refuse

            refuse(f"{checkpoint}: this checkpoint keeps the RL reference model's weights per rank (the format of "
                   "earlier dlmspec versions), which a resume into another parallel layout cannot read"
                   + (f" (refreshed at step {(iteration - 1) // sync * sync})" if refreshed else "")
                   + f". Fix: resume it once with the parallel layout it was saved with (parallel_layout in "
                   f"{os.path.join(checkpoint, CHECKPOINT_RECORD)}) and let it save a checkpoint (checkpoints now keep "
                   "the reference as a sharded state that any layout reads), then resume that one in the new layout")
        self.reference_synced_at = 0
        self._reload_reference_from_init_from(checkpoint)

    def _read_reference(self, load: Callable[[Dict[str, Any]], Dict[str, Any]], checkpoint: str) -> Dict[str, Any]:
        """The reference's saved weights (``load`` of :meth:`_reference_template`).

        Raises:
            SystemExit: code 2 when the checkpoint records them but they cannot be read (missing
                keys, other shapes, a truncated file): the message names the checkpoint and the fix.
            CheckpointRefused: a checkpoint file that could run code (as the policy's load).
        """
        from torch.distributed.checkpoint.api import CheckpointException

        from dlmspec.backends.checkpoint_safety import CheckpointRefused
        from dlmspec.backends.megatron.checkpointing import _error_line
        from dlmspec.backends.megatron.checks import refuse

        try:
            return load({"reference": self._reference_template()})["reference"]
        except CheckpointRefused:
            raise
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - torch's is a BaseException
            refuse(f"{checkpoint}: the checkpoint records the RL reference model's weights (rl_reference.*, "
                   f"reference_saved in its common.pt) but they cannot be read: {_error_line(exc)}. Fix: resume from "
                   f"the checkpoint before it (write that folder's name into {os.path.dirname(checkpoint)}/latest), or "
                   "copy this checkpoint again if it was copied")
            raise  # refuse() exits

    def _load_reference(self, loaded: Dict[str, Any]) -> None:
        """Copy the loaded sharded state dicts (``{"chunk<i>": state}``) into the reference chunks.

        Raises:
            ValueError: another number of chunks; (``load_state_dict``, strict) other weights.
        """
        from megatron.core.utils import unwrap_model

        if len(loaded) != len(self.reference):
            raise ValueError(f"the checkpoint holds {len(loaded)} reference chunk(s), the run {len(self.reference)}")
        with torch.no_grad():
            for i, chunk in enumerate(self.reference):
                unwrap_model(chunk).load_state_dict(loaded[f"chunk{i}"], strict=True)

    def _restore_reference_per_rank(self, state: Dict[str, Any]) -> None:
        """The reference of a checkpoint of the per-rank format (earlier versions, same layout):
        the rank's saved tensors, else ``init_from``'s weights when not refreshed since the start.

        Raises:
            ValueError: the saved weights do not fit the reference (other names or shapes).
        """
        self.reference_synced_at = int(state["reference_synced_at"])
        self._restored_per_rank = True
        saved = state.get("reference")
        if saved is not None:
            if len(saved) != len(self.reference):
                raise ValueError(f"the checkpoint holds {len(saved)} reference chunk(s), the run {len(self.reference)}")
            with torch.no_grad():
                for chunk, weights in zip(self.reference, saved):
                    _load_tensor_state(chunk, weights)
            return
        self._reload_reference_from_init_from()

    def _reload_reference_from_init_from(self, checkpoint: Optional[str] = None) -> None:
        """The reference's weights read again from ``checkpoint.init_from``
        (:func:`~dlmspec.backends.megatron.init_from.initialize_from`).

        Raises:
            SystemExit: code 2 when this run sets no ``checkpoint.init_from`` (the message names
                ``checkpoint``, the one resumed, and the fix).
        """
        from dlmspec.backends.megatron.checks import refuse
        from dlmspec.backends.megatron.init_from import default_cache_dir, initialize_from

        ckpt, factory = self.run.checkpoint, self._ctx.resources.model_factory
        if not ckpt.init_from:
            refuse(f"{checkpoint or 'the checkpoint resumed'}: its RL reference model is checkpoint.init_from's "
                   "weights (not refreshed since the start, so not saved), and this run sets no "
                   "checkpoint.init_from. Fix: set checkpoint.init_from to the value the run started with (in the "
                   "checkpoint's spec.lock.toml) and compile again")
        initialize_from(ckpt.init_from, model=self.reference,
                        cache_dir=ckpt.init_cache_dir or default_cache_dir(ckpt.save_dir, self.run.logging.run_dir),
                        transformer_config=factory.transformer_config, model_kwargs=factory.model_kwargs)

    def checkpoint_metadata(self) -> Dict[str, Any]:
        """``{"objective": ..., "rl": <RLConfig as a dict>}``."""
        return {"objective": dataclasses.asdict(self.run.objective), "rl": dataclasses.asdict(self.config)}


def _load_tensor_state(chunk: torch.nn.Module, weights: Dict[str, Tensor]) -> None:
    """Copy ``weights`` (a per-rank checkpoint's reference chunk: the tensors of the chunk's
    unwrapped ``state_dict`` by name, non-tensor entries left out) into ``chunk``'s tensors of the
    same names.

    Raises:
        ValueError: a tensor of ``chunk`` is missing from ``weights``, or a shape differs.
    """
    from megatron.core.utils import unwrap_model

    own = {k: v for k, v in unwrap_model(chunk).state_dict().items() if isinstance(v, Tensor)}
    missing = sorted(set(own) - set(weights))
    if missing:
        raise ValueError(f"the checkpoint's reference weights lack {missing[:3]} ({len(missing)} tensors)")
    for name, target in own.items():
        if tuple(weights[name].shape) != tuple(target.shape):
            raise ValueError(f"reference weight {name}: shape {tuple(weights[name].shape)} in the checkpoint, "
                             f"{tuple(target.shape)} in the run")
        target.copy_(weights[name].to(target.device, target.dtype))


def _no_grad(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Tensor:
        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapped


def _rl_loss_func(stats: Dict[str, float], kept: int, extra: Dict[str, Tensor], loss: Tensor):
    """megatron's loss triple of a microbatch: ``(loss x 1, 1 microbatch, reports)`` so the step's
    loss is the mean of its microbatches' normalised losses (``calculate_per_token_loss``:
    megatron divides by the summed ``num_tokens``)."""
    one = torch.ones((), device=loss.device, dtype=torch.int)
    report = {LM_LOSS: torch.stack([loss.detach().float(), one.float()]),
              LOSS_REPORT: torch.tensor([1.0, float(stats.get("kl", 0.0)), float(stats.get("clip_fraction", 0.0)),
                                         float(stats.get("ratio_mean", 1.0)), float(kept)], device=loss.device),
              **extra}
    return loss, one, report


def row_length_line(engine: Any, seq_length: int) -> str:
    """The job's start line on its rollout rows: the longest rendered prompt plus ``gen_length``
    against ``train.seq_length`` (the row length ``dlmspec plan`` priced, the model's
    ``max_sequence_length``), with what to set when a row is longer."""
    prompt = max(len(ids) for ids in engine.prompt_ids)
    gen_length = int(engine.config.generate.get("gen_length", 0))
    longest = prompt + gen_length
    line = (f"rl: longest rollout row {longest} positions (prompt {prompt} + gen_length {gen_length}), "
            f"train.seq_length {seq_length}")
    if longest > seq_length:
        line += (f"; rows are longer than the plan priced (and than max_sequence_length): "
                 f"set train.seq_length = {longest}")
    return line


def register() -> None:
    """Make :class:`RLStage` the runtime stage of ``[stage] kind = "rl"``."""
    from dlmspec.backends.megatron.stages import register_stage

    register_stage("rl", RLStage)


register()

