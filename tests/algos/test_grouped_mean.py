"""GroupedMean: a mean per group, groups created as they appear (the per-task validation reward
of multi-domain PPO and the judge's per-subset accuracy; the 2-process sync is exercised by
tests/distributed/test_judge_metrics_ddp.py)."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.metrics import GroupedMean


def test_means_per_group_over_batches_and_reset() -> None:
    metric = GroupedMean()
    metric.update(torch.tensor([1.0, 0.0, 4.0]), ["math", "chat", "math"])
    metric.update(torch.tensor([2.0]), ["chat"])
    out = metric.compute()
    assert set(out) == {"chat", "math"}
    assert float(out["math"]) == pytest.approx(2.5) and float(out["chat"]) == pytest.approx(1.0)
    metric.update(torch.tensor([1.0]), ["v1.2"])  # dots are not allowed in module names
    assert "v1_2" in metric.compute()
    metric.reset()
    assert metric.compute() == {}
    with pytest.raises(ValueError, match="group names"):
        metric.update(torch.tensor([1.0, 2.0]), ["a"])
