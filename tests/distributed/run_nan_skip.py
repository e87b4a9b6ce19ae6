"""Three training steps of tests/training/test_faults.NaNRegression on 2 CPU processes, where
only rank 1's loss is NaN at step 1; each rank writes its step records to OUT.rank<r>.pt:

    python -m tests.distributed.run_nan_skip ddp|zero2 OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rlhf.strategies import CPUDeepSpeedStrategy, shutdown_distributed
from tests.training.test_faults import NaNRegression


def main(mode: str, out: Path) -> None:
    module = NaNRegression({1: "loss"}, fault_rank=1)
    strategy = CPUDeepSpeedStrategy(stage=2) if mode == "zero2" else "ddp"
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    try:
        trainer.fit(module, DataLoader(torch.zeros(6, 1)))  # 3 batches per rank
    finally:
        shutdown_distributed()
    records = [
        {"weights": {k: v for k, v in r.after.items() if k.startswith("weight/")}, **r.stats}
        for r in module.records
    ]
    torch.save(records, out.with_suffix(f".rank{trainer.global_rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
