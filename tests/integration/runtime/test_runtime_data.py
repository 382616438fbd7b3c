"""CPU tests of the data path: megatron datasets, sampler, document masks."""


import numpy as np
import pytest
import torch

from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.gpt_dataset import MockGPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from dlmspec.backends.megatron.data import (
    DataConfig,
    DatasetTokenizer,
    PretrainingBatchSampler,
    build_dataloader,
    build_datasets,
    build_gpt_dataset_config,
    combine_attention_masks,
    document_attention_mask,
)

EOD = 999


#: the one-process gloo world of tests/conftest.py, for every test here
pytestmark = pytest.mark.usefixtures("gloo_world")


@pytest.fixture(scope="module")
def indexed_prefixes(tmp_path_factory):
    root = tmp_path_factory.mktemp("indexed")
    prefixes = []
    for name, offset in (("a", 0), ("b", 500)):
        builder = IndexedDatasetBuilder(str(root / f"{name}.bin"), dtype=np.uint16)
        rng = np.random.default_rng(offset)
        for _ in range(300):
            n = int(rng.integers(5, 60))
            doc = np.concatenate([offset + rng.integers(0, 400, n), [EOD]])
            builder.add_document(doc, [n + 1])
        builder.finalize(str(root / f"{name}.idx"))
        prefixes.append(str(root / name))
    return prefixes, str(root / "cache")


def test_mock_dataset_for_mdm_has_exact_length_samples():
    data = DataConfig(seq_length=64, vocab_size=1000, eod_id=EOD, mock=True)
    train, valid = build_datasets(data, seed=1, train_samples=50, valid_samples=8, add_extra_token_to_sequence=False)
    assert isinstance(train, MockGPTDataset) and valid is not None
    sample = train[0]
    assert sample["tokens"].shape == (64,) and sample["tokens"].dtype == torch.int64
    assert set(sample) == {"tokens", "labels", "loss_mask", "position_ids"}
    _, none = build_datasets(data, seed=1, train_samples=50, valid_samples=0, add_extra_token_to_sequence=False)
    assert none is None


def test_blend_of_indexed_datasets_with_ar_shifted_labels(indexed_prefixes):
    prefixes, cache = indexed_prefixes
    data = DataConfig(
        seq_length=32, vocab_size=1000, eod_id=EOD, blend=[(prefixes[0], 0.25), (prefixes[1], 0.75)],
        split="90,10,0", cache_dir=cache, eod_mask_loss=True,
    )
    train, valid = build_datasets(data, seed=3, train_samples=400, valid_samples=20, add_extra_token_to_sequence=True)
    assert isinstance(train, BlendedDataset) and len(train) >= 400 and len(valid) >= 20
    from_b = 0
    for i in range(200):
        s = train[i]
        assert torch.equal(s["tokens"][1:], s["labels"][:-1])  # labels are the next tokens
        assert torch.all(s["loss_mask"][s["tokens"] == EOD] == 0)  # eod_mask_loss
        from_b += int((s["tokens"][s["tokens"] != EOD] >= 500).all())
    # Dataset b has weight 0.75 (its token ids are >= 500).
    assert 0.6 < from_b / 200 < 0.9


def test_separate_validation_blend(indexed_prefixes):
    prefixes, cache = indexed_prefixes
    data = DataConfig(
        seq_length=16, vocab_size=1000, eod_id=EOD, blend=[(prefixes[0], None)],
        valid_blend=[(prefixes[1], None)], cache_dir=cache,
    )
    train, valid = build_datasets(data, seed=3, train_samples=100, valid_samples=10, add_extra_token_to_sequence=False)
    v = valid[0]["tokens"]
    assert bool((v[v != EOD] >= 500).all())
    t = train[0]["tokens"]
    assert bool((t[t != EOD] < 500).all())


def test_config_errors():
    with pytest.raises(ValueError, match="exactly one"):
        build_gpt_dataset_config(DataConfig(seq_length=8, vocab_size=10, eod_id=9), seed=0, add_extra_token_to_sequence=True)
    with pytest.raises(ValueError, match="exactly one"):
        build_gpt_dataset_config(
            DataConfig(seq_length=8, vocab_size=10, eod_id=9, mock=True, blend=[("x", 1.0)]),
            seed=0, add_extra_token_to_sequence=True,
        )
    with pytest.raises(ValueError):
        build_gpt_dataset_config(
            DataConfig(seq_length=8, vocab_size=10, eod_id=9, blend=[("x", 1.0), ("y", None)]),
            seed=0, add_extra_token_to_sequence=True,
        )
    with pytest.raises(ValueError):
        DatasetTokenizer(10, eod_id=10)


def test_tokenizer_exposes_what_megatron_reads():
    tok = DatasetTokenizer(1000, EOD)
    assert tok.vocab_size == 1000 and tok.eod == EOD and tok.eos == EOD
    with pytest.raises(AttributeError):
        tok.pad
    assert DatasetTokenizer(1000, EOD, pad_id=0).pad == 0
    assert tok.unique_identifiers["vocab_size"] == 1000


def test_sampler_slices_global_batches_across_data_parallel_ranks():
    dp, mbs = 4, 3
    per_rank = [list(PretrainingBatchSampler(100, 0, mbs, r, dp)) for r in range(dp)]
    steps = len(per_rank[0])
    assert steps == 100 // (dp * mbs)
    for step in range(steps):
        union = sorted(i for r in range(dp) for i in per_rank[r][step])
        assert union == list(range(step * dp * mbs, (step + 1) * dp * mbs))
        assert per_rank[1][step] == list(range(step * dp * mbs + mbs, step * dp * mbs + 2 * mbs))


def test_sampler_resumes_where_the_interrupted_run_stopped():
    full = list(PretrainingBatchSampler(200, 0, 2, 1, 2))
    resumed = list(PretrainingBatchSampler(200, 40, 2, 1, 2))  # 10 steps of 4 samples consumed
    assert resumed == full[10:]
    with pytest.raises(ValueError):
        PretrainingBatchSampler(10, 0, 2, 2, 2)


def test_dataloader_batches_follow_the_sampler():
    data = DataConfig(seq_length=16, vocab_size=1000, eod_id=EOD, mock=True)
    train, _ = build_datasets(data, seed=1, train_samples=64, valid_samples=0, add_extra_token_to_sequence=False)
    loader = build_dataloader(train, consumed_samples=8, micro_batch_size=2, data_parallel_rank=1,
                              data_parallel_size=2, num_workers=0)
    batch = next(iter(loader))
    assert batch["tokens"].shape == (2, 16)
    assert torch.equal(batch["tokens"][0], train[10]["tokens"])  # 8 consumed + rank 1 offset 2


def test_document_attention_mask_keeps_attention_inside_documents():
    tokens = torch.tensor([[5, 6, EOD, 7, EOD, 8, 9, 1]])
    masked = document_attention_mask(tokens, EOD)
    assert masked.shape == (1, 1, 8, 8) and masked.dtype == torch.bool
    doc = [0, 0, 0, 1, 1, 2, 2, 2]
    expected = torch.tensor([[di != dj for dj in doc] for di in doc])
    assert torch.equal(masked[0, 0], expected)
    padding = (torch.arange(8) >= 6).view(1, 1, 1, 8)
    combined = combine_attention_masks(None, padding, masked)
    assert torch.equal(combined, masked | padding)
    assert combine_attention_masks(None, None) is None
