"""Settings and refusals of tensor-parallel colocated vLLM that need no vLLM: the size checked
when the engine is built, a group that cannot be formed named before vLLM starts, and the
requests' hand-back slices (the 2-process run with vLLM is tests/rollout/test_vllm_ddp.py)."""

from __future__ import annotations

import pytest

from lit_rlhf.rollout.vllm_support import check_tensor_parallel_size
from lit_rlhf.rollout.vllm_tp import TensorParallelGroup


@pytest.mark.parametrize("size", [0, -2, 1.5, True])
def test_a_size_below_one_or_not_an_int_is_refused(size):
    with pytest.raises(ValueError, match="tensor_parallel_size must be an int >= 1"):
        check_tensor_parallel_size(size, None)


def test_the_external_launchers_arguments_in_llm_kwargs_are_refused():
    with pytest.raises(ValueError, match="sets distributed_executor_backend, tensor_parallel"):
        check_tensor_parallel_size(
            1, {"tensor_parallel_size": 2, "distributed_executor_backend": "external_launcher"}
        )
    check_tensor_parallel_size(2, {"enforce_eager": True})  # other arguments pass


def test_a_group_in_a_process_alone_names_the_fix():
    with pytest.raises(ValueError, match="launch at least 2 processes"):
        TensorParallelGroup(2)


def test_a_size_that_does_not_divide_the_world_is_refused(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="does not divide the 1 training ranks"):
            TensorParallelGroup(2)
        group = TensorParallelGroup(1)  # a group of one: its own requests back
        requests, mine = group.gather(["a", "b"], (True, False))  # type: ignore[list-item]
        assert requests == ["a", "b"] and mine == slice(0, 2)
    finally:
        dist.destroy_process_group()
