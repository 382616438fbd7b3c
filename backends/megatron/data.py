"""Pre-training data on megatron-core's GPT datasets.

``BlendedMegatronDatasetBuilder`` over indexed ``.bin/.idx`` prefixes (or megatron's
``MockGPTDataset``), Megatron-LM's pre-training sampler (a resume continues where the run
stopped), the checks of the data files made at start, and document attention masks. How packed
documents, labels and attention meet at document boundaries: docs/runtime.md, "Data".
"""

from __future__ import annotations

import os
import stat
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.utils import Split

from dlmspec.backends.megatron.signals import ignore_exit_signals


@dataclass
class DataConfig:
    """Data settings of a run (part of ``RunConfig``).

    Attributes:
        seq_length: Tokens per sample.
        vocab_size: The tokenizer's vocabulary size (before padding); picks the
            on-disk token dtype and bounds mock token ids.
        eod_id: End-of-document token id (documents are packed with it).
        pad_id: Padding id, if the tokenizer has a distinct one.
        mock: Use megatron's ``MockGPTDataset`` instead of files.
        blend: ``[(prefix, weight), ...]`` of indexed datasets (``prefix.bin`` /
            ``prefix.idx``); weights are relative (normalised by megatron) and
            may all be ``None`` to weight by size.
        valid_blend: Separate validation blend; when ``None`` the validation
            split is carved out of ``blend`` by ``split``.
        split: Megatron split string ``"train,valid,test"`` weights, used with
            ``blend`` only.
        reset_position_ids: Restart position ids at each document.
        reset_attention_mask: Restrict attention to the own document (see the
            module docstring).
        eod_mask_loss: AR only: no loss for the prediction made at an EOD input.
        num_workers: DataLoader worker processes per rank.
        cache_dir: Where megatron caches its index files (default: next to the
            data, in ``<dir>/cache``).
        mmap_bin_files: Memory-map the ``.bin`` files.
        max_unique_tokens: ``{prefix: tokens}`` of the ``blend`` datasets whose training split
            is capped (``data.train[].max_unique_tokens``): each trains on the longest prefix of
            whole documents of its split within the cap (:class:`CappedGPTDataset`); ``None``:
            no cap.
    """

    seq_length: int
    vocab_size: int
    eod_id: int
    pad_id: Optional[int] = None
    mock: bool = False
    blend: Optional[List[Tuple[str, Optional[float]]]] = None
    valid_blend: Optional[List[Tuple[str, Optional[float]]]] = None
    split: str = "99,1,0"
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    num_workers: int = 2
    cache_dir: Optional[str] = None
    mmap_bin_files: bool = True
    max_unique_tokens: Optional[Dict[str, int]] = None


class DatasetTokenizer:
    """The token-id facts megatron's GPT datasets read from a tokenizer.

    Text is tokenized offline (into ``.bin/.idx``); during training the datasets
    only need the vocabulary size, the EOD id, the pad id and a stable
    ``unique_identifiers`` (part of megatron's index-cache key).

    Args:
        vocab_size: Tokenizer vocabulary size.
        eod_id: End-of-document id.
        pad_id: Distinct padding id or ``None`` (megatron then uses -1).
        name: Label stored in ``unique_identifiers``.

    Raises:
        ValueError: If ``eod_id`` or ``pad_id`` are outside ``[0, vocab_size)``.
    """

    def __init__(self, vocab_size: int, eod_id: int, pad_id: Optional[int] = None, name: str = "dlmspec"):
        if not 0 <= eod_id < vocab_size:
            raise ValueError(f"eod_id {eod_id} outside [0, {vocab_size})")
        if pad_id is not None and not 0 <= pad_id < vocab_size:
            raise ValueError(f"pad_id {pad_id} outside [0, {vocab_size})")
        self._vocab_size = int(vocab_size)
        self._eod = int(eod_id)
        self._pad = None if pad_id is None else int(pad_id)
        self.name = name

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> "DatasetTokenizer":
        """Read vocab size, EOS (used as EOD) and pad ids from a Hugging Face tokenizer.

        Raises:
            ValueError: If the tokenizer has no EOS token.
        """
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)
        if tok.eos_token_id is None:
            raise ValueError(f"tokenizer {name_or_path} has no eos token to use as EOD")
        pad = tok.pad_token_id if tok.pad_token_id != tok.eos_token_id else None
        return cls(len(tok), tok.eos_token_id, pad, name=str(name_or_path))

    @property
    def vocab_size(self) -> int:
        """Tokenizer vocabulary size (int)."""
        return self._vocab_size

    @property
    def eod(self) -> int:
        """End-of-document id (int)."""
        return self._eod

    @property
    def eos(self) -> int:
        """Same as :attr:`eod` (megatron checks both for pad collisions)."""
        return self._eod

    @property
    def pad(self) -> int:
        """Distinct pad id; raises ``AttributeError`` without one (megatron then uses -1)."""
        if self._pad is None:
            raise AttributeError("tokenizer has no distinct pad id")
        return self._pad

    @property
    def unique_identifiers(self) -> "OrderedDict[str, object]":
        """Stable description, part of megatron's dataset index-cache key."""
        return OrderedDict(
            [("class", "dlmspec.DatasetTokenizer"), ("name", self.name),
             ("vocab_size", self._vocab_size), ("eod", self._eod), ("pad", self._pad)]
        )


