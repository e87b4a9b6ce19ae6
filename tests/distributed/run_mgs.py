"""One MGS optimizer step of tests/mgs_fixtures.TaskModule, written to OUT as the final weights:

    python -m tests.distributed.run_mgs single|ddp|fsdp2|zero1|zero2|zero3|authors GRANULARITY OUT

``single``: one process, all eight rows. ``ddp``: Lightning DDP on 2 CPU processes (gloo), four
rows each. ``fsdp2``: FSDP2 on 2 CPU processes, the network sharded (each rank holds half of
every parameter and of every domain's gradient). ``zero1`` / ``zero2``: the same under DeepSpeed
ZeRO-1 / ZeRO-2 (the CPU DeepSpeed strategy; ZeRO-1/2 keep the full parameters on every rank).
``zero3``: expected to be refused at setup (the refusal message is written to OUT.refused).
``authors``: 2 processes that average the gradients across ranks BEFORE splitting them by domain
(each rank's k-th domain slot averaged with the other rank's k-th, whatever the domains are),
the order of the authors' code, then the same surgery and SGD step.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from lit_rlhf.algos.gradient_surgery import group_parameters, surgery
from lit_rlhf.callbacks import ModularGradientSurgery
from lit_rlhf.strategies import CPUDeepSpeedStrategy, FSDP2Strategy, shutdown_distributed
from lit_rlhf.training.sharding import shard_networks
from tests.mgs_fixtures import TaskData, TaskModule, loader

SEED = 7


def _strategy(mode: str) -> Any:
    if mode.startswith("zero"):
        return CPUDeepSpeedStrategy(stage=int(mode[-1]))
    if mode == "fsdp2":
        return FSDP2Strategy()
    return "ddp" if mode == "ddp" else "auto"


class ShardedTaskModule(TaskModule):
    """The fixture's module with its network sharded under FSDP2 (as lit-rlhf's modules do in
    ``configure_model``)."""

    def configure_model(self) -> None:
        shard_networks(self.trainer.strategy, self.net)


def lightning_step(mode: str, granularity: str, out: Path) -> None:
    module = ShardedTaskModule() if mode == "fsdp2" else TaskModule()
    trainer = L.Trainer(
        accelerator="cpu", devices=1 if mode == "single" else 2,
        strategy=_strategy(mode), max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModularGradientSurgery(granularity=granularity, seed=SEED)],
    )  # fmt: skip
    try:
        trainer.fit(module, loader(batch_size=8 if mode == "single" else 4))
        weights = {  # FSDP2: gathered in full (a collective, before the group goes)
            n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in module.named_parameters()
        }
    except NotImplementedError as refused:
        if mode != "zero3":
            raise
        out.with_suffix(".refused").write_text(str(refused))
        return
    finally:
        shutdown_distributed()
    torch.save(weights, out.with_suffix(f".rank{trainer.global_rank}.pt"))


def _authors_worker(rank: int, granularity: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    try:
        module, data = TaskModule(), TaskData()
        rows = list(range(rank, len(data), 2))  # what DDP's sampler gives this rank
        local: list[dict[str, torch.Tensor]] = []
        for task in sorted({data.tasks[i] for i in rows}):  # this rank's domains, in order
            module.zero_grad()
            mine = [i for i in rows if data.tasks[i] == task]
            pred = module.net(data.x[mine]).squeeze(-1)
            (((pred - data.y[mine]) ** 2).sum() / len(rows)).backward()
            local.append({n: p.grad.clone() for n, p in module.named_parameters()})
        slots: dict[str, dict[str, torch.Tensor]] = {}
        for k, grads in enumerate(local):  # slot k averaged across ranks, domains mixed
            for g in grads.values():
                dist.all_reduce(g)
                g /= 2
            slots[f"slot{k}"] = grads
        names = [n for n, _ in module.named_parameters()]
        groups = group_parameters(names, granularity)  # type: ignore[arg-type]
        generator = torch.Generator().manual_seed(SEED * 1_000_003)
        combined, _ = surgery(slots, groups, generator=generator)
        weights = {n: p.detach() - module.lr * combined[n] for n, p in module.named_parameters()}
        torch.save(weights, f"{out}.rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mode, granularity, target = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if mode == "authors":
        mp.spawn(_authors_worker, args=(granularity, str(target)), nprocs=2, join=True)
    else:
        lightning_step(mode, granularity, target)
