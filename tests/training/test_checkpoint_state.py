"""What a kill-and-resume needs from the core, in-process: GlobalRNGState carries the global
generators from batch to batch and through a checkpoint (loadable with ``weights_only=True``);
AtomicCheckpointIO leaves the previous file whole when a write fails midway, and the CLI uses it;
composite rewards checkpoint their stateful parts."""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lit_rlhf.rewards import RewardByTask, WeightedRewards
from lit_rlhf.training import AtomicCheckpointIO, GlobalRNGState
from tests.helpers import ConstantReward


def draws() -> tuple[list[float], float, float]:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand())


def test_global_rng_state_carries_the_draws_from_batch_to_batch_and_through_a_checkpoint() -> None:
    keeper = GlobalRNGState()
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    keeper.on_train_batch_start(None, None, None, 0)
    draws()  # batch 0
    keeper.on_train_batch_end(None, None)
    draws()  # between the batches: a validation that samples
    buffer = io.BytesIO()
    torch.save(keeper.state_dict(), buffer)  # a checkpoint taken after that validation
    keeper.on_train_batch_start(None, None, None, 1)
    expected = draws()  # batch 1 of the uninterrupted run: as if nothing ran in between
    keeper.on_train_batch_end(None, None)
    keeper.on_train_batch_start(None, None, None, 2)
    assert draws() != expected  # a later batch draws on

    torch.manual_seed(1), random.seed(1), np.random.seed(1)  # the resumed process, seeded anew
    resumed = GlobalRNGState()
    buffer.seek(0)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert draws() != expected  # loading alone sets nothing (the sanity check runs first)
    resumed.on_train_batch_start(None, None, None, 1)
    assert draws() == expected


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts: Any, completions: Any, rows: Any) -> Any:
        self.calls += 1
        return ConstantReward(1.0)(prompts, completions, rows)

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


@pytest.mark.parametrize("kind", ["by_task", "weighted"])
def test_composite_rewards_checkpoint_their_stateful_parts(kind: str) -> None:
    def build() -> tuple[Any, _Counter]:
        counter = _Counter()
        if kind == "by_task":
            return RewardByTask({"a": counter, "b": ConstantReward(0.0)}), counter
        return WeightedRewards([counter, ConstantReward(0.0)], names=["a", "b"]), counter

    reward, counter = build()
    reward(["p"], ["c"], [{"task": "a"}])
    reward(["p"], ["c"], [{"task": "a"}])
    restored, fresh = build()
    restored.load_state_dict(reward.state_dict())
    assert reward.state_dict() == {"a": {"calls": 2}} and fresh.calls == counter.calls == 2


def test_a_write_cut_short_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.ckpt"
    io_plugin = AtomicCheckpointIO()
    io_plugin.save_checkpoint({"global_step": 2}, path)

    def half_then_fail(obj: Any, f: Any) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        io_plugin.save_checkpoint({"global_step": 4}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True) == {"global_step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no temporary left


def test_the_cli_writes_checkpoints_atomically(monkeypatch: pytest.MonkeyPatch) -> None:
    from lit_rlhf.cli import cli_main

    monkeypatch.setattr(sys, "argv", ["lit-rlhf"])  # pytest's own arguments are not the CLI's
    config = Path(__file__).resolve().parents[2] / "configs" / "rm" / "bt_tiny.yaml"
    cli = cli_main(["--config", str(config), "--trainer.logger=false"], run=False)
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO
