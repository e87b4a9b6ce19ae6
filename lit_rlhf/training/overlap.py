"""One-step-off (``max_staleness: k``) training: the next prompt batch is generated in a
background thread while the update on an earlier batch runs.

``training_step`` s, with k = ``max_staleness`` >= 1:

1. Prompt batch s goes to a worker thread, which generates from the weights of this moment
   (weight version v = the updates done so far): a snapshot copy of the policy for engines that
   generate with the training network (HF ``generate``, the decode loop), the engine's own copy
   for engines that serve their own weights (vLLM, synced at the end of the previous step).
   Generation never reads weights the optimizer is writing.
2. Meanwhile the main thread takes the oldest rollout of the queue (batch s - k, sampled with
   version v - k + 1 or older; none during the first k steps, which only fill the queue) and
   updates on it with the decoupled PPO objective of AReaL (Fu et al. 2025, arXiv 2505.24298,
   eq. 5): the ratio is clipped against the proximal policy (the weights before this update,
   the trainer's old log-probs) and each token's loss is weighted by the truncated ratio
   ``pi_prox / mu`` of the proximal policy to the engine's ``mu`` (the mismatch correction,
   ``tis``; ``mask`` keeps the ratio inside the band and drops the tokens outside it instead).
3. The step waits for the worker, scores the generation in the main thread (rewards and
   reward-term callbacks never run beside the update), queues it with its weight version, and
   has the engine serve the new weights.

Between steps nothing runs in the background: checkpoints, validation and callbacks see a quiet
process, the queue (token ids, the engine's log-probs, scores, weight versions) goes into the
checkpoint and a resume is exact. The worker draws its samples from torch's global generator,
as the on-policy path does; the update draws none unless the trained network has dropout, so a
run is bitwise reproducible without dropout. Logged: ``rollout/staleness`` (updates between the
sampling weights and the update), ``time/generate_s``, ``time/update_s``, ``time/sync_s`` (the
engine's weight push after the step), ``time/wait_s`` (the
main thread waiting for the worker) and ``rollout/overlap`` (the share of the generation that
ran while the update did). With ``rollout.partial_rollouts`` the engine is given the new weights
without waiting for the worker (:mod:`lit_rlhf.training.partial`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.strategies import is_deepspeed
from lit_rlhf.types import GenerationOutput, Rollout

Generate = Callable[[nn.Module], GenerationOutput]
Score = Callable[[GenerationOutput], Rollout]


def serves_own_weights(engine: Any) -> bool:
    """Whether the engine generates from its own copy of the weights (vLLM), pushed by
    ``sync_weights``, rather than from the network it is given."""
    return bool(getattr(engine, "serves_own_weights", False))


class OverlappedRollouts:
    """The queue of generated, scored, not yet trained rollouts and the worker thread.

    Args:
        max_staleness: k >= 1, the rollouts generated ahead of the update (each update trains on
            a batch sampled k updates before it, after the first k steps).
    """

    def __init__(self, max_staleness: int) -> None:
        if max_staleness < 1:
            raise ValueError(
                f"max_staleness must be >= 1 here (0 is on-policy), got {max_staleness}"
            )
        self.max_staleness = max_staleness
        self.queue: list[Rollout] = []
        self.last_stats: dict[str, Tensor] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._snapshot: nn.Module | None = None

    # ----------------------------------------------------------------- settings
    def check(self, trainer: Any, engine: Any) -> None:
        """At setup, before any model loads: what cannot run beside the update."""
        strategy = getattr(trainer, "strategy", None)
        name = type(engine).__name__
        fast = getattr(trainer, "fast_dev_run", 0)
        fast = 1 if fast is True else int(fast or 0)
        if 0 < fast <= self.max_staleness:
            raise ValueError(
                f"fast_dev_run={fast} with max_staleness={self.max_staleness}: the first "
                f"{self.max_staleness} batches only generate, so this run would make no update. "
                f"Fix: fast_dev_run: {self.max_staleness + 1} (or more), or max_staleness: 0."
            )
        if not serves_own_weights(engine):
            sharded = (
                is_deepspeed(strategy) and bool(getattr(strategy, "zero_stage_3", False))
            ) or ("FSDP" in type(strategy).__name__)
            if sharded:
                raise ValueError(
                    f"max_staleness > 0 with {name} generates from a snapshot copy of the policy, "
                    f"and under {type(strategy).__name__} (sharded parameters) a rank holds no "
                    "whole copy. Fix: use the vLLM engine, a DDP / ZeRO-1/2 strategy, or "
                    "max_staleness: 0."
                )
            if (
                getattr(trainer, "world_size", 1) > 1
                and getattr(engine, "synced_gpus", None) is not False
            ):
                raise ValueError(
                    f"max_staleness > 0 runs {name}.generate in a background thread, and with "
                    "several ranks it would keep them in lock-step with collectives (synced_gpus) "
                    "beside the update's gradient all-reduce. Fix: set the engine's "
                    "synced_gpus: false (DDP needs no lock-step), or max_staleness: 0."
                )
            return
        if getattr(engine, "enable_sleep_mode", False):
            raise ValueError(
                "max_staleness > 0 keeps the engine generating while the update runs, and "
                "enable_sleep_mode releases its memory between rollouts. Fix: set the engine's "
                "enable_sleep_mode: false, or max_staleness: 0."
            )
        if getattr(engine, "truncates", False):
            raise ValueError(
                f"{name} with top_k / top_p takes the sampled tokens' log-probs from a forward of "
                "the policy, which would run beside the update on weights being written. Fix: "
                "top_k: 0 and top_p: 1.0 with max_staleness > 0, or max_staleness: 0."
            )

    # ----------------------------------------------------------------- one step
    @contextmanager
    def step(
        self, policy: nn.Module, engine: Any, version: int, generate: Generate, score: Score
    ) -> Iterator[Rollout | None]:
        """Start generating (``generate`` on the weights of weight ``version``); yield the
        rollout to update on (None while the queue fills); on exit wait for the worker, queue
        its scored rollout and sync the engine to the new weights."""
        model = self._weights(policy, engine)
        future = self._executor().submit(timed, generate, model)
        if first_use(engine):
            wait_for([future])  # built on first use from the policy: not beside an update
        ready = self.queue.pop(0) if len(self.queue) >= self.max_staleness else None
        if ready is not None and ready.weight_version is not None:
            staleness = float(version - ready.weight_version)
            ready.term_stats["rollout/staleness"] = torch.tensor(staleness)
        update_start = time.perf_counter()
        try:
            yield ready
        finally:
            update_end = time.perf_counter()
            wait_for([future])
        out, gen_start, gen_end = future.result()  # the worker's exception, if any, stops here
        rollout = score(out)
        rollout.weight_version = version
        self.queue.append(rollout)
        sync_start = time.perf_counter()
        engine.sync_weights(policy)
        hidden = max(0.0, min(gen_end, update_end) - max(gen_start, update_start))
        self.last_stats = {
            "time/generate_s": torch.tensor(gen_end - gen_start),
            "time/update_s": torch.tensor(update_end - update_start if ready else 0.0),
            "time/wait_s": torch.tensor(max(0.0, gen_end - update_end)),
            "time/sync_s": torch.tensor(time.perf_counter() - sync_start),
            "rollout/overlap": torch.tensor(hidden / max(gen_end - gen_start, 1e-9)),
        }

    def _executor(self) -> ThreadPoolExecutor:
        """The worker thread (one: generations run one after another)."""
        self._pool = self._pool or ThreadPoolExecutor(1, "lit-rlhf-rollout")
        return self._pool

    def left_out(self, rollout: Rollout, version: int) -> Tensor | None:
        """[B] bool: samples left out of the update at weight ``version`` for their staleness;
        None here (each batch is taken exactly k updates after its weights)."""
        return None

    def _weights(self, policy: nn.Module, engine: Any) -> nn.Module:
        """What the worker generates from: the policy itself for an engine serving its own
        weights (it reads the policy only when it is built), else a snapshot copy."""
        if serves_own_weights(engine):
            return policy
        with torch.no_grad():
            if self._snapshot is None:
                self._snapshot = copy.deepcopy(policy).requires_grad_(False)
                for param in self._snapshot.parameters():
                    param.grad = None
                return self._snapshot
            copies = zip(
                self._snapshot.state_dict().values(), policy.state_dict().values(), strict=True
            )
            for kept, live in copies:
                kept.copy_(live)
        return self._snapshot

    # ----------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"queue": [dataclasses.asdict(r) for r in self.queue]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        queue = [Rollout(**r) for r in state.get("queue", [])]
        if len(queue) > self.max_staleness:
            warnings.warn(
                f"the checkpoint holds {len(queue)} generated rollouts not yet trained on, more "
                f"than max_staleness={self.max_staleness}: the oldest "
                f"{len(queue) - self.max_staleness} are dropped",
                RuntimeWarning,
                stacklevel=2,
            )
            queue = queue[len(queue) - self.max_staleness :]
        self.queue = queue

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def first_use(engine: Any) -> bool:
    """Whether the engine serves its own weights and its next generate builds or starts it from
    the policy (``llm`` None: vLLM built on first use; ``started`` False: servers preflighted
    and given the full weights): that generate must not run beside an update."""
    if not serves_own_weights(engine):
        return False
    return getattr(engine, "llm", True) is None or getattr(engine, "started", True) is False


def timed(generate: Generate, model: nn.Module) -> tuple[GenerationOutput, float, float]:
    """``generate(model)`` with its start and end (``time.perf_counter``)."""
    start = time.perf_counter()
    out = generate(model)
    return out, start, time.perf_counter()


def unused_queue_warning(state: dict[str, Any]) -> None:
    """A checkpoint of a ``max_staleness`` run loaded with ``max_staleness: 0``: its generated,
    untrained rollouts are dropped (said once)."""
    queue = state.get("queue", [])
    if queue:
        warnings.warn(
            f"the checkpoint holds {len(queue)} rollouts generated ahead by a max_staleness run; "
            "with max_staleness: 0 they are dropped (their prompts are not trained on)",
            RuntimeWarning,
            stacklevel=2,
        )


__all__ = [
    "OverlappedRollouts",
    "first_use",
    "serves_own_weights",
    "timed",
    "unused_queue_warning",
]
