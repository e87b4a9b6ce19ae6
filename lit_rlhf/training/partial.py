"""Fully asynchronous training with partial rollouts (``rollout.partial_rollouts: true`` with
``rollout.max_staleness: k`` >= 1): the engine gets the new weights after every update while
its requests are in flight, so a response may be sampled by two or more weight versions.

Needs an engine that serves its own weights and keeps its requests across a weight push
(``supports_partial_rollouts = True``, ``serves_own_weights = True``): its ``sync_weights`` may
run in the main thread while ``generate`` runs in the worker thread, and it tags every sampled
token with the label of the weights that sampled it (``GenerationOutput.token_versions``; the
trainer sets ``engine.weight_version`` before each push).

``training_step`` s, with v the updates done so far:

1. ``engine.weight_version = v``; prompt batch s is submitted to the worker thread (one thread:
   the generations run one after another, in submission order) and joins the queue of pending
   generations with its submission version v.
2. While the queue holds more than k, the oldest (batch s - k) is taken: the step waits for its
   generation (``time/wait_s``), scores it in the main thread and updates on it with the
   decoupled PPO objective (the mismatch correction ``tis``, the engine's per-token log-probs
   as mu, is what makes mixed-version samples correct: each token is weighted by the proximal
   policy over the weights that actually sampled it).
3. After the update, ``engine.weight_version = v + 1`` (v in the steps that only fill the queue)
   and ``engine.sync_weights(policy)`` (its duration is ``time/sync_s``); the generations in
   flight are not waited for and continue with the new weights.

Each sample's staleness is the version being updated minus the oldest version among its sampled
tokens (the submission version when the engine tags none). The bound holds per sample: a sample
more than k updates stale is left out of the update like a sample whose reward failed
(:mod:`lit_rlhf.training.reward_mask`; a group left with one sample goes with it). Each batch is
submitted at the version of its step and taken k steps later, so with tokens labelled as above
no sample exceeds k: the bound guards against an engine whose labels lag the weights it serves.

Logged: ``time/generate_s`` (the taken generation's duration), ``time/update_s``,
``time/wait_s``, ``time/sync_s``, ``rollout/overlap`` (the share of the taken generation that
ran beside updates), and per update ``rollout/staleness`` (by submission version),
``rollout/staleness_mean`` and ``rollout/staleness_max`` (per sample, from the token tags),
``rollout/stale_token_frac`` (response tokens sampled by a version older than the one being
updated), ``rollout/mixed_version_frac`` (samples whose tokens span more than one version) and
``rollout/stale_dropped`` (samples left out for staleness). Generation goes on between steps:
validation shares the engine with the generations in flight, and a run is not bitwise
reproducible. A checkpoint save waits for the generations in flight and scores them, so the
checkpoint holds finished, scored rollouts (token ids, log-probs, token versions) that a resume
trains on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lit_rlhf.training.overlap import (
    Generate,
    OverlappedRollouts,
    Score,
    first_use,
    serves_own_weights,
    timed,
)
from lit_rlhf.types import GenerationOutput, Rollout

_Timed = tuple[GenerationOutput, float, float]


@dataclass
class Pending:
    """A submitted generation: its future (None once finished), the scoring of its prompt
    batch, the weight version at submission and, once finished, its scored rollout and span."""

    future: Future[_Timed] | None
    score: Score | None
    version: int
    rollout: Rollout | None = None
    span: tuple[float, float] | None = None  # the generation's start and end (perf_counter)


class PartialRollouts(OverlappedRollouts):
    """The queue of pending generations of partial-rollout training (see the module).

    Args:
        max_staleness: k >= 1: the generations pending beside the update, and the per-sample
            staleness bound.
    """

    def __init__(self, max_staleness: int) -> None:
        super().__init__(max_staleness)
        self.pending: list[Pending] = []
        self._updates: list[tuple[float, float]] = []  # recent updates' spans
        self._labelled = False  # this run has pushed (or will push) weights with its labels

    def check(self, trainer: Any, engine: Any) -> None:
        """At setup: the engine must keep requests across a weight push, then the checks of
        one-step-off training."""
        supported = getattr(engine, "supports_partial_rollouts", False)
        if not (supported and serves_own_weights(engine)):
            cls = type(engine)
            raise ValueError(
                f"rollout.partial_rollouts pushes new weights into the engine while its requests "
                f"are in flight, and the engine {cls.__module__}.{cls.__qualname__} does not "
                "keep requests across a push (it lacks supports_partial_rollouts = True and "
                "serves_own_weights = True). Fix: use an engine that has both (and tags tokens "
                "with token_versions), or set model.init_args.rollout.partial_rollouts: false."
            )
        super().check(trainer, engine)

    @contextmanager
    def step(
        self, policy: nn.Module, engine: Any, version: int, generate: Generate, score: Score
    ) -> Iterator[Rollout | None]:
        """Submit ``generate`` (weights labelled ``version``); yield the oldest pending
        generation, finished and scored, once more than k are pending (else None); on exit push
        the updated weights, labelled ``version + 1`` after an update (the module counts one
        per yielded rollout), without waiting for the generations in flight. The first step of
        a run resumed at ``version`` > 0 whose engine is already started (by validation) pushes
        the weights again first, so its tokens carry this run's labels."""
        engine.weight_version = version
        if not self._labelled and version > 0 and not first_use(engine):
            engine.sync_weights(policy)  # resumed, engine started (validation) with label 0
        self._labelled = True
        future = self._executor().submit(timed, generate, policy)
        self.pending.append(Pending(future, score, version))
        waited = 0.0
        if first_use(engine):  # it pushes the policy's weights: not beside an update
            waited += _waited(future)
        ready, span = None, None
        if len(self.pending) > self.max_staleness:
            taken = self.pending.pop(0)
            waited += 0.0 if taken.future is None else _waited(taken.future)
            ready, span = self._finish(taken), taken.span
            ready.term_stats.update(staleness_stats(ready, version, self.max_staleness))
        update_start = time.perf_counter()
        yield ready
        update_end = time.perf_counter()
        if ready is not None:
            self._updates = [*self._updates[-self.max_staleness - 1 :], (update_start, update_end)]
        engine.weight_version = version + (ready is not None)
        engine.sync_weights(policy)
        synced = time.perf_counter()
        self.last_stats = self._stats(span, update_end - update_start if ready else 0.0)
        self.last_stats["time/wait_s"] = torch.tensor(waited)
        self.last_stats["time/sync_s"] = torch.tensor(synced - update_end)

    def _finish(self, entry: Pending) -> Rollout:
        """The entry's rollout: its generation waited for and scored (once)."""
        if entry.rollout is None:
            assert entry.future is not None and entry.score is not None
            out, start, end = entry.future.result()  # the worker's exception, if any
            entry.rollout = entry.score(out)
            entry.rollout.weight_version = entry.version
            entry.future, entry.score, entry.span = None, None, (start, end)
        return entry.rollout

    def _stats(self, span: tuple[float, float] | None, update_s: float) -> dict[str, Tensor]:
        generate_s = hidden = 0.0
        if span is not None:
            start, end = span
            generate_s = end - start
            for u_start, u_end in self._updates:
                hidden += max(0.0, min(end, u_end) - max(start, u_start))
        return {
            "time/generate_s": torch.tensor(generate_s),
            "time/update_s": torch.tensor(update_s),
            "rollout/overlap": torch.tensor(min(1.0, hidden / max(generate_s, 1e-9))),
        }

    def left_out(self, rollout: Rollout, version: int) -> Tensor | None:
        """[B] bool: the samples more than ``max_staleness`` updates older than ``version`` (the
        version being updated), left out of the update; None when there are none."""
        if rollout.weight_version is None and rollout.token_versions is None:
            return None
        stale = sample_staleness(rollout, version) > self.max_staleness
        return stale if bool(stale.any()) else None

    # ----------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The pending generations, each waited for and scored first: a save waits for the
        requests in flight, and the checkpoint holds finished, scored rollouts."""
        return {"queue": [dataclasses.asdict(self._finish(e)) for e in self.pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)  # the rollouts, the oldest beyond k dropped (warned)
        self.pending = [Pending(None, None, r.weight_version or 0, rollout=r) for r in self.queue]
        self.queue = []

    def close(self) -> None:
        """Stop the worker: generations not started are cancelled, the running one finishes."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _waited(future: Future[_Timed]) -> float:
    """Seconds spent waiting for ``future``."""
    start = time.perf_counter()
    wait_for([future])
    return time.perf_counter() - start


