"""The generation-engine protocol. The PPO module talks to engines only through this."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from lit_rlhf.errors import SettingError
from lit_rlhf.shapes import ByShape, missing_methods
from lit_rlhf.types import GenerationOutput


@runtime_checkable
class GenerationEngine(Protocol):
    """Samples responses for a left-padded prompt batch.

    ``temperature`` is read by the PPO module so that the log-probs it recomputes for the update
    come from the same (tempered) distribution the engine sampled from.

    ``log_probs=False`` says the caller does not need the sampled tokens' log-probs (the PPO
    module with one update per rollout takes them from its own forward); an engine may then skip
    computing them and return ``log_probs=None``.

    ``max_new_tokens`` caps one call below the engine's own ``max_new_tokens`` (the multi-turn
    loop's per-turn budgets); None: the engine's cap (:func:`call_budget`). An engine without the
    keyword is called without it and its output is cut by the caller.
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
        log_probs: bool = True,
        max_new_tokens: int | None = None,
    ) -> GenerationOutput: ...

    def sync_weights(self, model: nn.Module) -> None:
        """Make the engine serve ``model``'s current weights (called after every optimizer step)."""
        ...


class GenerationEngineLike(ByShape):
    """The type the CLI checks an ``engine`` against: any class with callable ``generate`` and
    ``sync_weights`` (annotated or not) passes ``issubclass(cls, GenerationEngineLike)``; see
    :mod:`lit_rlhf.shapes`. ``temperature`` is an instance attribute, not checked here."""

    methods = ("generate", "sync_weights")
    temperature: float

    @abstractmethod
    def generate(
        self,
        model: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor,
        tokenizer: Any,
        *,
        greedy: bool = False,
        log_probs: bool = True,
        max_new_tokens: int | None = None,
    ) -> GenerationOutput: ...

    @abstractmethod
    def sync_weights(self, model: nn.Module) -> None: ...


def engine_refusal(engine: Any) -> str | None:
    """Why ``engine`` (an object or a class) is not a generation engine, naming the missing
    method and the class, with the fix; None when it has callable ``generate`` and
    ``sync_weights``."""
    missing = missing_methods(engine, GenerationEngineLike.methods)
    if not missing:
        return None
    cls = engine if isinstance(engine, type) else type(engine)
    lacks = " and ".join(f"{m}(...)" for m in missing)
    return (
        f"engine {cls.__module__}.{cls.__qualname__} has no method {lacks}; an engine needs "
        f"generate(model, input_ids, attention_mask, tokenizer, ...) and sync_weights(model). "
        f"Fix: add {lacks} to {cls.__qualname__}, or pass an engine by class path, e.g. "
        "lit_rlhf.rollout.HFGenerationEngine."
    )


class EngineContractError(SettingError, TypeError):
    """An engine without its methods, or whose ``generate`` returned what it must not."""

    setting = "model.init_args.engine"


def check_generation(out: Any, batch: int, engine: Any) -> None:
    """Refuse what ``engine.generate`` returned for ``batch`` prompts unless it is a
    :class:`GenerationOutput` of ``batch`` responses: ``response_ids`` [B, R], a bool
    ``response_mask`` of the same shape and ``log_probs`` of that shape (or None)."""
    name = type(engine).__qualname__
    ids = getattr(out, "response_ids", None)
    mask = getattr(out, "response_mask", None)
    log_probs = getattr(out, "log_probs", None)
    if not (isinstance(ids, Tensor) and ids.dim() == 2 and ids.shape[0] == batch):
        got = f"response_ids of shape {tuple(ids.shape)}" if isinstance(ids, Tensor) else out
        why = f"{name}.generate returned {got!r:.120} for {batch} prompts"
    elif not (isinstance(mask, Tensor) and mask.dtype == torch.bool and mask.shape == ids.shape):
        why = f"{name}.generate returned a response_mask that is not a bool [B, R] like its ids"
    elif log_probs is not None and tuple(log_probs.shape) != tuple(ids.shape):
        why = f"{name}.generate returned log_probs of another shape than its response_ids"
    else:
        return
    raise EngineContractError(
        f"{why}. Fix: return a lit_rlhf.types.GenerationOutput with response_ids [B, R] (B = "
        "the prompts given), a bool response_mask [B, R] and log_probs [B, R] or None"
    )


def check_sampling_args(
    max_new_tokens: int, temperature: float, top_p: float, top_k: int = 0
) -> None:
    """Validate the sampling settings every engine shares, with messages that say the fix."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not 0 < temperature < float("inf"):  # also refuses NaN
        raise ValueError(
            f"temperature must be > 0, got {temperature}; for greedy decoding call "
            "generate(..., greedy=True) instead"
        )
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1.0 disables it), got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")


def call_budget(engine_cap: int, requested: int | None) -> int:
    """The new tokens one ``generate`` call may sample: ``requested`` (>= 1) capped by the
    engine's ``max_new_tokens``; None: the engine's cap."""
    if requested is None:
        return engine_cap
    if requested < 1:
        raise ValueError(f"max_new_tokens for one call must be >= 1, got {requested}")
    return min(int(requested), engine_cap)


def ranks_in_lockstep(synced_gpus: bool | None) -> bool:
    """Whether decoding must run every step on every rank: ``synced_gpus`` if set, else on when
    a process group with more than one rank is initialised (ZeRO-3 shards need all ranks)."""
    if synced_gpus is not None:
        return synced_gpus
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Run a block with ``model`` in eval mode (no dropout) and restore its mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)
