"""A reward that survives its wrapped reward's failures on single samples.

A verifier that raises on one odd completion, a judge that hangs on one request: one sample's
fault should cost that sample its score, not the run. :class:`GuardedReward` calls the wrapped
reward on the batch; if that raises, runs past ``timeout_s`` or returns an infinite score, the
failing samples are found by scoring sample by sample, and each of them gets ``fallback``. A
None/NaN score is "no score for this sample" (:mod:`lit_rlhf.rewards.adapt`), not a failure: it
passes through (and is counted as ``reward/unscored`` if nothing else scores the sample). Its
info column ``reward_error`` (1.0 where the fallback was used) is logged as the fraction
``reward/reward_error`` and, summed over every guarded reward of the step (also inside
``WeightedRewards`` / ``RewardByTask``, as ``<name>/reward_error``), as the count
``fault/reward_errors`` (:func:`lit_rlhf.training.rollout_stats`).

Why a wrapper and not module settings: it is a reward like any other (class path in YAML), so it
guards any module's reward, or only the fragile part of a combination, leaving cheap
deterministic rewards unwrapped (and without threads).

Time limit: each call runs in a daemon thread that the caller waits for at most ``timeout_s``. A
Python thread cannot be killed: a call past its limit is abandoned, not stopped, and runs on
(its CPU, memory and any state it changes included) until it returns; its result is dropped. So
wrap rewards that are safe to call again while an earlier call still runs (the built-in ones;
a stateful reward such as ``ScalarRMReward`` may see its running statistics updated late), and
at most ``max_stalled_calls`` abandoned calls may run at once: one more is an error. Grad mode
and the current CUDA device are carried into the thread.

A batch where every sample fails (of two or more) is an error, not a fallback: that is a broken
reward or broken data, and training on nothing but fallback scores would hide it.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.rewards.adapt import as_reward
from lit_rlhf.rewards.base import RewardFunction, check_batch_lengths
from lit_rlhf.types import RewardOutput

REWARD_ERROR_KEY = "reward_error"  # info column: 1.0 where a sample got the fallback
_WARNED_ERRORS = 3  # failed samples that get a warning per GuardedReward; later ones are counted


class RewardTimeout(TimeoutError):
    """The wrapped reward gave no result within ``timeout_s``."""


class StalledReward(RuntimeError):
    """Too many abandoned calls still running: the run stops (never a sample's fallback)."""


class GuardedReward:
    """Args:
    reward: the reward to guard (any callable, see :mod:`lit_rlhf.rewards.adapt`).
    fallback: the score of a sample whose scoring raised, timed out or was infinite.
    timeout_s: the time limit of one call of ``reward`` (the batch, then each sample when the
        batch is re-scored); None: no limit (and no thread). A batched reward whose whole batch
        legitimately takes longer needs a limit above that time.
    max_stalled_calls: abandoned calls still running at once that are tolerated.

    YAML::

        reward:
          class_path: lit_rlhf.rewards.GuardedReward
          init_args:
            reward: {class_path: lit_rlhf.rewards.MathReward}
            fallback: 0.0
            timeout_s: 10.0
    """

    def __init__(
        self,
        reward: RewardFunction,
        fallback: float = 0.0,
        timeout_s: float | None = 10.0,
        max_stalled_calls: int = 8,
    ) -> None:
        if not callable(reward):
            raise TypeError(f"reward must be a RewardFunction (callable), got {type(reward)}")
        if not math.isfinite(fallback):
            raise ValueError(f"fallback must be a finite score, got {fallback}")
        if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ValueError(
                f"timeout_s must be > 0 seconds, or null for no limit; got {timeout_s}"
            )
        if max_stalled_calls < 0:
            raise ValueError(f"max_stalled_calls must be >= 0, got {max_stalled_calls}")
        self.reward, self.fallback = reward, float(fallback)
        self._adapted = as_reward(reward)
        self.timeout_s, self.max_stalled_calls = timeout_s, max_stalled_calls
        self.errors = 0  # failed samples so far (the first ones are warned about)
        self._stalled: list[threading.Thread] = []

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        n = len(completions)
        try:
            batch = self._checked(self._call(prompts, completions, rows))
        except StalledReward:
            raise
        except Exception:  # which samples failed is found below, one by one
            pass
        else:
            return RewardOutput(batch.scores, {**batch.info, REWARD_ERROR_KEY: torch.zeros(n)})
        outputs: list[RewardOutput | None] = []
        failures: list[tuple[int, BaseException]] = []
        for i in range(n):
            out, error = self._sample(prompts[i], completions[i], rows[i])
            outputs.append(out)
            if error is not None:
                failures.append((i, error))
        self._report(failures, n)
        return self._assembled(outputs)

    def _sample(
        self, prompt: str, completion: str, row: Any
    ) -> tuple[RewardOutput | None, BaseException | None]:
        """One sample's output, or its error."""
        try:
            return self._checked(self._call([prompt], [completion], [row])), None
        except StalledReward:
            raise
        except Exception as error:
            return None, error

    def _call(self, prompts: Sequence[str], completions: Sequence[str], rows: Any) -> RewardOutput:
        """The wrapped reward's output (one score per sample, finite or NaN: checked), or
        :class:`RewardTimeout` after ``timeout_s``."""
        if self.timeout_s is None:
            return self._adapted(prompts, completions, rows)
        self._stalled = [t for t in self._stalled if t.is_alive()]
        box: dict[str, Any] = {}
        grad = torch.is_grad_enabled()
        cuda = torch.cuda.current_device() if torch.cuda.is_initialized() else None

        def run() -> None:
            if cuda is not None:
                torch.cuda.set_device(cuda)
            try:
                with torch.set_grad_enabled(grad):
                    box["out"] = self._adapted(prompts, completions, rows)
            except BaseException as error:  # handed to the caller's thread
                box["error"] = error

        thread = threading.Thread(target=run, name="GuardedReward", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self._abandon(thread)
            raise RewardTimeout(f"no result within {self.timeout_s} s")
        if "error" in box:
            raise box["error"]
        return box["out"]

    def _abandon(self, thread: threading.Thread) -> None:
        self._stalled.append(thread)
        if len(self._stalled) > self.max_stalled_calls:
            raise StalledReward(
                f"{self._name()}: {len(self._stalled)} calls ran past timeout_s="
                f"{self.timeout_s} and are still running (a thread cannot be stopped, each keeps "
                f"its CPU). Fix: make the reward bound its own time, raise timeout_s, or raise "
                f"max_stalled_calls (now {self.max_stalled_calls})."
            )

    @staticmethod
    def _checked(out: RewardOutput) -> RewardOutput:
        info = {
            k: torch.as_tensor(v, dtype=torch.float32).detach().cpu() for k, v in out.info.items()
        }
        return RewardOutput(out.scores, info)

    def _report(self, failures: list[tuple[int, BaseException]], n: int) -> None:
        """Warn about the first failures of the run; refuse a batch where every sample failed."""
        if n >= 2 and len(failures) == n:
            first = failures[0][1]
            raise RuntimeError(
                f"{self._name()} failed on all {n} samples of the batch (sample 0: "
                f"{type(first).__name__}: {first}). That is a broken reward or broken data, not "
                "a fault of single samples. Fix the reward (or its input rows); GuardedReward's "
                "fallback is for isolated failures."
            ) from first
        for i, error in failures:
            self.errors += 1
            if self.errors <= _WARNED_ERRORS:
                more = " (further reward errors are only counted: fault/reward_errors)"
                warnings.warn(
                    f"{self._name()}: sample {i} of the batch failed ({type(error).__name__}: "
                    f"{str(error)[:200]}); scored {self.fallback}"
                    + (more if self.errors == _WARNED_ERRORS else ""),
                    RuntimeWarning,
                    stacklevel=3,
                )

    def _assembled(self, outputs: list[RewardOutput | None]) -> RewardOutput:
        """[B] scores (the fallback where None) and info (NaN where a sample has no value)."""
        n = len(outputs)
        scores = torch.full((n,), self.fallback)
        info: dict[str, Tensor] = {REWARD_ERROR_KEY: torch.zeros(n)}
        for i, out in enumerate(outputs):
            if out is None:
                info[REWARD_ERROR_KEY][i] = 1.0
                continue
            scores[i] = out.scores[0]
            for key, value in out.info.items():
                info.setdefault(key, torch.full((n,), math.nan))[i] = value.reshape(-1)[0]
        return RewardOutput(scores, info)

    def _name(self) -> str:
        return f"GuardedReward({getattr(self.reward, '__name__', type(self.reward).__name__)})"

    def state_dict(self) -> dict[str, Any]:
        """The wrapped reward's state (a stateful reward's, e.g. running statistics), or {}."""
        inner = getattr(self.reward, "state_dict", None)
        return inner() if callable(inner) else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        inner = getattr(self.reward, "load_state_dict", None)
        if callable(inner) and state:
            inner(state)
