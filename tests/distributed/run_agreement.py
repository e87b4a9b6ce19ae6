"""``python -m tests.distributed.run_agreement OUT``: 2 processes (gloo, a file rendezvous) start
an "engine" through ``start_on_every_rank``; rank 1's start raises. Each rank writes what it
got to ``OUT.rank<r>.txt`` and the seconds from its start's end to the error."""

from __future__ import annotations

import datetime
import sys
import time

import torch.distributed as dist
import torch.multiprocessing as mp

from lit_rlhf.rollout.agreement import start_on_every_rank


def _worker(rank: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}.init", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    try:

        def start() -> str:
            if rank == 1:
                raise FileNotFoundError("no model folder /models/missing. Fix: check `model:`")
            return "engine"

        begin = time.monotonic()
        try:
            got = start_on_every_rank("the engine's start", start)
        except Exception as err:  # the outcome is what the test reads
            got = f"{type(err).__name__}: {err} [cause: {type(err.__cause__).__name__}]"
        with open(f"{out}.rank{rank}.txt", "w") as f:
            f.write(f"{time.monotonic() - begin:.2f}\n{got}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(_worker, args=(sys.argv[1],), nprocs=2, join=True)
