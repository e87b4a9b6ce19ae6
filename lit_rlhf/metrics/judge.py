"""Evaluation metrics of a pairwise judge, as torchmetrics (they reduce across processes).

- pairwise accuracy: the final verdict equals the gold label (a tie or no valid verdict is wrong);
- positional consistency: a pair family (both orders of one pair) is judged correctly in every
  order it was shown in, over the families seen in at least two orders (the position-bias
  measure of ReflectRM arXiv 2604.07506);
- format-valid rate: the fraction of all sampled judge outputs that parse;
- tie rate: the fraction of judgements whose votes tie (or that have no valid vote);
- per-subset accuracy (RewardBench's subsets, the synthetic generator's task kinds).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric

from lit_rlhf.metrics.grouped import GroupedMean


def majority_verdict(votes: Sequence[int | None]) -> int:
    """-1 / +1 by majority of the valid votes; 0 on a tie or when none is valid."""
    total = sum(v for v in votes if v is not None)
    return 0 if total == 0 else (1 if total > 0 else -1)


class PositionalConsistency(Metric):
    """Fraction of pair families judged correctly in every order shown (families seen in at least
    two orders only; NaN when there are none)."""

    full_state_update = False
    family: list[Tensor]
    correct: list[Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.add_state("family", default=[], dist_reduce_fx="cat")
        self.add_state("correct", default=[], dist_reduce_fx="cat")

    def update(self, families: Sequence[str], correct: Tensor) -> None:
        ids = [zlib.crc32(f.encode()) for f in families]
        self.family.append(torch.tensor(ids, dtype=torch.long, device=correct.device))
        self.correct.append(correct.bool())

    def compute(self) -> Tensor:
        family = _cat(self.family)
        correct = _cat(self.correct)
        if family.numel() == 0:
            return torch.tensor(float("nan"))
        uniq, inverse, counts = torch.unique(family, return_inverse=True, return_counts=True)
        wrong = torch.zeros(len(uniq), dtype=torch.long, device=family.device)
        wrong.index_add_(0, inverse, (~correct).long())
        both = counts >= 2
        if not both.any():
            return torch.tensor(float("nan"))
        return (wrong[both] == 0).float().mean()


def _cat(state: list[Tensor] | Tensor) -> Tensor:
    """A list state before sync, one tensor after torchmetrics' "cat" reduction."""
    return torch.cat(state) if isinstance(state, list) else state


class JudgeMetrics(nn.Module):
    """All judge metrics of one stage; ``update`` per batch, ``compute`` at the epoch's end."""

    def __init__(self) -> None:
        super().__init__()
        self.accuracy = MeanMetric()
        self.format_valid = MeanMetric()
        self.tie_rate = MeanMetric()
        self.positional = PositionalConsistency()
        self.subsets = GroupedMean()

    def update(
        self,
        votes: Sequence[Sequence[int | None]],
        labels: Sequence[int],
        families: Sequence[str],
        subsets: Sequence[str],
        verdicts: Sequence[int] | None = None,
    ) -> None:
        """votes: per judgement, the parsed verdict of each sample (None = invalid); labels: the
        gold -1 / +1; families: pair family ids; subsets: subset names ("" = none); verdicts:
        the final verdicts (-1 / +1, 0 = none), when not the majority of the votes (ReflectRM's
        reflective inference)."""
        if verdicts is None:
            verdicts = [majority_verdict(v) for v in votes]
        correct = torch.tensor([float(v == y) for v, y in zip(verdicts, labels, strict=True)])
        self.accuracy.update(correct)
        self.tie_rate.update(torch.tensor([float(v == 0) for v in verdicts]))
        self.format_valid.update(torch.tensor([float(x is not None) for v in votes for x in v]))
        self.positional.update(families, correct)
        named = [i for i, name in enumerate(subsets) if name]
        if named:
            self.subsets.update(correct[named], [subsets[i] for i in named])

    def compute(self) -> dict[str, Tensor]:
        out = {
            "accuracy": self.accuracy.compute(),
            "positional_consistency": self.positional.compute(),
            "format_valid": self.format_valid.compute(),
            "tie_rate": self.tie_rate.compute(),
        }
        for key, value in self.subsets.compute().items():
            out[f"accuracy/{key}"] = value
        return out

    def reset(self) -> None:
        for metric in (self.accuracy, self.format_valid, self.tie_rate, self.positional):
            metric.reset()
        self.subsets.reset()
