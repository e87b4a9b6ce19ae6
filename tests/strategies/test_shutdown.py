"""``shutdown_distributed``: the orderly end of a run that every CLI process goes through."""

from __future__ import annotations

import torch.distributed as dist

from lit_rlhf.strategies import shutdown_distributed


def test_destroys_the_default_group_and_is_a_no_op_without_one(tmp_path):
    assert shutdown_distributed() is False
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    assert dist.is_initialized()
    assert shutdown_distributed() is True
    assert not dist.is_initialized()
    assert shutdown_distributed() is False
