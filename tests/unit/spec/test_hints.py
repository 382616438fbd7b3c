"""Hints for keys and GPU ids that users bring from elsewhere (found by a first-time user)."""

import pytest

from dlmspec.check import find
from dlmspec.errors import SpecError
from dlmspec.spec.load import load_text
from dlmspec.spec.schema_errors import KEY_ALIASES
from dlmspec.resolve import resolve

BASE = """
[model]
preset = "qwen3-0.6b"
[train]
global_batch_size = 8
seq_length = 512
train_iters = 10
{extra}
[cluster]
gpu = "{gpu}"
gpus_per_node = 1
"""


@pytest.mark.parametrize("key, expected", [("bf16", "[precision] dtype"), ("tp", "tensor_model_parallel_size"),
                                           ("dp", "derived")])
def test_alias_keys_point_to_the_spec_key(key: str, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_text(BASE.format(extra=f"{key} = 1", gpu="h100"), "a.toml")
    issue = caught.value.issues[0]
    assert issue.key == f"train.{key}" and issue.line == 8 and expected in issue.hint


def test_aliases_name_real_keys() -> None:
    # Every alias points at a key the schema has (or says the value is derived).
    from dlmspec.spec.models import Spec

    for target in KEY_ALIASES.values():
        if target.startswith("nothing"):
            continue
        section, key = target.split("] ")[0].strip("["), target.split("] ")[1].split(" ")[0]
        assert key in Spec.model_fields[section].annotation.model_fields, target


def test_gpu_family_names_every_variant() -> None:
    loaded = load_text(BASE.format(extra="", gpu="a100"), "a.toml")
    (issue,) = [i for i in find(("spec",), loaded, resolve(loaded.spec)) if i.key == "cluster.gpu"]
    assert "'a100-40gb'" in issue.hint and "'a100-80gb'" in issue.hint


@pytest.mark.parametrize("extra, key, example", [
    ('micro_batch_size = "two"', "train.micro_batch_size", "e.g. micro_batch_size = 1"),   # the default
    ("micro_batch_size = 0", "train.micro_batch_size", "e.g. micro_batch_size = 1"),
    ("lr = -1.0", "train.lr", "e.g. lr = 0.0003"),
    ("eval_iters = 2.5", "train.eval_iters", "e.g. eval_iters = 10"),
])
def test_type_errors_give_a_working_value(extra: str, key: str, example: str) -> None:
    # A fresh user's report: "fix: input should be a valid integer" repeated the reason and gave no value.
    with pytest.raises(SpecError) as caught:
        load_text(BASE.format(extra=extra, gpu="h100"), "a.toml")
    (issue,) = [i for i in caught.value.issues if i.key == key]
    assert example in issue.hint, issue.hint


def test_a_negative_size_without_a_default_is_offered_without_its_sign() -> None:
    # A fresh user's report: hidden_size = -768 got "e.g. hidden_size = 1", which 16 heads cannot divide.
    with pytest.raises(SpecError) as caught:
        load_text(BASE.format(extra="", gpu="h100").replace('preset = "qwen3-0.6b"', 'preset = "qwen3-0.6b"\nhidden_size = -1024'),
                  "a.toml")
    (issue,) = [i for i in caught.value.issues if i.key == "model.hidden_size"]
    assert "e.g. hidden_size = 1024" in issue.hint and issue.fix is not None and issue.fix.set == {"model.hidden_size": 1024}


def test_a_single_value_where_a_list_is_expected_is_offered_as_a_list() -> None:
    # A fresh user's report: data.train = "PREFIX" said "Input should be a valid list" with no fix.
    with pytest.raises(SpecError) as caught:
        load_text(BASE.format(extra='[data]\ntrain = "corpus_text_document"', gpu="h100"), "a.toml")
    (issue,) = [i for i in caught.value.issues if i.key == "data.train"]
    assert issue.message == "a list is expected, not a single value"
    assert issue.hint == 'write it as a list: data.train = ["corpus_text_document"]'
    assert issue.fix is not None and issue.fix.set == {"data.train": ["corpus_text_document"]}
    fixed = load_text(BASE.format(extra='[data]\ntrain = ["corpus_text_document"]', gpu="h100"), "a.toml")
    assert fixed.spec.data.train
