"""ReflectRM's two-stage reflective inference for a generative reward model (arXiv 2604.07506).

Stage 1: the judge writes N judgments of one pair; each gets a confidence (the mean log-prob of
its least likely tokens) and the most confident is the anchor. Stage 2: the judge compares every
other judgment's analysis with the anchor's (the analysis-preference task); the judgments
preferred over the anchor are the winners, and the final verdict is the majority of the winners'
verdicts, with the anchor's verdict joining when there are no winners or they tie. Verdicts are
-1 ("Response 1 is better") and +1 ("Response 2 is better").

Decisions the paper leaves open:
- "the lowest 10 %" of a judgment's n tokens is ceil(0.1 n) of them (at least one), computed
  exactly for fractions such as 0.1 (no float round-up: 30 tokens give 3, not 4);
- a judgment with no tokens has confidence -inf (it is never the anchor unless all are empty);
- ties in confidence go to the lowest index (the first rollout), so the anchor is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import torch
from torch import Tensor


def confidence(log_probs: Tensor, mask: Tensor, *, lowest_fraction: float = 0.1) -> Tensor:
    """Per rollout, the mean log-prob of its lowest ``lowest_fraction`` of tokens.

    Args:
        log_probs: ``[B, T]`` log-probs of the sampled tokens.
        mask: ``[B, T]``, true (or 1) on the judgment's tokens.
        lowest_fraction: in (0, 1]; ``ceil(fraction * n)`` tokens (at least one) of each row's
            ``n`` are averaged.

    Returns:
        ``[B]`` float confidences; ``-inf`` for a row without tokens.
    """
    if log_probs.shape != mask.shape or log_probs.dim() != 2:
        raise ValueError(
            f"log_probs and mask must both be [B, T]; got {tuple(log_probs.shape)} and "
            f"{tuple(mask.shape)}"
        )
    if not 0.0 < lowest_fraction <= 1.0:
        raise ValueError(f"lowest_fraction must be in (0, 1], got {lowest_fraction}")
    valid = mask.bool()
    # ascending, the padding (+inf) last: the first ``count`` entries are real tokens
    ordered = log_probs.float().masked_fill(~valid, math.inf).sort(dim=-1).values
    lengths = valid.sum(dim=-1)
    fraction = Fraction(str(lowest_fraction))  # exact: Fraction("0.1") * 30 == 3
    counts = torch.tensor(
        [max(1, math.ceil(fraction * n)) for n in lengths.tolist()], device=log_probs.device
    )
    sums = ordered.cumsum(dim=-1)
    means = sums.gather(-1, (counts - 1).unsqueeze(-1)).squeeze(-1) / counts
    return means.masked_fill(lengths == 0, -math.inf)


def select_anchor(confidence: Tensor) -> int:
    """The index of the most confident rollout (the lowest index among equals)."""
    if confidence.dim() != 1 or confidence.numel() == 0:
        shape = tuple(confidence.shape)
        raise ValueError(f"confidence must be a non-empty [N] tensor, got {shape}")
    if torch.isnan(confidence).any():
        raise ValueError("confidence holds NaN; the log-probs it came from are broken")
    best = confidence.max()
    return int((confidence == best).nonzero()[0, 0])


def reflective_vote(verdicts: Sequence[int], winners: Sequence[int], anchor: int) -> int:
    """The final verdict of two-stage reflective inference.

    Args:
        verdicts: every rollout's verdict, -1 or +1.
        winners: indices of the rollouts whose analysis was preferred over the anchor's.
        anchor: the anchor's index (not among the winners).

    Returns:
        The majority of the winners' verdicts; the anchor's verdict joins the vote when there
        are no winners or their vote ties (so the result is always -1 or +1).
    """
    if any(v not in (-1, 1) for v in verdicts):
        raise ValueError(f"verdicts must be -1 or +1, got {list(verdicts)}")
    n = len(verdicts)
    if not 0 <= anchor < n:
        raise ValueError(f"anchor {anchor} is not a rollout index (0..{n - 1})")
    if any(not 0 <= w < n for w in winners) or len(set(winners)) != len(winners):
        raise ValueError(f"winners must be distinct rollout indices in 0..{n - 1}, got {winners}")
    if anchor in winners:
        raise ValueError(f"the anchor ({anchor}) cannot be among the winners {list(winners)}")
    total = sum(verdicts[w] for w in winners)
    if total == 0:  # no winners, or a tie: the anchor decides
        total += verdicts[anchor]
    return 1 if total > 0 else -1
