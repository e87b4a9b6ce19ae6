"""A timing probe for :mod:`lit_rlhf.measure.asynchrony`: a callback that times each training
batch of an RL module run by ``lit-rlhf fit`` and logs it beside the module's own metrics
(``--trainer.callbacks+=lit_rlhf.measure.step_clock.StepClock``).

Logged per training batch (one row of ``metrics.csv`` with the module's metrics of the batch):

- ``measure/batch``: the batch's index in the epoch (fill batches of one-step-off training log
  no optimizer step, so Lightning's ``step`` does not tell batches apart);
- ``measure/step_s``: wall seconds from the end of the previous batch (``on_train_batch_end``;
  the first batch: from its ``on_train_batch_start``) to the end of this one: everything the
  training loop does for the batch, data loading and logging included;
- ``measure/generate_s``: seconds of the rollout collector's ``generate`` calls (the engine's
  generation, unscored: what ``time/generate_s`` times in the overlapped paths) that ended during
  the batch, in any thread;
- ``measure/update_s``: seconds in the module's ``update`` (old / reference log-probs,
  advantages, the optimizer steps, logging), less the weight pushes made inside it;
- ``measure/sync_s``: seconds of the engine's ``sync_weights`` calls that ended during the batch.

The probe wraps those three methods on the module's own objects at the start of training; it
changes no value they return.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from lightning import Callback

Span = tuple[float, float]


class StepClock(Callback):
    """Per-batch wall time and the time in generation, update and weight push (see the module)."""

    def __init__(self) -> None:
        self._spans: dict[str, list[Span]] = {"generate": [], "update": [], "sync": []}
        self._lock = threading.Lock()
        self._last_end: float | None = None
        self._start = 0.0

    def _timed(self, key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._spans[key].append((start, time.perf_counter()))

        return timed

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        collector = getattr(pl_module, "rollouts", None)
        engine = getattr(collector, "engine", None)
        if collector is None or engine is None or not hasattr(pl_module, "update"):
            raise TypeError(
                f"StepClock times an RL module's rollouts and update; {type(pl_module).__name__} "
                "has no rollout collector with an engine. Fix: use it with PPOModule-style "
                "modules (lit_rlhf.modules.PPOModule)"
            )
        collector.generate = self._timed("generate", collector.generate)
        engine.sync_weights = self._timed("sync", engine.sync_weights)
        pl_module.update = self._timed("update", pl_module.update)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        end = time.perf_counter()
        begin = self._start if self._last_end is None else self._last_end
        self._last_end = end
        with self._lock:
            spans = {key: list(value) for key, value in self._spans.items()}
            for value in self._spans.values():
                value.clear()
        syncs = spans["sync"]
        in_update = sum(
            b - a for a, b in syncs if any(u0 <= a and b <= u1 for u0, u1 in spans["update"])
        )
        stats = {
            "measure/batch": float(batch_idx),
            "measure/step_s": end - begin,
            "measure/generate_s": _total(spans["generate"]),
            "measure/update_s": _total(spans["update"]) - in_update,
            "measure/sync_s": _total(syncs),
        }
        pl_module.log_dict(stats, on_step=True, on_epoch=False, batch_size=1)


def _total(spans: list[Span]) -> float:
    return sum(end - start for start, end in spans)


__all__ = ["StepClock"]
