"""An objective registers its own spec model: a subclass of ``ObjectiveSpec`` (the keys every
objective has) with keys of its own, and ``[objective]`` validates against the model of its
``kind`` (``Spec.objective`` becomes a union discriminated on ``kind``), while the built-in kinds
see the same keys, messages and schema as before. The toy is defined in this test module alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import Field

from dlmspec import objectives
from dlmspec.cli import main
from dlmspec.errors import EXIT_USAGE, SpecError
from dlmspec.spec import models
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"
KIND = "toy-rate"


class ToyObjectiveSpec(models.ObjectiveSpec):
    """``[objective]`` of the toy: the shared keys plus its own rate."""

    toy_rate: models.Float = Field(0.25, gt=0.0, le=1.0, description="The toy's share of positions that carry loss.")


class ToyRateObjective(objectives.Objective):
    kind = KIND
    description = "next-token prediction on a share of the positions"
    attention = "causal"
    attentions = ("causal",)
    spec_model = ToyObjectiveSpec

    def loss_row_fraction_of(self, objective):
        return objective.toy_rate


@pytest.fixture()
def toy():
    objectives.register(ToyRateObjective())
    try:
        yield
    finally:
        objectives.unregister(KIND)


def _toy_file(tmp_path: Path, objective: str) -> Path:
    path = tmp_path / "toy.toml"
    path.write_text(f'extends = {json.dumps(str(DEMO))}\nname = "toy"\n\n[objective]\n{objective}\n'
                    'attention_mask = "causal"\n', encoding="utf-8")
    return path


def _issues(exc: SpecError) -> dict[str, str]:
    return {issue.key: str(issue) for issue in exc.issues}


def test_toy_spec_model_validates_its_own_key_from_a_toml_file(toy, tmp_path: Path) -> None:
    spec = load(_toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rate = 0.5')).spec
    assert isinstance(spec.objective, ToyObjectiveSpec)
    assert (spec.objective.kind, spec.objective.toy_rate) == (KIND, 0.5)
    # the shared keys still validate, and the parent's values are kept
    assert spec.objective.variable_length_prob == 0.01 and spec.objective.attention_mask == "causal"
    assert objectives.get(spec.objective.kind).loss_row_fraction_of(spec.objective) == 0.5


def test_toy_spec_model_fills_its_default(toy, tmp_path: Path) -> None:
    spec = load(_toy_file(tmp_path, f'kind = "{KIND}"')).spec
    assert spec.objective.toy_rate == 0.25


def test_toy_rate_out_of_range_is_refused_at_its_plain_key(toy, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rate = 1.5'))
    issues = _issues(caught.value)
    assert list(issues) == ["objective.toy_rate"], issues
    assert "1.5" in issues["objective.toy_rate"] and "less than or equal to 1" in issues["objective.toy_rate"]


def test_toy_rate_of_the_wrong_type_exits_2_naming_the_key(toy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rate = "fast"')
    assert main(["validate", "--json", str(path)]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    text = captured.out
    assert "objective.toy_rate" in text and f"objective.{KIND}" not in text
    assert "valid number" in text and "unknown key" not in text  # its own model's message, not a stray key


def test_toy_key_is_unknown_to_mdm(toy, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, 'kind = "mdm"\ntoy_rate = 0.5'))
    issues = _issues(caught.value)
    assert list(issues) == ["objective.toy_rate"], issues
    assert "unknown key" in issues["objective.toy_rate"].lower() or "not permitted" in issues["objective.toy_rate"]
    assert main(["validate", str(_toy_file(tmp_path, "toy_rate = 0.5"))]) == EXIT_USAGE  # kind unset: mdm
    assert "objective.toy_rate" in "".join(capsys.readouterr())


def test_builtin_errors_keep_their_plain_keys_while_a_toy_is_registered(toy, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, 'kind = "mdm"\nmask_token_id = -1'))
    assert list(_issues(caught.value)) == ["objective.mask_token_id"]
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, 'kind = "nope"'))
    issues = _issues(caught.value)
    assert list(issues) == ["objective.kind"] and KIND in issues["objective.kind"] and "'mdm'" in issues["objective.kind"]


def test_toy_kind_and_key_are_refused_once_unregistered(tmp_path: Path) -> None:
    objectives.register(ToyRateObjective())
    objectives.unregister(KIND)
    assert models.Spec.model_fields["objective"].annotation is models.ObjectiveSpec
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rate = 0.5'))
    assert "objective.kind" in _issues(caught.value)


def test_spec_model_that_is_not_an_objective_spec_is_refused() -> None:
    class Stray(objectives.Objective):
        kind = "toy-stray"
        spec_model = dict

    with pytest.raises(TypeError, match="spec_model must subclass"):
        objectives.register(Stray())
    assert "toy-stray" not in objectives.kinds()
    assert models.Spec.model_fields["objective"].annotation is models.ObjectiveSpec


def test_toy_typo_suggests_the_toy_key_and_a_bad_value_its_default(toy, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rat = 0.5'))
    (issue,) = caught.value.issues
    assert (issue.key, issue.hint) == ("objective.toy_rat", "did you mean 'toy_rate'?")
    assert issue.line == 6  # the line the user wrote it on
    with pytest.raises(SpecError) as caught:
        load(_toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rate = 0'))
    (issue,) = caught.value.issues
    assert issue.key == "objective.toy_rate" and "toy_rate = 0.25" in issue.hint and issue.line == 6


def test_toy_spec_round_trips_through_replace_and_assignment(toy, tmp_path: Path) -> None:
    spec = load(_toy_file(tmp_path, f'kind = "{KIND}"\ntoy_rate = 0.5')).spec
    changed = spec.replace(**{"objective.toy_rate": 0.75})
    assert isinstance(changed.objective, ToyObjectiveSpec) and changed.objective.toy_rate == 0.75
    back = changed.model_copy()
    back.objective = {"kind": "mdm"}  # assignment validates through the same union
    assert type(back.objective) is models.ObjectiveSpec and back.objective.kind == "mdm"
    assert models.Spec.model_validate(changed.model_dump()).objective == changed.objective
    with pytest.raises(ValueError, match="toy_rate"):
        changed.objective.toy_rate = 2.0
    with pytest.raises(ValueError, match="kind"):
        ToyObjectiveSpec(kind="mdm")  # the toy's model takes the kinds registered with it only


def test_a_builtin_kind_may_take_a_spec_model_of_its_own(tmp_path: Path) -> None:
    class OwnAr(objectives.Objective):
        kind = "ar"
        attention = "causal"
        attentions = ("causal",)
        spec_model = ToyObjectiveSpec

    builtin = objectives.get("ar")
    objectives.register(OwnAr())
    try:
        spec = load(_toy_file(tmp_path, 'kind = "ar"\ntoy_rate = 0.5')).spec
        assert isinstance(spec.objective, ToyObjectiveSpec) and spec.objective.toy_rate == 0.5
        assert type(load(_toy_file(tmp_path, 'kind = "mdm"')).spec.objective) is models.ObjectiveSpec
    finally:
        objectives.register(builtin)
    assert models.Spec.model_fields["objective"].annotation is models.ObjectiveSpec
    with pytest.raises(SpecError, match="objective.toy_rate"):
        load(_toy_file(tmp_path, 'kind = "ar"\ntoy_rate = 0.5'))
