"""Starting an engine on every rank as one step that all ranks agree on.

A colocated engine (vLLM) boots on every rank at its first rollout. If it fails on one rank (a
bad model path on one node, no memory left on one GPU, a vLLM build missing on one host), that
rank raises while the others, which booted, walk into the run's next collective (a gradient all-
reduce, a ZeRO-3 gather) and wait there for torch's collective timeout, 30 minutes by default,
with nothing in their logs. :func:`start_on_every_rank` meets all ranks right after the start
instead: every rank learns which ranks failed and why, and all of them stop at once with one
:class:`EngineStartError` naming the failed ranks and the first failure's message (the failing
rank chains its own error). A start that hangs (rather than raises) still holds the others until
the process group's timeout (``timeout`` of the strategy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from lit_rlhf.errors import SettingError

T = TypeVar("T")


class EngineStartError(SettingError, RuntimeError):
    """An engine's start failed on one or more ranks; every rank raises it (one line: the
    failed ranks, the first failure, the fix)."""


def start_on_every_rank(what: str, start: Callable[[], T]) -> T:
    """``start()`` on this rank, then an all-gather of every rank's outcome (see the module
    docstring); one process: ``start()`` as it is."""
    failure: str | None = None
    error: BaseException | None = None
    try:
        result = start()
    except Exception as err:  # reported to every rank below
        error = err
        failure = f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return result
    outcomes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, failure)
    failed = {rank: text for rank, text in enumerate(outcomes) if text}
    if failed:
        first = min(failed)
        raise EngineStartError(
            f"{what} failed on rank(s) {', '.join(map(str, sorted(failed)))} of {len(outcomes)} "
            f"(this is rank {dist.get_rank()}; rank {first}: {failed[first]}). Every rank stops "
            "here instead of waiting for the failed one in the next collective. Fix: the fix "
            f"the failure names, on rank {first}'s host"
        ) from error
    return result
