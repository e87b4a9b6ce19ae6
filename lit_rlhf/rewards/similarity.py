"""A chat reward that carries signal on a CPU: the cosine similarity between a completion's
sentence embedding and the row's reference answer.

MGS (arXiv 2602.02301) scores its chat domain with an 8B reward model; at CPU scale a trained RM
of that quality is out of reach, and an untrained one gives noise. The similarity of a response
to a reference answer (all-MiniLM-L6-v2 by default, shipped offline) is a cheap, deterministic
stand-in that varies with what a response says, so a group of samples of one prompt gets
different rewards (the variance GRPO needs). It rewards closeness to ONE reference, not
helpfulness in general: a deviation from the paper, stated where it is used (docs/multidomain.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.models.embedder import MINILM, TextEmbedder
from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.types import RewardOutput


class ReferenceSimilarityReward:
    """Cosine similarity of each completion to its row's reference answer, in sentence-embedding
    space (L2-normalised mean-pooled vectors, so the score lies in [-1, 1]).

    Args:
        embedder: the sentence encoder (``TextEmbedder``'s ``model``): hub id, folder or
            ``builtin:`` name; default all-MiniLM-L6-v2, shipped offline.
        reference_field: the row column holding the reference answer.
        max_chars: completions are cut to this many characters before embedding.
        empty_score: the score of an empty (whitespace-only) completion.
        max_length: tokens per embedded text.
        device: where the encoder runs (default CPU).

    Info: ``similarity`` (the raw cosine, equal to the score except for empty completions).
    The encoder loads on the first call, not here; reference embeddings are cached by text.
    """

    def __init__(
        self,
        embedder: str = MINILM,
        reference_field: str = "reference",
        max_chars: int = 4000,
        empty_score: float = 0.0,
        max_length: int = 256,
        device: str | None = None,
    ) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        if not reference_field:
            raise ValueError("reference_field must name the column of the reference answers")
        self.encoder = TextEmbedder(embedder, max_length=max_length, device=device)
        self.reference_field, self.max_chars = reference_field, max_chars
        self.empty_score = float(empty_score)
        self._cache: dict[str, torch.Tensor] = {}

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        references = [self._reference(row, i) for i, row in enumerate(rows)]
        missing = sorted({r for r in references if r not in self._cache})
        if missing:
            self._cache.update(zip(missing, self.encoder(missing), strict=True))
        texts = [c[: self.max_chars] for c in completions]
        empty = torch.tensor([not t.strip() for t in texts])
        answers = self.encoder([t if t.strip() else "." for t in texts])
        refs = torch.stack([self._cache[r] for r in references]) if references else answers
        similarity = (answers * refs).sum(dim=-1).clamp(-1.0, 1.0)
        scores = torch.where(empty, torch.tensor(self.empty_score), similarity)
        return RewardOutput(scores=scores.float(), info={"similarity": similarity.float()})

    def _reference(self, row: Mapping[str, Any], index: int) -> str:
        text = row.get(self.reference_field)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(
                f"row {index} (query {row.get('query_id', '?')!r}) has no reference answer in "
                f"{self.reference_field!r} (got {text!r:.60}). Fix: give every chat row a "
                "reference answer, or set reference_field= to the column that holds it."
            )
        return text
