"""The protocol of a model that scores given tokens without being trained: on-policy
distillation's teacher (``model.init_args.distill``).

The local implementation is :class:`lit_rlhf.training.teacher.FrozenTeacher` (a frozen causal LM
in the trainer's processes). A teacher served elsewhere (a ``vllm serve`` process asked for the
log-probs of prompt tokens, a remote API) implements the same one method:
:class:`lit_rlhf.rollout.ServedTeacher` asks ``vllm serve`` processes (``distill.teacher_urls``;
docs/algorithms.md, "On-policy distillation").
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from lit_rlhf.types import Rollout


@runtime_checkable
class TokenScorer(Protocol):
    """Per-token log-probs of the response tokens of a rollout under a fixed model."""

    def token_log_probs(self, rollout: Rollout, *, temperature: float) -> Tensor:
        """[B, R] float32: ``log p(response_ids[b, t] | prompt, response_ids[b, :t])`` of every
        response token, the logits divided by ``temperature`` (the student's sampling
        temperature, so that a teacher equal to the student scores exactly as the student);
        any value where ``rollout.response_mask`` is False (the caller masks them)."""
        ...
