"""``DataConfig.max_unique_tokens`` on megatron-core's GPT datasets (CPU): a capped dataset trains on
the same prefix of whole documents for every seed and data-parallel size, its validation split is the
uncapped one's, and megatron-core's index cache never hands a capped run the uncapped indices.

Every token of document ``i`` is the id ``i + 1`` (then EOD), so the ids a sample holds name the
documents it was cut from."""

from __future__ import annotations

import numpy as np
import pytest

from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from dlmspec.backends.megatron.data import DataConfig, PretrainingBatchSampler, build_datasets
from dlmspec.data.repetition import capped_documents, train_split_bounds

EOD = 999
DOCUMENTS = 60
SPLIT = "90,10,0"
#: the cap: a prefix of the 54 training documents (lengths 5..24 tokens with EOD)
CAP = 300

pytestmark = pytest.mark.usefixtures("gloo_world")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("capped")
    rng = np.random.default_rng(7)
    builder = IndexedDatasetBuilder(str(root / "c.bin"), dtype=np.uint16)
    lengths = []
    for i in range(DOCUMENTS):
        n = int(rng.integers(4, 24))
        builder.add_document(np.concatenate([np.full(n, i + 1), [EOD]]), [n + 1])
        lengths.append(n + 1)
    builder.finalize(str(root / "c.idx"))
    return str(root / "c"), lengths, str(root / "cache")


def _config(prefix: str, cache: str, cap: int | None) -> DataConfig:
    return DataConfig(seq_length=16, vocab_size=1000, eod_id=EOD, blend=[(prefix, None)], split=SPLIT,
                      cache_dir=cache, max_unique_tokens=None if cap is None else {prefix: cap})


def _documents(dataset, indices) -> set[int]:
    docs: set[int] = set()
    for i in indices:
        tokens = dataset[i]["tokens"].numpy()
        docs.update(int(t) - 1 for t in tokens if t != EOD)
    return docs


def _drawn(dataset, data_parallel_size: int) -> set[int]:
    """The documents every data-parallel rank together reads in one pass over ``dataset``."""
    docs: set[int] = set()
    for rank in range(data_parallel_size):
        for batch in PretrainingBatchSampler(len(dataset), 0, 2, rank, data_parallel_size):
            docs |= _documents(dataset, batch)
    return docs


def test_the_cap_selects_the_same_documents_for_every_seed_and_rank_count(corpus) -> None:
    prefix, lengths, cache = corpus
    begin, end = train_split_bounds(DOCUMENTS, SPLIT)
    kept = capped_documents(lengths[begin:end], CAP)
    assert 0 < kept < end - begin and sum(lengths[:kept]) <= CAP < sum(lengths[:kept + 1])
    want = set(range(begin, begin + kept))
    seen = {}
    for seed in (1, 2):
        # ~6 epochs of the capped documents, so every one of them is drawn
        train, _ = build_datasets(_config(prefix, cache, CAP), seed=seed, train_samples=6 * CAP // 16,
                                  valid_samples=8, add_extra_token_to_sequence=False)
        for dp in (1, 2):
            seen[seed, dp] = _drawn(train, dp)
    assert all(docs == want for docs in seen.values()), {k: sorted(v ^ want) for k, v in seen.items()}
    # the seed orders the samples, not the documents: two seeds give two orders of the same set
    one, _ = build_datasets(_config(prefix, cache, CAP), seed=1, train_samples=64, valid_samples=8,
                            add_extra_token_to_sequence=False)
    two, _ = build_datasets(_config(prefix, cache, CAP), seed=2, train_samples=64, valid_samples=8,
                            add_extra_token_to_sequence=False)
    assert [one[i]["tokens"].tolist() for i in range(8)] != [two[i]["tokens"].tolist() for i in range(8)]


def test_validation_is_the_uncapped_split_and_the_cache_keeps_caps_apart(corpus) -> None:
    prefix, lengths, cache = corpus
    begin, end = train_split_bounds(DOCUMENTS, SPLIT)
    # uncapped first, in the same cache folder: its indices must not be reused for the cap
    whole, valid_whole = build_datasets(_config(prefix, cache, None), seed=3, train_samples=200, valid_samples=40,
                                        add_extra_token_to_sequence=True)
    capped, valid_capped = build_datasets(_config(prefix, cache, CAP), seed=3, train_samples=200, valid_samples=40,
                                          add_extra_token_to_sequence=True)
    assert _drawn(whole, 1) == set(range(begin, end))
    kept = capped_documents(lengths[begin:end], CAP)
    assert _drawn(capped, 1) == set(range(begin, begin + kept))
    validation = set(range(end, DOCUMENTS))
    assert _drawn(valid_whole, 1) == _drawn(valid_capped, 1) == validation


def test_in_a_blend_only_the_capped_dataset_is_cut(corpus, tmp_path) -> None:
    prefix, lengths, cache = corpus
    other = str(tmp_path / "d")
    builder = IndexedDatasetBuilder(other + ".bin", dtype=np.uint16)
    for i in range(20):  # ids 101..120: documents of the other dataset
        builder.add_document(np.concatenate([np.full(9, 101 + i), [EOD]]), [10])
    builder.finalize(other + ".idx")
    data = DataConfig(seq_length=16, vocab_size=1000, eod_id=EOD, blend=[(prefix, 1.0), (other, 1.0)], split=SPLIT,
                      cache_dir=cache, max_unique_tokens={prefix: CAP})
    train, _ = build_datasets(data, seed=5, train_samples=400, valid_samples=8, add_extra_token_to_sequence=False)
    docs = _drawn(train, 2)
    begin, end = train_split_bounds(DOCUMENTS, SPLIT)
    kept = capped_documents(lengths[begin:end], CAP)
    other_begin, other_end = train_split_bounds(20, SPLIT)
    assert {d for d in docs if d < 100} == set(range(begin, begin + kept))
    assert {d - 100 for d in docs if d >= 100} == set(range(other_begin, other_end))


def test_a_cap_below_the_first_document_is_refused(corpus) -> None:
    prefix, lengths, cache = corpus
    with pytest.raises(ValueError, match="keeps no whole document"):
        build_datasets(_config(prefix, cache, lengths[0] - 1), seed=1, train_samples=10, valid_samples=0,
                       add_extra_token_to_sequence=False)


def test_a_cap_on_a_dataset_outside_the_blend_is_refused(corpus) -> None:
    prefix, _, cache = corpus
    config = _config(prefix, cache, None)
    config.max_unique_tokens = {prefix + "-other": 10}
    with pytest.raises(ValueError, match="outside the training blend"):
        build_datasets(config, seed=1, train_samples=10, valid_samples=0, add_extra_token_to_sequence=False)