def missing_data_files(data: "DataConfig") -> List[str]:
    """The ``PREFIX.bin`` / ``PREFIX.idx`` files of ``data``'s blends that do not exist.

    Checked by :func:`dlmspec.backends.megatron.checks.start_checks` before anything else, so a job whose
    data is not where the spec says fails at once with the paths (``dlmspec validate`` only
    warns: data usually lives on the cluster, not where the spec is written). Relative
    prefixes are relative to the working directory, as megatron-core reads them.

    Returns:
        Missing file paths, in blend order (empty with ``mock`` data).
    """
    if data.mock:
        return []
    missing = []
    for blend in (data.blend or [], data.valid_blend or []):
        for prefix, _weight in blend:
            for suffix in (".bin", ".idx"):
                if not os.path.isfile(prefix + suffix):
                    missing.append(prefix + suffix)
    return missing


#: megatron-core's indexed dataset format (megatron/core/datasets/indexed_dataset.py, 0.16.1):
#: ``.idx`` = magic, version ``<Q`` (1), dtype code ``<B``, sequence count ``<Q``, document-index
#: count ``<Q`` (34 bytes), then int32 sequence lengths, int64 byte pointers into ``.bin``, int64
#: document indices (and, for multimodal data, int8 sequence modes).
INDEX_MAGIC = b"MMIDIDX\x00\x00"
INDEX_HEADER_BYTES = 34
#: ``DType`` codes of megatron-core's ``indexed_dataset.DType``.
INDEX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
                8: np.uint16}
#: ``.bin`` files up to this size are read whole for the token-id range; larger ones are sampled
#: (:data:`SAMPLE_WINDOWS` windows of :data:`SAMPLE_WINDOW_BYTES`, evenly spread, the first at the
#: start and the last at the end of the file), so every rank's check reads at most ~64 MiB a file.
FULL_SCAN_BYTES = 256 * 2**20
SAMPLE_WINDOWS = 64
SAMPLE_WINDOW_BYTES = 2**20
_SCAN_CHUNK_TOKENS = 2**24

_PREPARE_AGAIN = "prepare it again with `dlmspec data prepare`"


@dataclass
class DatasetCheck:
    """What :func:`check_indexed_dataset` found for one ``PREFIX.bin`` / ``PREFIX.idx`` pair.

    Attributes:
        prefix: The dataset prefix.
        problems: One sentence per problem, each naming the file (empty: usable).
        dtype: Token dtype from the ``.idx`` header (``"uint16"``...), ``None`` if unreadable.
        sequences, documents: Counts from the header.
        tokens: Tokens the ``.idx`` describes.
        min_id, max_id: Smallest and largest token id seen (``None`` if not scanned).
        scan: ``"full"``, ``"sampled N windows, B of T bytes"`` or ``"none (...)"``.
        scanned_bytes: Bytes of ``.bin`` read for the id range.
    """

    prefix: str
    problems: List[str] = field(default_factory=list)
    dtype: Optional[str] = None
    sequences: int = 0
    documents: int = 0
    tokens: int = 0
    min_id: Optional[int] = None
    max_id: Optional[int] = None
    scan: str = "none"
    scanned_bytes: int = 0


