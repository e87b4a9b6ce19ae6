"""The gradient accessor (lit_rlhf.training.Gradients) under FSDP2 on 2 gloo processes: ``get``
gathers the DTensor shards into the full averaged gradient, ``set`` writes back each rank's
shard of a new full gradient (what gradient hooks such as MGS's do)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from tests.distributed.launch import run_python

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # about 12 s (spawned processes)


def _network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _inputs(rank: int) -> torch.Tensor:
    return torch.arange(6.0).reshape(2, 3) * (rank + 1) / 10


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from lit_rlhf.training import Gradients

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        net = _network()
        fully_shard(net, mesh=init_device_mesh("cpu", (2,)))
        net(_inputs(rank)).square().mean().backward()
        grads = Gradients(net)
        assert all(isinstance(p.grad, DTensor) for p in net.parameters())
        full = dict(grads.items())
        for name, grad in full.items():
            grads.set(name, 3 * grad)
        local = {n: p.grad.to_local().clone() for n, p in net.named_parameters()}
        after = dict(grads.items())
        torch.save({"full": full, "after": after, "local": local}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_gradients_gather_and_write_back_dtensor_shards(tmp_path: Path) -> None:
    run_python("-m", "tests.distributed.test_fsdp2_gradients", str(tmp_path), timeout=120)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    # the reference: the mean of both ranks' gradients on one unsharded copy
    expected = {}
    for rank in (0, 1):
        net = _network()
        net(_inputs(rank)).square().mean().backward()
        for name, p in net.named_parameters():
            expected[name] = expected.get(name, 0) + p.grad / 2
    for result in ranks:
        torch.testing.assert_close(result["full"], expected)  # plain tensors, full shapes
        torch.testing.assert_close(result["after"], {k: 3 * v for k, v in expected.items()})
    # each rank keeps its own half of the rows of the new gradient
    for name, grad in expected.items():
        rows = torch.cat([ranks[0]["local"][name], ranks[1]["local"][name]])
        torch.testing.assert_close(rows, 3 * grad)


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(_worker, args=(str(Path(out) / "init"), out), nprocs=2, join=True)
