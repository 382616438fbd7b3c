"""Spec.data_constrained: a (size x unique tokens x epochs) grid whose members cap the training data
(data.train[].max_unique_tokens, split over the blend by weight) and train for the steps that repeat
it the asked epochs, as dlmspec.data.repetition counts them on real indexed datasets."""

from __future__ import annotations

from pathlib import Path

import pytest

from blend_shards import docs_of, null_tokenizer, write_shard
from spec_kit import spec_file
from dlmspec.data.repetition import repetition
from dlmspec.dsl import Spec
from dlmspec.errors import SpecError
from dlmspec.params import count_parameters
from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

#: 32 tokens a step (global batch 4 x sequence 8); two training datasets weighted 1:3.
RUN = {"data.mock": None, "train.seq_length": 8, "train.global_batch_size": 4, "train.micro_batch_size": 1,
       "train.train_iters": 10, "train.lr_warmup_iters": 2, "train.eval_interval": 5,
       "data.train": [{"prefix": "data/a_text_document", "weight": 1.0},
                      {"prefix": "data/b_text_document", "weight": 3.0}],
       "data.valid": ["data/v_text_document"]}


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A spec over data/a (4,000 tokens) and data/b (12,000 tokens) of 4-token documents."""
    monkeypatch.chdir(tmp_path)
    for name, tokens in (("a", 4000), ("b", 12000), ("v", 64)):
        write_shard(str(tmp_path / f"data/{name}_text_document"), docs_of(tokens), null_tokenizer())
    return load(spec_file(tmp_path, RUN)).spec


def test_each_member_repeats_its_capped_data_the_asked_epochs(base):
    members = Spec.data_constrained(base, [5e5, 1e6], [800, 1600], [1, 4, 16])
    assert len(members) == 2 * 2 * 3
    cells = [(n, u, e) for n in (5e5, 1e6) for u in (800, 1600) for e in (1, 4, 16)]
    for (n, u, e), (name, spec) in zip(cells, members.items()):
        assert name == spec.name == f"t-n{'500k' if n == 5e5 else '1m'}-u{'800' if u == 800 else '1.6k'}-e{e}"
        assert [entry.max_unique_tokens for entry in spec.data.train] == [u / 4, 3 * u / 4]
        assert [entry.max_unique_tokens for entry in spec.data.valid] == [None]
        rep = repetition(spec, resolve(spec))
        assert rep.unique_tokens == u and [d.data.unique_tokens for d in rep.datasets] == [u / 4, 3 * u / 4]
        assert abs(rep.epochs - e) <= 0.5 * 32 / u  # whole steps of 32 tokens
        assert abs(count_parameters(spec.model).non_embedding - n) <= 0.02 * n
        assert spec.train.eval_interval <= spec.train.train_iters


def test_one_epoch_and_many_epochs_of_a_smaller_cap_spend_the_same_compute(base):
    pair = {**Spec.data_constrained(base, [1e6], [3200], [1]), **Spec.data_constrained(base, [1e6], [400], [8])}
    one, many = pair.values()
    assert one.model == many.model and one.train.train_iters == many.train.train_iters == 100
    flops = [make_plan(resolve(s)).to_dict()["flops"]["model_per_step"] * s.train.train_iters for s in (one, many)]
    assert flops[0] == flops[1]
    reps = [repetition(s, resolve(s)) for s in (one, many)]
    assert [r.epochs for r in reps] == [1.0, 8.0] and [r.unique_tokens for r in reps] == [3200, 400]


def test_mock_data_cannot_be_capped(spec_dict):
    mock = Spec.model_validate(spec_dict())
    with pytest.raises(SpecError) as info:
        Spec.data_constrained(mock, [1e6], [1e5], [2])
    (issue,) = info.value.issues
    assert issue.key == "data.train" and "mock data" in issue.message and "dlmspec data prepare" in issue.hint


def test_bad_unique_tokens_and_epochs_are_refused_naming_the_argument(base):
    for key, args in (("unique_tokens", ([1e6], [], [2])), ("epochs", ([1e6], [800], [0])),
                      ("epochs", ([1e6], [800], [2, 2]))):
        with pytest.raises(SpecError) as info:
            Spec.data_constrained(base, *args)
        assert info.value.issues[0].key == key
