"""Supervised fine-tuning: conversations padded or packed to ``seq_length``, with response masks.

The data is what ``dlmspec data prepare --sft`` writes (the contract: docs/ and
``dlmspec/data/record.py``): an indexed dataset of one document per conversation (its last token
the EOD) and, at ``PREFIX_response``, a ``uint8`` indexed dataset of the same lengths, 1 on
supervised (response) tokens. :class:`SftDataset` turns it into samples of ``seq_length``
positions; :class:`SftStage` trains on them with the run's objective, prompts never masked and
never in the loss (LLaDA, Nie et al. 2025, sec. 2.3; AR: next-token loss on response tokens).

* ``packed_sequence = False`` (pad): one conversation per sample, followed by EOS padding. The
  first ``pad_eos_tokens`` padding EOS count as response (``None``: all of them, LLaDA's choice:
  a masked-diffusion model fills its fixed generation length with EOS, so it must learn to); the
  unsupervised rest is a segment of its own, hidden from the conversation by an attention mask.
* ``packed_sequence = True`` (pack): conversations back to back (greedy, in a seeded order), each
  its own segment with position ids from 0; the tail padding is one more segment and never
  supervised. Attention never crosses segments (:func:`segment_attention_mask`): local layers
  only (the Transformer Engine path ignores masks: refused).
* Over-long conversations (more tokens than a sample holds) are skipped or truncated
  (``over_long``), counted either way (:attr:`SftDataset.stats`).

Samples are ``{"tokens", "labels", "loss_mask", "position_ids", "segment_ids"}`` of ``[s]``
(``labels`` are the next tokens for AR, the tokens themselves for MDM; ``loss_mask`` is the
supervised mask aligned with ``labels``). Pure numpy / torch on CPU except
:class:`SftStage`, which runs inside the loop.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.transformer.spec_utils import ModuleSpec

from dlmspec import objectives

from .checks import refuse
from .config import ObjectiveConfig, RunConfig
from .data import batch_to_device
from .layers import layer_spec_backend
from .microbatches import MicrobatchItem
from .objective import ObjectiveBatch, ObjectiveRng, apply_loss_normalization
from .rng import masking_generator
from .stage import ObjectiveForwardStep, PretrainStage, StageContext, StageData, stage_feeds

#: ``stage.sft.over_long``: what happens to a conversation longer than a sample.
OVER_LONG = ("skip", "truncate")
#: Suffix of the response-mask dataset beside ``PREFIX`` (the SFT data contract).
RESPONSE_SUFFIX = "_response"


@dataclass(frozen=True)
class SftConfig:
    """``[stage.sft]`` as the runtime reads it.

    Attributes:
        packed_sequence: Pack several conversations into a sample (document masks, local
            layers) instead of one conversation and EOS padding per sample.
        over_long: ``"skip"`` or ``"truncate"`` a conversation longer than a sample (counted).
        pad_eos_tokens: Padding EOS after a conversation that count as response (pad layout):
            ``None`` all of them, ``0`` none (the conversation's own EOD, supervised by its
            response mask, still is). Packing leaves no padding inside a sample: it has no effect
            there (the tail padding of a pack is never supervised).
        mask_prompt: Prompts carry no loss and are never masked (``False``: every token of the
            conversation is supervised).
    """

    packed_sequence: bool = False
    over_long: str = "skip"
    pad_eos_tokens: Optional[int] = None
    mask_prompt: bool = True


def response_prefix(prefix: str) -> str:
    """The response-mask dataset of ``prefix`` (``PREFIX_response``)."""
    return prefix + RESPONSE_SUFFIX


def sft_data_problems(prefixes: Sequence[str]) -> List[str]:
    """What makes SFT data unusable: a missing response dataset, or one whose sequence lengths
    differ from its conversations'. One sentence per problem, naming the files and the fix.

    Args:
        prefixes: The conversation datasets (``PREFIX.bin/.idx`` exist: checked before).
    """
    problems = []
    for prefix in prefixes:
        resp = response_prefix(prefix)
        missing = [resp + s for s in (".bin", ".idx") if not os.path.isfile(resp + s)]
        if missing:
            problems.append(f"{', '.join(missing)}: the response masks of {prefix} are missing (a pre-training "
                            "dataset has none); prepare the data with `dlmspec data prepare --sft`")
            continue
        tokens_ds, resp_ds = IndexedDataset(prefix), IndexedDataset(resp)  # the arrays are views of their maps
        a, b = np.array(tokens_ds.sequence_lengths), np.array(resp_ds.sequence_lengths)
        if len(a) != len(b) or not np.array_equal(a, b):
            problems.append(f"{resp}: its {len(b)} sequence lengths differ from the {len(a)} of {prefix}: they were "
                            "not written together; prepare the data again with `dlmspec data prepare --sft`")
    return problems


def sft_start_checks(run: RunConfig) -> None:
    """:func:`sft_data_problems` of the run's training and validation prefixes, before megatron-core
    starts (``train.py --check`` and :meth:`SftStage.setup`).

    Raises:
        SystemExit: code 2 after the problems on stderr (``train.py: ...``).
    """
    d = run.data
    if d.mock:
        refuse("an SFT stage trains on conversations and their response masks; data.mock = true is pre-training "
               "data (megatron's MockGPTDataset). Fix: set data.mock = false and data.train to `dlmspec data "
               "prepare --sft` output")
    problems = sft_data_problems([p for p, _ in (d.blend or []) + (d.valid_blend or [])])
    if problems:
        refuse("the SFT data cannot be trained on:\n  " + "\n  ".join(problems))


@dataclass
class SftStats:
    """What :class:`SftDataset` made of its conversations.

    Attributes:
        conversations: Conversations read.
        skipped_over_long, truncated_over_long: Over-long ones skipped / truncated.
        samples: Distinct samples (conversations, or packs).
        tokens: Conversation tokens in the samples; ``positions`` their positions (padding
            included): ``1 - tokens / positions`` is the padding waste.
    """

    conversations: int = 0
    skipped_over_long: int = 0
    truncated_over_long: int = 0
    samples: int = 0
    tokens: int = 0
    positions: int = 0

    def line(self) -> str:
        """One line for the console."""
        waste = 1.0 - self.tokens / max(1, self.positions)
        return (f"{self.conversations} conversations -> {self.samples} samples; over-long: "
                f"{self.skipped_over_long} skipped, {self.truncated_over_long} truncated; padding {waste:.1%}")


class Conversations:
    """Conversations and their response masks, read lazily (one document each).

    Args:
        documents: In-memory ``[(tokens, response), ...]`` numpy arrays of equal lengths, or
            ``None`` with ``prefixes``.
        prefixes: Indexed datasets (and ``PREFIX_response``), kept open (memory-mapped) while
            this object lives.
        split: ``(start, end)`` fractions of each prefix's documents (a ``data.split``
            carve-out), default all.

    Raises:
        ValueError: a conversation whose response mask has another length.
    """

    def __init__(self, documents: Optional[Sequence[Tuple[np.ndarray, np.ndarray]]] = None, *,
                 prefixes: Sequence[str] = (), split: Optional[Tuple[float, float]] = None) -> None:
        self._docs = list(documents) if documents is not None else None
        self._sources: List[Tuple[IndexedDataset, IndexedDataset]] = []
        sources: List[np.ndarray] = []  # per conversation: its prefix and its document there
        documents_of: List[np.ndarray] = []
        lengths: List[np.ndarray] = []
        if self._docs is not None:
            for tokens, response in self._docs:
                if len(tokens) != len(response):
                    raise ValueError(f"a conversation has {len(tokens)} tokens and {len(response)} response flags")
            lengths.append(np.array([len(t) for t, _ in self._docs], dtype=np.int64))
        for prefix in prefixes:
            tokens, resp = IndexedDataset(prefix), IndexedDataset(response_prefix(prefix))
            n = len(tokens)
            lo, hi = (0, n) if split is None else (int(round(split[0] * n)), int(round(split[1] * n)))
            sources.append(np.full(hi - lo, len(self._sources), dtype=np.int32))
            documents_of.append(np.arange(lo, hi, dtype=np.int64))
            lengths.append(np.array(tokens.sequence_lengths[lo:hi], dtype=np.int64))
            self._sources.append((tokens, resp))
        self.lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        self._source = np.concatenate(sources) if sources else np.zeros(0, dtype=np.int32)
        self._document = np.concatenate(documents_of) if documents_of else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(len(self.lengths))

    def __getitem__(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
        if self._docs is not None:
            tokens, response = self._docs[i]
        else:
            source, doc = self._sources[int(self._source[i])], int(self._document[i])
            tokens, response = source[0][doc], source[1][doc]
        return np.array(tokens, dtype=np.int64), np.array(response, dtype=bool)


class SftDataset(torch.utils.data.Dataset):
    """Conversations (and their response masks) as samples of ``seq_length`` positions.

    Args:
        conversations: :class:`Conversations` (or a list of ``(tokens, response)`` arrays).
        seq_length: Positions per sample.
        eod_id: The padding (EOS/EOD) id.
        autoregressive: AR samples hold ``seq_length + 1`` tokens (inputs and shifted labels).
        config: :class:`SftConfig`.
        num_samples: Length of the dataset (epochs are reshuffled: sample ``i`` is
            ``order(i // n)[i % n]``); default: the distinct samples.
        seed: Order of the packs and of each epoch.

    Raises:
        ValueError: an unknown ``over_long``, a negative ``pad_eos_tokens``, or no conversation left.
    """

    def __init__(self, conversations, *, seq_length: int, eod_id: int, autoregressive: bool, config: SftConfig,
                 num_samples: Optional[int] = None, seed: int = 1234) -> None:
        if config.over_long not in OVER_LONG:
            raise ValueError(f"stage.sft.over_long must be one of {OVER_LONG}, got {config.over_long!r}")
        if config.pad_eos_tokens is not None and config.pad_eos_tokens < 0:
            raise ValueError(f"stage.sft.pad_eos_tokens must be >= 0 or None, got {config.pad_eos_tokens}")
        if not isinstance(conversations, Conversations):
            conversations = Conversations(conversations)
        self.seq_length, self.eod_id, self.config, self.seed = int(seq_length), int(eod_id), config, int(seed)
        self.autoregressive = bool(autoregressive)
        self.capacity = self.seq_length + (1 if autoregressive else 0)
        self.conversations = conversations
        lengths = conversations.lengths
        over = lengths > self.capacity
        self.stats = SftStats(conversations=len(lengths))
        if config.over_long == "skip":
            self.stats.skipped_over_long = int(over.sum())
            kept = np.flatnonzero(~over)
        else:
            self.stats.truncated_over_long = int(over.sum())
            kept = np.arange(len(lengths))
        if len(kept) == 0:
            raise ValueError(f"no conversation fits seq_length {self.seq_length} (all {len(lengths)} are longer; "
                             "stage.sft.over_long = 'truncate' keeps them cut)")
        used_lengths = np.minimum(lengths, self.capacity)
        if config.packed_sequence:
            order = kept[np.random.RandomState(self.seed).permutation(len(kept))]
            self._samples: List[List[int]] = []
            current, used = [], 0
            for i in order:
                n = int(used_lengths[i])
                if current and used + n > self.capacity:
                    self._samples.append(current)
                    current, used = [], 0
                current.append(int(i))
                used += n
            self._samples.append(current)
        else:
            self._samples = [[int(i)] for i in kept]
        self.stats.samples = len(self._samples)
        self.stats.tokens = int(np.minimum(used_lengths[kept], self.seq_length).sum())
        self.stats.positions = self.stats.samples * self.seq_length
        self.num_samples = int(num_samples) if num_samples is not None else len(self._samples)
        self._epoch_orders: Dict[int, np.ndarray] = {}

    @classmethod
    def from_prefixes(cls, prefixes: Sequence[str], *, split: Optional[Tuple[float, float]] = None,
                      **kwargs: Any) -> "SftDataset":
        """The conversations of ``prefixes`` (:class:`Conversations`); ``kwargs`` the constructor's."""
        return cls(Conversations(prefixes=prefixes, split=split), **kwargs)

    def __len__(self) -> int:
        return self.num_samples

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._epoch_orders:
            self._epoch_orders[epoch] = np.random.RandomState((self.seed + 7919 * (epoch + 1)) % 2**32).permutation(
                len(self._samples))
        return self._epoch_orders[epoch]

    def sample(self, k: int) -> Dict[str, Tensor]:
        """Distinct sample ``k`` (``0 <= k < stats.samples``), before any epoch order."""
        cap, eod, cfg = self.capacity, self.eod_id, self.config
        tokens = np.full(cap, eod, dtype=np.int64)
        sup = np.zeros(cap, dtype=bool)
        seg = np.zeros(cap, dtype=np.int64)
        pos = np.arange(cap, dtype=np.int64)
        at = 0
        for j, doc in enumerate(self._samples[k]):
            t, r = self.conversations[doc]
            t, r = t[: cap], r[: cap]
            n = len(t)
            tokens[at:at + n] = t
            sup[at:at + n] = r if cfg.mask_prompt else True
            seg[at:at + n] = j
            pos[at:at + n] = np.arange(n)
            at += n
        rest = cap - at
        if rest:
            if cfg.packed_sequence:
                seg[at:] = len(self._samples[k])  # the tail: its own segment, never supervised
                pos[at:] = np.arange(rest)
            else:
                n_sup = rest if cfg.pad_eos_tokens is None else min(rest, cfg.pad_eos_tokens)
                sup[at:at + n_sup] = True
                # unsupervised padding after a causal model's response is never attended by it: one segment
                seg[at + n_sup:] = 0 if self.autoregressive else 1
        s = self.seq_length
        if self.autoregressive:
            # the prediction at i is of token i + 1, within its own segment
            labels = tokens[1:]
            loss_mask = sup[1:] & (seg[1:] == seg[:-1])
        else:
            labels, loss_mask = tokens[:s], sup[:s]
        return {
            "tokens": torch.from_numpy(tokens[:s].copy()),
            "labels": torch.from_numpy(np.ascontiguousarray(labels)),
            "loss_mask": torch.from_numpy(loss_mask.astype(np.float32)),
            "position_ids": torch.from_numpy(pos[:s].copy()),
            "segment_ids": torch.from_numpy(seg[:s].copy()),
        }

    def __getitem__(self, idx: int) -> Dict[str, Tensor]:
        n = len(self._samples)
        return self.sample(int(self._order(int(idx) // n)[int(idx) % n]))


def segment_attention_mask(segment_ids: Tensor, *, dense: Optional[bool] = None) -> Optional[Tensor]:
    """``[b, 1, s, s]`` bool, ``True`` where query ``i`` may not attend key ``j`` (another segment:
    megatron's convention, as :func:`~dlmspec.backends.megatron.data.document_attention_mask`);
    ``None`` when every row is one segment (dense attention). ``dense`` tells that without
    looking (e.g. decided on the CPU copy of the batch, so no device sync is needed)."""
    if dense is None:
        dense = bool((segment_ids == segment_ids[:, :1]).all())
    if dense:
        return None
    return (segment_ids.unsqueeze(2) != segment_ids.unsqueeze(1)).unsqueeze(1)


def needs_attention_mask(config: SftConfig, objective_kind: str) -> bool:
    """Whether SFT batches can carry an attention mask (then the local layers are needed): packs,
    or masked-diffusion padding that is partly unsupervised (``pad_eos_tokens`` not ``None``)."""
    return config.packed_sequence or objectives.get(objective_kind).unsupervised_padding_segment(config.pad_eos_tokens)


class SftForwardStep(ObjectiveForwardStep):
    """:class:`~dlmspec.backends.megatron.stage.ObjectiveForwardStep` on SFT batches: the
    objective noises (MDM) or weights (AR) the supervised positions only, the loss is normalised
    by ``loss_normalization`` over them, and segments never attend each other."""

    def prepare(self, item: MicrobatchItem) -> Tuple[ObjectiveBatch, Tensor, Optional[Tensor]]:
        """``(objective_batch, position_ids, attention_mask)`` of an SFT microbatch."""
        batch = batch_to_device(item.batch, self.device)
        tokens, supervised = batch["tokens"], batch["loss_mask"]
        generator = masking_generator(self.seed, item.iteration, self.data_parallel_rank, item.index,
                                      stream=item.stream, device=self.device)
        ob = self.objective.prepare({"tokens": tokens, "labels": batch["labels"], "loss_mask": supervised},
                                    ObjectiveRng(generator))
        ob = apply_loss_normalization(ob, self.loss_normalization, context_parallel_size=self.context_parallel_size)
        cpu_segments = item.batch["segment_ids"]  # decided on the host copy: no device sync
        dense = bool((cpu_segments == cpu_segments[:, :1]).all())
        segments = segment_attention_mask(batch["segment_ids"], dense=dense)
        if ob.input_ids.shape != tokens.shape:
            # an objective that widens the input (block diffusion's x_t (+) x_0) brings its own position
            # ids and mask object; its rules refuse segment masks (packed sequences)
            if segments is not None:
                raise ValueError(f"objective {self.objective.kind!r} takes no segment masks: use "
                                 "stage.sft.packed_sequence = false")
            return self.slice_for_context_parallel(ob, ob.position_ids, ob.attention_mask)
        return self.slice_for_context_parallel(ob, batch["position_ids"], segments)


class SftStage(PretrainStage):
    """Supervised fine-tuning (see the module docstring): :class:`SftDataset` batches, the run's
    objective on response tokens, ``train.loss_normalization`` (the compiler's SFT default for
    MDM is ``"sequence"``: each response's mean, LLaDA's per-sample normalisation).

    Args:
        run: The run's settings (``objective.variable_length_prob`` is not applied: SFT cuts
            nothing).
        sft: :class:`SftConfig`.
    """

    def __init__(self, run: RunConfig, sft: Optional[SftConfig] = None) -> None:
        super().__init__(run, sft)
        self.sft = sft if sft is not None else SftConfig()
        self.stats: Optional[SftStats] = None

    def start_checks(self) -> None:
        """The response datasets beside each prefix, of the same lengths (:func:`sft_start_checks`).

        Raises:
            SystemExit: code 2 when they are missing or do not match (:func:`sft_data_problems`).
        """
        sft_start_checks(self.run)

    def objective_config(self) -> ObjectiveConfig:
        """The run's objective without what SFT never applies: no variable-length cut, no
        MegaDLMs window."""
        return dataclasses.replace(self.run.objective, variable_length_prob=0.0, variable_length="sequence",
                                   unshift=False)

    def check_layers(self, ctx: StageContext, objective: Any, layer_spec: ModuleSpec) -> None:
        """Segment masks (:func:`needs_attention_mask`) need the local layers and no context parallelism.

        Raises:
            ValueError: attention masks on the Transformer Engine path or under context parallelism.
        """
        if needs_attention_mask(self.sft, objective.kind):
            what = ("stage.sft.packed_sequence = true" if self.sft.packed_sequence
                    else "stage.sft.pad_eos_tokens with a masked-diffusion objective")
            if layer_spec_backend(layer_spec) == "transformer_engine":
                raise ValueError(f"{what} passes attention masks: it needs the local+sdpa layer spec "
                                 "(use_transformer_engine=False)")
            if ctx.context_parallel_size > 1:
                raise ValueError(f"{what} passes attention masks, which context parallelism cannot take: "
                                 "use context_parallel_size=1")

    def kind_of(self, objective: Any) -> str:
        """``"sft-<objective kind>"``."""
        return f"sft-{objective.kind}"

    def make_forward_step(self, objective: Any, ctx: StageContext) -> SftForwardStep:
        """:class:`SftForwardStep`: response tokens only, segment masks, no cut."""
        run = self.run
        return SftForwardStep(
            objective, seed=run.seed, data_parallel_rank=ctx.data_parallel_rank, eod_id=run.data.eod_id,
            device=ctx.device, context_parallel_size=ctx.context_parallel_size,
            loss_normalization=run.objective.loss_normalization,
        )

    def _prefixes(self) -> Tuple[List[str], List[str]]:
        d = self.run.data
        train = [p for p, _ in (d.blend or [])]
        valid = [p for p, _ in (d.valid_blend or [])]
        return train, valid

    def _split(self) -> Tuple[Tuple[float, float], Tuple[float, float]]:
        weights = [float(x) for x in self.run.data.split.replace("/", ",").split(",")][:3]
        weights += [0.0] * (3 - len(weights))
        total = sum(weights) or 1.0
        a = weights[0] / total
        return (0.0, a), (a, a + weights[1] / total)

    def datasets(self, train_samples: int, valid_samples: int) -> Tuple[SftDataset, Optional[SftDataset]]:
        """The training and validation :class:`SftDataset` (validation: ``data.valid_blend``, else
        the ``data.split`` share of the training prefixes' documents; ``None`` without samples)."""
        run = self.run
        train_prefixes, valid_prefixes = self._prefixes()
        common = dict(seq_length=run.data.seq_length, eod_id=run.data.eod_id,
                      autoregressive=objectives.get(run.objective.kind).dataset_extra_token(run.objective, "sft"), config=self.sft, seed=run.seed)
        train_split, valid_split = (None, None) if valid_prefixes else self._split()
        train = SftDataset.from_prefixes(train_prefixes, split=train_split, num_samples=train_samples, **common)
        valid = None
        if valid_samples:
            valid = SftDataset.from_prefixes(valid_prefixes or train_prefixes, split=valid_split,
                                             num_samples=valid_samples, **common)
        return train, valid

    def build_data(self, *, consumed_samples: int, num_chunks: int) -> StageData:
        """:meth:`datasets` as this rank's microbatches; prints what the data became (rank 0)."""
        run, sched, ctx = self.run, self.run.schedule, self._ctx
        eval_samples = sched.eval_iters * sched.global_batch_size if sched.eval_interval else 0
        train_ds, valid_ds = self.datasets(sched.train_iters * sched.global_batch_size, eval_samples)
        self.stats = train_ds.stats
        if ctx.data_parallel_rank == 0 and os.environ.get("RANK", "0") in ("", "0"):
            print(f"sft data: {train_ds.stats.line()}", flush=True)
        return stage_feeds(run, ctx, train_ds, valid_ds, consumed_samples=consumed_samples, num_chunks=num_chunks)

    def checkpoint_metadata(self) -> Dict[str, Any]:
        """``{"objective": ..., "sft": <SftConfig as a dict>}``."""
        return {**super().checkpoint_metadata(), "sft": dataclasses.asdict(self.sft)}