def _sampled(rollout: Rollout) -> Tensor:
    """[B, R] bool: the response tokens the policy sampled."""
    mask = rollout.response_mask
    return mask if rollout.agent_mask is None else mask & rollout.agent_mask


def _tags(rollout: Rollout, version: int) -> tuple[Tensor, Tensor]:
    """([B, R] long versions, [B, R] bool tagged): each sampled token's version; the
    submission version (else ``version``) for an engine that tags none."""
    sampled = _sampled(rollout)
    tags = rollout.token_versions
    if tags is None:
        base = version if rollout.weight_version is None else rollout.weight_version
        return torch.full_like(sampled, base, dtype=torch.long), sampled
    return tags.long(), sampled & (tags >= 0)


def sample_staleness(rollout: Rollout, version: int) -> Tensor:
    """[B] long: ``version`` minus the oldest version among each sample's sampled tokens (the
    submission version for a sample with no tagged token)."""
    tags, tagged = _tags(rollout, version)
    base = version if rollout.weight_version is None else rollout.weight_version
    oldest = tags.masked_fill(~tagged, torch.iinfo(torch.long).max).min(1).values
    oldest = torch.where(tagged.any(1), oldest, torch.full_like(oldest, base))
    return version - oldest


def staleness_stats(rollout: Rollout, version: int, max_staleness: int) -> dict[str, Tensor]:
    """The logged staleness of a rollout updated at weight ``version`` (see the module)."""
    tags, tagged = _tags(rollout, version)
    per_sample = sample_staleness(rollout, version).float()
    newest = tags.masked_fill(~tagged, torch.iinfo(torch.long).min).max(1).values
    oldest = version - per_sample.long()
    mixed = tagged.any(1) & (newest > oldest)
    stale_tokens = (tagged & (tags < version)).sum()
    stats = {
        "rollout/staleness_mean": per_sample.mean(),
        "rollout/staleness_max": per_sample.max(),
        "rollout/stale_token_frac": stale_tokens.float() / tagged.sum().clamp(min=1),
        "rollout/mixed_version_frac": mixed.float().mean(),
        "rollout/stale_dropped": (per_sample > max_staleness).float().sum(),
    }
    if rollout.weight_version is not None:
        stats["rollout/staleness"] = torch.tensor(float(version - rollout.weight_version))
    return {k: v.detach().cpu() for k, v in stats.items()}


def make_overlap(max_staleness: int, partial: bool) -> OverlappedRollouts | None:
    """The rollouts generated beside the update: none for ``max_staleness`` 0, else one-step-off
    (:class:`OverlappedRollouts`) or, with ``partial``, :class:`PartialRollouts`."""
    if max_staleness == 0:
        return None
    return PartialRollouts(max_staleness) if partial else OverlappedRollouts(max_staleness)


__all__ = [
    "PartialRollouts",
    "Pending",
    "make_overlap",
    "sample_staleness",
    "staleness_stats",
]
