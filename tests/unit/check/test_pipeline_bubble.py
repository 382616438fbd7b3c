"""The ``pipeline-bubble`` rule counts interleaved (virtual) stages: the bubble of the
interleaved 1F1B schedule is (PP - 1) / (VPP x microbatches) (Narayanan et al. 2021, sec. 2.2.2),
so a layout ``dlmspec plan --search`` ranks first (and ``dlmspec new`` writes) is not warned
about a bubble it does not have."""

from __future__ import annotations

from dlmspec.check import issues_for
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text
from small_spec import SMALL_SPEC


def bubble_issues(**changes):
    spec = load_text(SMALL_SPEC).spec.replace(**changes)
    return [i for i in issues_for("spec", spec, resolve(spec)) if i.rule == "pipeline-bubble"]


LAYOUT = {"cluster.gpus_per_node": 4, "parallel.pipeline_model_parallel_size": 4, "train.micro_batch_size": 1,
          "train.global_batch_size": 4}


def test_interleaved_stages_shrink_the_bubble_below_the_warning() -> None:
    # 4 microbatches over 4 stages: 75% without interleaving, 3 / (4 x 4) = 19% with 4 virtual stages
    assert bubble_issues(**LAYOUT, **{"parallel.virtual_pipeline_model_parallel_size": 4}) == []


def test_plain_pipeline_bubble_still_warns() -> None:
    (issue,) = bubble_issues(**LAYOUT)
    assert "75%" in issue.message and issue.severity == "warning"