def _read_at(f, offset: int, count: int, dtype) -> np.ndarray:
    f.seek(offset)
    return np.frombuffer(f.read(count * np.dtype(dtype).itemsize), dtype=dtype, count=count)


def _id_range(bin_path: str, dtype, tokens: int) -> Tuple[int, int, str, int]:
    """``(min, max, scan description, bytes read)`` of the token ids in ``bin_path``."""
    data = np.memmap(bin_path, dtype=dtype, mode="r", shape=(tokens,))
    itemsize = np.dtype(dtype).itemsize
    total = tokens * itemsize
    if total <= FULL_SCAN_BYTES:
        lo, hi = None, None
        for start in range(0, tokens, _SCAN_CHUNK_TOKENS):
            chunk = data[start:start + _SCAN_CHUNK_TOKENS]
            lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
            hi = int(chunk.max()) if hi is None else max(hi, int(chunk.max()))
        return lo, hi, "full", total
    window = max(1, SAMPLE_WINDOW_BYTES // itemsize)
    starts = np.linspace(0, tokens - window, SAMPLE_WINDOWS).astype(np.int64)
    lo, hi = None, None
    for start in starts:
        chunk = data[int(start):int(start) + window]
        lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
        hi = int(chunk.max()) if hi is None else max(hi, int(chunk.max()))
    read = len(starts) * window * itemsize
    return lo, hi, f"sampled {len(starts)} windows, {read} of {total} bytes", read


def check_indexed_dataset(prefix: str, vocab_size: int) -> DatasetCheck:
    """Check that ``prefix.bin`` and ``prefix.idx`` belong together and fit the vocabulary.

    Both files must be regular files (a FIFO or device is refused before it is opened). Reads
    the ``.idx`` header (:data:`INDEX_MAGIC`, version, dtype, counts) and five numbers of its
    arrays (the first and last sequence pointers and document indices, the last length), then
    every entry with :func:`dlmspec.data.index.check_index` (lengths ``>= 0``, pointers the running
    sum of the lengths, document indices monotone within the sequence count: one pass over the
    memory-mapped index, as megatron-core's own reading of it). Then:

    * ``.idx``: magic, version 1, an integer dtype, and exactly the size its header gives
      (34 bytes + 12 per sequence + 8 per document index, or 1 more per sequence for multimodal
      data); smaller is *truncated*;
    * ``.bin``: exactly ``last pointer + last length x itemsize`` bytes (megatron's builder
      writes the tokens back to back): smaller is *truncated*, larger (or not a multiple of the
      dtype's size) means the two files do not belong together or disagree on the dtype;
    * token ids in ``[0, vocab_size)``: no scan when the dtype cannot hold an id outside (e.g.
      ``uint8`` with a vocabulary of 256 or more); ``.bin`` files up to :data:`FULL_SCAN_BYTES`
      are read whole (numpy memmap, in chunks); larger ones are *sampled* (:data:`SAMPLE_WINDOWS`
      windows of :data:`SAMPLE_WINDOW_BYTES`), so an id outside the vocabulary in a large file is
      found only where it is common - e.g. data tokenized with another tokenizer.

    The first structural problem ends the check (later ones would follow from it).

    Args:
        prefix: Dataset path without ``.bin`` / ``.idx`` (both must exist: see
            :func:`missing_data_files`).
        vocab_size: The tokenizer's vocabulary size (``DataConfig.vocab_size``).

    Returns:
        A :class:`DatasetCheck`; ``problems`` is empty for usable data.
    """
    from dlmspec.data.index import IndexInconsistent, check_index
    from dlmspec.files import FileRefused, file_kind

    out = DatasetCheck(prefix=prefix)
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"

    def problem(text: str) -> DatasetCheck:
        out.problems.append(text)
        return out

    for path in (idx_path, bin_path):  # a FIFO would block the open below, a device has no end
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            return problem(f"{path}: {file_kind(mode)}, not a regular file; point the blend at the dataset's files")
    idx_size, bin_size = os.path.getsize(idx_path), os.path.getsize(bin_path)

    with open(idx_path, "rb") as f:
        head = f.read(INDEX_HEADER_BYTES)
        if len(head) < INDEX_HEADER_BYTES:
            return problem(f"{idx_path}: {idx_size} bytes, shorter than megatron-core's {INDEX_HEADER_BYTES}-byte "
                           f"index header (truncated); {_PREPARE_AGAIN}")
        if head[:9] != INDEX_MAGIC:
            return problem(f"{idx_path}: not a megatron-core index (it does not start with {INDEX_MAGIC!r}); "
                           f"{_PREPARE_AGAIN}")
        version, code, sequences, documents = struct.unpack("<QBQQ", head[9:])
        if version != 1:
            return problem(f"{idx_path}: index version {version}, megatron-core reads version 1; {_PREPARE_AGAIN}")
        dtype = INDEX_DTYPES.get(code)
        if dtype is None or not np.issubdtype(dtype, np.integer):
            what = f"dtype code {code}" if dtype is None else f"{np.dtype(dtype).name} tokens"
            return problem(f"{idx_path}: {what}, not an integer token dtype megatron-core writes; {_PREPARE_AGAIN}")
        out.dtype, out.sequences, out.documents = np.dtype(dtype).name, sequences, documents
        itemsize = np.dtype(dtype).itemsize
        expected = INDEX_HEADER_BYTES + 12 * sequences + 8 * documents
        if idx_size not in (expected, expected + sequences):
            state = "truncated" if idx_size < expected else f"{idx_size - expected} bytes longer than it should be"
            return problem(f"{idx_path}: {idx_size} bytes, its header ({sequences} sequences, {documents} document "
                           f"indices) needs {expected}: {state}; {_PREPARE_AGAIN}")
        if sequences == 0:
            return problem(f"{idx_path}: no documents; {_PREPARE_AGAIN} from a non-empty input")
        last_len = int(_read_at(f, INDEX_HEADER_BYTES + 4 * (sequences - 1), 1, np.int32)[0])
        pointers = INDEX_HEADER_BYTES + 4 * sequences
        first_ptr = int(_read_at(f, pointers, 1, np.int64)[0])
        last_ptr = int(_read_at(f, pointers + 8 * (sequences - 1), 1, np.int64)[0])
        docs = pointers + 8 * sequences
        doc_first = int(_read_at(f, docs, 1, np.int64)[0]) if documents else None
        doc_last = int(_read_at(f, docs + 8 * (documents - 1), 1, np.int64)[0]) if documents else None
    if first_ptr != 0 or last_ptr < 0 or last_len < 0 or last_ptr % itemsize or doc_first != 0 or doc_last != sequences:
        return problem(f"{idx_path}: its pointers or document indices are inconsistent (first pointer {first_ptr}, "
                       f"document indices {doc_first}..{doc_last} for {sequences} sequences): damaged; {_PREPARE_AGAIN}")
    try:  # every entry: lengths >= 0, pointers their running sum, document indices monotone in [0, S]
        check_index(prefix)
    except IndexInconsistent as exc:
        if exc.path == idx_path:  # the .bin's size is judged below, with the dtype hint
            out.tokens = 0
            return problem(f"{idx_path}: {exc.why}: damaged; {_PREPARE_AGAIN}")
    except FileRefused as exc:  # replaced by a FIFO or device since the check above
        return problem(str(exc))
    need = last_ptr + last_len * itemsize
    out.tokens = need // itemsize
    described = f"its .idx describes {out.tokens} {out.dtype} tokens = {need} bytes"
    if bin_size < need:
        return problem(f"{bin_path}: {bin_size} bytes, {described}: truncated (or the .idx belongs to another "
                       f".bin); {_PREPARE_AGAIN}")
    if bin_size != need:
        ratio = bin_size / need
        dtype_hint = ""
        for other in (1, 2, 4, 8):
            if other != itemsize and bin_size == need // itemsize * other:
                dtype_hint = f", exactly what {other}-byte tokens would take (a dtype disagreement)"
        return problem(f"{bin_path}: {bin_size} bytes ({ratio:.2f}x), {described}{dtype_hint}: the .bin and .idx do "
                       f"not belong together or disagree on the dtype; {_PREPARE_AGAIN}")
    info = np.iinfo(dtype)
    if out.tokens == 0:
        return problem(f"{bin_path}: its .idx describes no tokens; {_PREPARE_AGAIN} from a non-empty input")
    if info.min >= 0 and info.max < vocab_size:
        out.scan = f"none ({out.dtype} ids are all < {vocab_size})"
        return out
    out.min_id, out.max_id, out.scan, out.scanned_bytes = _id_range(bin_path, dtype, out.tokens)
    if out.max_id >= vocab_size or out.min_id < 0:
        bad = out.max_id if out.max_id >= vocab_size else out.min_id
        return problem(f"{bin_path}: token id {bad} is outside the tokenizer's vocabulary [0, {vocab_size}) "
                       f"(model.vocab_size; scan: {out.scan}): the data was tokenized with another tokenizer; "
                       f"{_PREPARE_AGAIN} and the spec's [data.tokenizer], or fix model.vocab_size")
    return out


def _vocabulary_of(prefix: str, vocab_size: int) -> int:
    """The ids a dataset may hold: ``[0, vocab_size)``, widened to the chat tokens an SFT
    dataset's record gave ids past the vocabulary (``dlmspec data prepare --sft``: ``<|im_start|>``
    = 50258 with GPT-2); validate's ``sft-special-token-ids`` keeps those off [MASK] and inside
    the padded vocabulary."""
    from dlmspec.data.record import RecordError, read_record

    try:
        record = read_record(prefix)
    except (RecordError, OSError):
        return vocab_size
    special = ((record or {}).get("sft") or {}).get("special_tokens") or {}
    ids = [int(i) for i in special.values() if isinstance(i, int)]
    return max([vocab_size] + [i + 1 for i in ids])


def data_problems(data: "DataConfig") -> List[str]:
    """The :func:`check_indexed_dataset` problems of every prefix of ``data``'s blends whose two
    files exist (missing ones are :func:`missing_data_files`' to report), in blend order; empty
    with ``mock`` data. Called by :func:`dlmspec.backends.megatron.checks.start_checks` before megatron-core
    starts.
    """
    if data.mock:
        return []
    missing = set(missing_data_files(data))
    problems: List[str] = []
    seen = set()
    for blend in (data.blend or [], data.valid_blend or []):
        for prefix, _weight in blend:
            prefix = str(prefix)
            if prefix in seen or prefix + ".bin" in missing or prefix + ".idx" in missing:
                continue
            seen.add(prefix)
            try:
                problems.extend(check_indexed_dataset(prefix, _vocabulary_of(prefix, data.vocab_size)).problems)
            except OSError as exc:
                problems.append(f"{exc.filename or prefix}: cannot be read ({exc.strerror or exc})")
    return problems


def _blend_tuple(blend: Optional[Sequence[Tuple[str, Optional[float]]]]):
    if not blend:
        return None
    prefixes = [str(p) for p, _ in blend]
    weights = [w for _, w in blend]
    if all(w is None for w in weights):
        return (prefixes, None)
    if any(w is None for w in weights):
        raise ValueError("blend weights must be all given or all None")
    if any(float(w) <= 0 for w in weights):
        raise ValueError("blend weights must be > 0")
    return (prefixes, [float(w) for w in weights])


@dataclass
class CappedGPTDatasetConfig(GPTDatasetConfig):
    """megatron's ``GPTDatasetConfig`` with the caps of :class:`CappedGPTDataset`.

    Attributes:
        max_unique_tokens: ``{dataset prefix: tokens}`` (the blend's prefixes as written).
    """

    max_unique_tokens: Optional[Dict[str, int]] = None


class CappedGPTDataset(GPTDataset):
    """megatron-core's ``GPTDataset`` whose training split of a capped dataset is cut to a prefix.

    For a dataset named in ``config.max_unique_tokens`` the training split's document indices
    (``indexed_indices``, the ``arange`` the builder gives, in file order) are cut to the longest
    prefix whose tokens do not exceed the cap (:func:`dlmspec.data.repetition.capped_documents`)
    before megatron-core builds its document, sample and shuffle indices from them: the shuffle
    (from ``random_seed``) only orders that fixed set, and every rank reads the indices rank 0
    built, so the documents are the same for every seed and rank count. Validation and test
    splits are not cut. The caps are part of the dataset's cache key
    (``_key_config_attributes``), so an index cached for another cap is never reused.

    Raises:
        ValueError: a cap keeps no whole document (the split's first document is longer).
    """

    def __init__(self, indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config) -> None:
        cap = (config.max_unique_tokens or {}).get(dataset_path)
        if cap is not None and index_split == Split.train and indexed_indices is not None:
            from dlmspec.data.repetition import capped_documents

            kept = capped_documents(indexed_dataset.sequence_lengths[indexed_indices], int(cap))
            if kept == 0:
                first = int(indexed_dataset.sequence_lengths[indexed_indices[0]]) if len(indexed_indices) else 0
                raise ValueError(f"{dataset_path}: max_unique_tokens {cap} keeps no whole document (the first "
                                 f"document of its training split holds {first} tokens); raise the cap")
            indexed_indices = indexed_indices[:kept]
        super().__init__(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config)

    @staticmethod
    def _key_config_attributes() -> List[str]:
        return GPTDataset._key_config_attributes() + ["max_unique_tokens"]


def build_gpt_dataset_config(
    data: DataConfig, *, seed: int, add_extra_token_to_sequence: bool, tokenizer: Optional[DatasetTokenizer] = None
) -> GPTDatasetConfig:
    """Translate a :class:`DataConfig` into megatron's ``GPTDatasetConfig``
    (:class:`CappedGPTDatasetConfig` when ``data.max_unique_tokens`` caps a dataset).

    Raises:
        ValueError: If neither ``mock`` nor ``blend`` is set, or both are; or a cap names a
            dataset outside ``blend``.
    """
    if data.mock == bool(data.blend):
        raise ValueError("set exactly one of DataConfig.mock=True or DataConfig.blend")
    caps = dict(data.max_unique_tokens or {})
    unknown = sorted(set(caps) - {str(p) for p, _ in data.blend or []})
    if unknown:
        raise ValueError(f"max_unique_tokens names datasets outside the training blend: {unknown}")
    tokenizer = tokenizer or DatasetTokenizer(data.vocab_size, data.eod_id, data.pad_id)
    kwargs = dict(
        random_seed=seed,
        sequence_length=data.seq_length,
        tokenizer=tokenizer,
        reset_position_ids=data.reset_position_ids,
        reset_attention_mask=False,
        eod_mask_loss=data.eod_mask_loss,
        create_attention_mask=False,
        add_extra_token_to_sequence=add_extra_token_to_sequence,
        path_to_cache=data.cache_dir,
        mmap_bin_files=data.mmap_bin_files,
    )
    if data.mock:
        return GPTDatasetConfig(**kwargs)
    config_class = GPTDatasetConfig
    if caps:
        config_class, kwargs["max_unique_tokens"] = CappedGPTDatasetConfig, caps
    if data.valid_blend:
        return config_class(
            blend_per_split=[_blend_tuple(data.blend), _blend_tuple(data.valid_blend), None], **kwargs
        )
    return config_class(blend=_blend_tuple(data.blend), split=data.split, **kwargs)


def build_datasets(
    data: DataConfig,
    *,
    seed: int,
    train_samples: int,
    valid_samples: int,
    add_extra_token_to_sequence: bool,
    tokenizer: Optional[DatasetTokenizer] = None,
):
    """Build the train and validation datasets with ``BlendedMegatronDatasetBuilder``.

    Must be called on every rank (rank 0 builds megatron's index caches first,
    the others then read them).

    Args:
        data: The data settings.
        seed: Seed of megatron's document/sample shuffling.
        train_samples: Samples the training run will draw (``train_iters *
            global_batch_size``); the dataset is made at least that long
            (megatron repeats epochs).
        valid_samples: Samples one evaluation draws (0: no validation set).
        add_extra_token_to_sequence: ``True`` for AR (``seq_length + 1`` tokens
            are read so that inputs and shifted labels both have
            ``seq_length``), ``False`` for MDM.
        tokenizer: Overrides the tokenizer built from ``data``.

    Returns:
        ``(train_dataset, valid_dataset_or_None)``; each item is a dict with
        ``tokens``, ``labels`` (``[s]`` int64), ``loss_mask`` (``[s]`` float32)
        and ``position_ids`` (``[s]`` int64).
    """
    config = build_gpt_dataset_config(
        data, seed=seed, add_extra_token_to_sequence=add_extra_token_to_sequence, tokenizer=tokenizer
    )
    cls = MockGPTDataset if data.mock else CappedGPTDataset if data.max_unique_tokens else GPTDataset
    # Megatron wants a size for every split that has weights; the test split is
    # never read here, so it gets 0 samples.
    sizes = [int(train_samples), max(int(valid_samples), 0), 0]
    train_ds, valid_ds, _ = BlendedMegatronDatasetBuilder(
        cls, sizes, lambda: True, config
    ).build()
    if valid_samples <= 0:
        valid_ds = None
    return train_ds, valid_ds


class PretrainingBatchSampler:
    """Megatron-LM's ``MegatronPretrainingSampler`` (batch sampler for a DataLoader).

    Yields, for each optimizer micro-step, the ``micro_batch_size`` dataset
    indices of this data-parallel rank.

    Args:
        total_samples: Length of the dataset.
        consumed_samples: Samples all ranks together consumed before (resume).
        micro_batch_size: Samples per microbatch per rank.
        data_parallel_rank: This rank's index in the data-parallel group.
        data_parallel_size: Size of the data-parallel group.
        drop_last: Drop a final incomplete global microbatch.

    Raises:
        ValueError: On inconsistent arguments.
    """

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        if total_samples <= 0:
            raise ValueError(f"no samples to draw: total_samples={total_samples}")
        if micro_batch_size <= 0 or data_parallel_size <= 0:
            raise ValueError("micro_batch_size and data_parallel_size must be > 0")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank {data_parallel_rank} not in [0, {data_parallel_size})")
        if consumed_samples < 0:
            raise ValueError(f"consumed_samples must be >= 0, got {consumed_samples}")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.global_micro_batch = micro_batch_size * data_parallel_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        return self.total_samples

    def __iter__(self) -> Iterator[List[int]]:
        start = self.data_parallel_rank * self.micro_batch_size
        end = start + self.micro_batch_size
        batch: List[int] = []
        for idx in range(self.consumed_samples, self.total_samples):
            batch.append(idx)
            if len(batch) == self.global_micro_batch:
                yield batch[start:end]
                batch = []
        if batch and not self.drop_last and len(batch) > start:
            yield batch[start:end]


def build_dataloader(
    dataset,
    *,
    consumed_samples: int,
    micro_batch_size: int,
    data_parallel_rank: int,
    data_parallel_size: int,
    num_workers: int = 2,
) -> torch.utils.data.DataLoader:
    """DataLoader over ``dataset`` with :class:`PretrainingBatchSampler` semantics."""
    sampler = PretrainingBatchSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=data_parallel_rank,
        data_parallel_size=data_parallel_size,
    )
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        worker_init_fn=ignore_exit_signals if num_workers else None,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=False,
    )


def document_attention_mask(tokens: Tensor, eod_id: int) -> Tensor:
    """Mask keeping attention inside packed documents.

    A document ends with (and includes) its EOD token.  Position ``i`` belongs
    to document ``d(i) = #EOD strictly before i``.

    Args:
        tokens: ``[b, s]`` token ids.
        eod_id: The EOD id.

    Returns:
        ``[b, 1, s, s]`` bool, ``True`` where query ``i`` may *not* attend key
        ``j`` (``d(i) != d(j)``) - megatron's convention; causality is added by
        the attention module's mode.
    """
    is_eod = tokens == eod_id
    doc = torch.cumsum(is_eod.to(torch.int32), dim=1) - is_eod.to(torch.int32)
    return (doc.unsqueeze(2) != doc.unsqueeze(1)).unsqueeze(1)


def combine_attention_masks(*masks: Optional[Tensor]) -> Optional[Tensor]:
    """OR together megatron-convention masks (``True`` = not attended); ``None`` if all are."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else (out | m)
    return out


def batch_to_device(batch: Dict[str, Tensor], device: torch.device) -> Dict[str, Tensor]:
    """Move a collated batch to ``device`` (non-blocking from pinned memory)."""
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
