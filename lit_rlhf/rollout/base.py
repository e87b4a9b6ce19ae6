"""The generation-engine protocol. The PPO module talks to engines only through this."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from lit_rlhf.types import GenerationOutput


@runtime_checkable
class GenerationEngine(Protocol):
    """Samples responses for a left-padded prompt batch.

    ``temperature`` is read by the PPO module so that the log-probs it recomputes for the update
    come from the same (tempered) distribution the engine sampled from.
    """

    temperature: float

    def generate(
        self,
        model: nn.Module,
        input_ids: Tensor,  # [B, P] long, left-padded
        attention_mask: Tensor,  # [B, P] bool or long
        tokenizer: Any,
        *,
        greedy: bool = False,
    ) -> GenerationOutput: ...

    def sync_weights(self, model: nn.Module) -> None:
        """Make the engine serve ``model``'s current weights (called after every optimizer step)."""
        ...
