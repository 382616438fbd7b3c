"""The RL rollout sampler takes [generate] cuda_graph from the spec (dlmspec.rl.rollout_values, what
stage_rl.py.j2 renders into build_rl()): on by default, and a spec that turns it off turns it off for the
rollouts too."""

from __future__ import annotations


def test_the_rollout_sampler_gets_the_specs_cuda_graph_setting():
    from dlmspec.rl import rollout_values
    from dlmspec.spec.models import GenerateSpec, RLSpec

    rl = RLSpec(prompts="p.jsonl")
    assert rollout_values(rl, GenerateSpec())["generate"]["cuda_graph"] is True
    assert rollout_values(rl, GenerateSpec(cuda_graph=False))["generate"]["cuda_graph"] is False
