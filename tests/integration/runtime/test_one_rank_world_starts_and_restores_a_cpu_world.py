"""The runtime's one-rank world (dlmspec.backends.megatron.distributed.one_rank_world), which the
benchmark scripts and the test kits build megatron-core models in:
on CPU it starts a gloo group of one rank with megatron-core's model-parallel state, answers "cpu"
for torch.cuda.current_device inside, and leaves torch.cuda and the process group as it found them;
a device it cannot start is refused by name."""

from __future__ import annotations

import pytest

from dlmspec.backends.megatron.distributed import one_rank_world


def test_a_cpu_world_has_one_rank_and_is_undone_on_exit(tmp_path):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    before = dist.is_initialized()
    current, synchronize = torch.cuda.current_device, torch.cuda.synchronize
    with one_rank_world("cpu", tmp_path):
        assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        assert parallel_state.model_parallel_is_initialized()
        assert parallel_state.get_tensor_model_parallel_world_size() == 1
        assert torch.cuda.current_device() == "cpu"
        torch.cuda.synchronize()  # a no-op on CPU
    assert not parallel_state.model_parallel_is_initialized()
    assert dist.is_initialized() == before
    assert (torch.cuda.current_device, torch.cuda.synchronize) == (current, synchronize)


def test_an_unknown_device_is_refused_naming_it():
    with pytest.raises(ValueError, match="device 'tpu'"):
        with one_rank_world("tpu"):
            pass
