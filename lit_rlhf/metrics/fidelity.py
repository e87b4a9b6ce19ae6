"""Compressor-decoder evaluation metrics (the size-fidelity paradox, arXiv 2602.09789), as
torchmetrics that reduce across processes:

- ``ReconstructionFidelity``: exact match, token F1, ROUGE-L F-measure and corpus BLEU-4 of
  reconstructions against their source contexts;
- ``EffectiveRank``: mean per-sample effective rank of the memory embeddings, and the effective
  rank of all memory vectors pooled (a bounded buffer);
- ``MeanTokenEntropy``: the decoder's teacher-forced token entropy, token-weighted.

The math lives in ``lit_rlhf.algos.compression``; these classes only accumulate it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric
from torchmetrics.functional.text.rouge import rouge_score
from torchmetrics.text import SacreBLEUScore

from lit_rlhf.algos.compression import (
    effective_rank,
    exact_match,
    pooled_effective_rank,
    token_entropy,
    token_f1,
)


class ReconstructionFidelity(nn.Module):
    """``update(predictions, references)`` per batch; ``compute()`` ->
    ``{"exact_match", "token_f1", "rougeL", "bleu"}`` over everything seen on every process.

    - exact_match, token_f1: means over samples (``lit_rlhf.algos.compression``; normalised).
    - rougeL: mean over samples of the ROUGE-L F-measure (longest common subsequence; torchmetrics'
      default lower-casing and alphanumeric tokenisation; no stemming, so no NLTK data needed).
    - bleu: corpus-level BLEU-4 (n-gram counts summed over all samples before the geometric
      mean, so a batch of short texts is not zeroed sentence by sentence), sacreBLEU's "13a"
      tokenisation (punctuation split off), case-sensitive, unsmoothed. A corpus with no
      matching 4-gram scores 0.
    """

    def __init__(self) -> None:
        super().__init__()
        self.exact_match = MeanMetric()
        self.token_f1 = MeanMetric()
        self.rouge_l = MeanMetric()
        self.bleu = SacreBLEUScore(n_gram=4, smooth=False, tokenize="13a", lowercase=False)

    def update(self, predictions: Sequence[str], references: Sequence[str]) -> None:
        """predictions: the decoder's reconstructions; references: the source contexts."""
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        if not predictions:
            return
        pairs = list(zip(predictions, references, strict=True))
        self.exact_match.update(torch.tensor([exact_match(p, r) for p, r in pairs]))
        self.token_f1.update(torch.tensor([token_f1(p, r) for p, r in pairs]))
        # the batch mean weighted by the batch size: sum states, so processes may hold different
        # numbers of samples (ROUGEScore's per-sample list states gather once per sample)
        batch_rouge = rouge_score(list(predictions), list(references), rouge_keys="rougeL")
        self.rouge_l.update(batch_rouge["rougeL_fmeasure"], weight=len(pairs))
        self.bleu.update(list(predictions), [[r] for r in references])

    def compute(self) -> dict[str, Tensor]:
        return {
            "exact_match": self.exact_match.compute(),
            "token_f1": self.token_f1.compute(),
            "rougeL": self.rouge_l.compute(),
            "bleu": self.bleu.compute(),
        }

    def reset(self) -> None:
        for metric in (self.exact_match, self.token_f1, self.rouge_l, self.bleu):
            metric.reset()


class EffectiveRank(Metric):
    """``update(z)`` with memory embeddings [B, k, d] (or one [k, d]); ``compute()`` ->
    ``{"effective_rank": mean per-sample erank, "pooled_effective_rank": erank of the pooled
    memory vectors}``.

    Pooling keeps a bounded buffer: each process stores the first ``max_vectors`` memory rows it
    sees (in fp32, detached) and ignores the rest; after the cross-process gather the pooled
    erank is over at most ``world_size * max_vectors`` rows. Since erank <= min(rows, d), compare
    pooled values only between runs with the same buffer size. NaN before any update; under
    torch.distributed every process must update at least once (an empty "cat" state cannot be
    gathered with the others).
    """

    full_state_update = False
    erank_sum: Tensor
    samples: Tensor
    vectors: list[Tensor]

    def __init__(self, *, max_vectors: int = 2048) -> None:
        super().__init__()
        if max_vectors < 1:
            raise ValueError(
                f"max_vectors must be >= 1 (rows kept for the pooled erank), got {max_vectors}"
            )
        self.max_vectors = max_vectors
        self.add_state("erank_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("samples", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("vectors", default=[], dist_reduce_fx="cat")

    def update(self, z: Tensor) -> None:
        if z.dim() == 2:
            z = z.unsqueeze(0)
        if z.dim() != 3:
            raise ValueError(f"z must be [B, k, d] or [k, d], got shape {tuple(z.shape)}")
        self.erank_sum += effective_rank(z).sum()
        self.samples += z.shape[0]
        room = self.max_vectors - sum(v.shape[0] for v in self.vectors)
        if room > 0:
            self.vectors.append(z.detach().reshape(-1, z.shape[-1])[:room].float())

    def compute(self) -> dict[str, Tensor]:
        state: list[Tensor] | Tensor = self.vectors  # a "cat" state is one tensor once synced
        if isinstance(state, list):
            vectors = torch.cat(state) if state else self.erank_sum.new_empty(0)
        else:
            vectors = state
        nan = torch.tensor(float("nan"), device=self.erank_sum.device)
        return {
            "effective_rank": self.erank_sum / self.samples if self.samples else nan,
            "pooled_effective_rank": pooled_effective_rank(vectors) if vectors.numel() else nan,
        }


class MeanTokenEntropy(Metric):
    """``update(logits [B, T, V], mask [B, T] bool)``; ``compute()`` -> the mean entropy (nats)
    over every counted token seen (token-weighted, as ``token_entropy``'s mean over one batch
    holding them all; NaN when none counted)."""

    full_state_update = False
    entropy_sum: Tensor
    tokens: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("entropy_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: Tensor, mask: Tensor) -> None:
        mean, _ = token_entropy(logits, mask)
        count = mask.sum()
        # nan_to_num: a batch with no counted token adds 0, without a host sync to test for it
        self.entropy_sum += torch.nan_to_num(mean, nan=0.0) * count
        self.tokens += count

    def compute(self) -> Tensor:
        return self.entropy_sum / self.tokens
