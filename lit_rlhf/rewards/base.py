"""The reward protocol: every reward in lit-rlhf (and any user reward) is a callable of this shape.

Rewards are injected by class path in YAML; the PPO module never imports a concrete reward.
Completions are untrusted model output: a reward must never ``eval``/``exec`` them and must bound
the time it spends on one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from lit_rlhf.types import RewardOutput


@runtime_checkable
class RewardFunction(Protocol):
    """Scores a batch of completions.

    Args:
        prompts: [B] rendered prompt texts.
        completions: [B] decoded response texts.
        rows: [B] the data rows the prompts came from (targets, reference answers, ...).

    Returns:
        RewardOutput with ``scores`` [B] float32 and optional per-sample ``info`` tensors [B].
    """

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput: ...


def component_states(rewards: Mapping[str, object]) -> dict[str, Any]:
    """The ``state_dict()`` of each stateful reward in ``rewards`` (name -> reward): what a
    reward made of other rewards puts into a checkpoint (e.g. ``ScalarRMReward``'s running
    mean inside ``RewardByTask``)."""
    return {
        name: reward.state_dict()  # type: ignore[attr-defined]
        for name, reward in rewards.items()
        if callable(getattr(reward, "state_dict", None))
    }


def load_component_states(rewards: Mapping[str, object], states: Mapping[str, Any]) -> None:
    """The reverse of :func:`component_states`."""
    for name, state in states.items():
        load = getattr(rewards.get(name), "load_state_dict", None)
        if callable(load):
            load(state)


def check_batch_lengths(
    prompts: Sequence[str], completions: Sequence[str], rows: Sequence[Any]
) -> None:
    """Raise a clear error when a reward's three batch arguments disagree in length."""
    if not len(prompts) == len(completions) == len(rows):
        raise ValueError(
            f"prompts, completions and rows must have the same length, got "
            f"{len(prompts)}, {len(completions)}, {len(rows)}"
        )
