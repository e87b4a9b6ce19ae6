"""A reward that survives its wrapped reward's failures on single samples.

A verifier that raises on one odd completion, a judge that hangs on one request: one sample's
fault should cost that sample its place in the update, not the run. :class:`GuardedReward` calls
the wrapped reward on the batch; if that raises, runs past ``timeout_s`` or returns an infinite
score, the failing samples are found by scoring sample by sample. What a failed sample becomes
is ``on_error``:

- ``mask`` (default): it leaves the update. Its info column ``reward_masked`` is 1.0 and the
  training core takes it out of its group's statistics (GRPO's mean and std, RLOO's
  leave-one-out, REINFORCE++'s batch whitening, GAE's whitening) and out of the loss; a group
  left with fewer than two samples is dropped, and a batch with nothing left makes no update
  (:mod:`lit_rlhf.training.reward_mask`). Inside ``WeightedRewards`` / ``RewardByTask`` one
  failed part masks the whole sample. The row keeps ``fallback`` as a placeholder score (read by
  validation and test, which mask nothing). Why: a made-up score enters the group's mean and
  std like a real one and biases every advantage of the group whenever the infrastructure
  fails.
- ``fallback``: it is scored ``fallback`` like a real score (the rule before masking).

A None/NaN score is "no score for this sample" (:mod:`lit_rlhf.rewards.adapt`), not a failure:
it passes through, and the collector gives it the module's ``reward_fallback`` (counted as
``reward/unscored``) in both modes. The info column ``reward_error`` (1.0 where the reward
failed) is logged as the fraction ``reward/reward_error`` and, summed over every guarded reward
of the step (also inside ``WeightedRewards`` / ``RewardByTask``, as ``<name>/reward_error``), as
the count ``fault/reward_errors`` (:func:`lit_rlhf.training.rollout_stats`).

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

A batch where every sample fails (of two or more) is a broken reward or broken data more often
than bad luck: with ``fallback`` it is an error at once (training on nothing but fallback scores
would hide it); with ``mask`` the batch makes no update and is warned about, and
``max_failed_batches`` such batches in a row are the error.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from lit_rlhf.errors import SettingError
from lit_rlhf.rewards.adapt import as_reward
from lit_rlhf.rewards.base import RewardFunction, check_batch_lengths
from lit_rlhf.types import RewardOutput

REWARD_ERROR_KEY = "reward_error"  # info column: 1.0 where the reward failed on a sample
REWARD_MASKED_KEY = "reward_masked"  # info column: 1.0 where that sample leaves the update
_WARNED_ERRORS = 3  # failed samples that get a warning per GuardedReward; later ones are counted


class RewardTimeout(TimeoutError):
    """The wrapped reward gave no result within ``timeout_s``."""


class StalledReward(SettingError, RuntimeError):
    """Too many abandoned calls still running: the run stops (never a sample's fallback)."""

    setting = "model.init_args.reward"


class FailedBatchError(SettingError, RuntimeError):
    """The reward failed on every sample of a batch (``fallback``), or of
    ``max_failed_batches`` batches in a row (``mask``)."""

    setting = "model.init_args.reward"


def failed_samples(info: Mapping[str, Tensor], n: int) -> Tensor:
    """[n] bool: the samples a guarded reward (or a guarded part of a combination) failed on
    with ``on_error='mask'``: its column ``reward_masked`` / ``<name>/reward_masked`` is 1.0
    (NaN, a part that did not score the sample, is not a failure)."""
    failed = torch.zeros(n, dtype=torch.bool)
    for key, value in info.items():
        if key == REWARD_MASKED_KEY or key.endswith(f"/{REWARD_MASKED_KEY}"):
            failed |= value.detach().float().cpu().reshape(n) > 0
    return failed


class GuardedReward:
    """Args:
    reward: the reward to guard (any callable, see :mod:`lit_rlhf.rewards.adapt`).
    fallback: the score of a sample whose scoring raised, timed out or was infinite (with
        ``on_error='mask'`` a placeholder that only validation and test read).
    on_error: ``mask``: such a sample leaves the update (its group's statistics and the loss);
        ``fallback``: it is trained on with the score ``fallback``.
    timeout_s: the time limit of one call of ``reward`` (the batch, then each sample when the
        batch is re-scored); None: no limit (and no thread). A batched reward whose whole batch
        legitimately takes longer needs a limit above that time.
    max_stalled_calls: abandoned calls still running at once that are tolerated.
    max_failed_batches: with ``mask``, the batches in a row on which every sample failed that
        stop the run (each one makes no update).

    YAML::

        reward:
          class_path: lit_rlhf.rewards.GuardedReward
          init_args:
            reward: {class_path: lit_rlhf.rewards.MathReward}
            on_error: mask
            timeout_s: 10.0
    """

    def __init__(
        self,
        reward: RewardFunction,
        fallback: float = 0.0,
        timeout_s: float | None = 10.0,
        max_stalled_calls: int = 8,
        on_error: Literal["mask", "fallback"] = "mask",
        max_failed_batches: int = 3,
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
        if on_error not in ("mask", "fallback"):
            raise ValueError(f"on_error must be 'mask' or 'fallback', got {on_error!r}")
        if max_failed_batches < 1:
            raise ValueError(f"max_failed_batches must be >= 1, got {max_failed_batches}")
        self.on_error, self.max_failed_batches = on_error, max_failed_batches
        self.failed_batches = 0  # batches in a row on which every sample failed
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
            self.failed_batches = 0
            return RewardOutput(batch.scores, {**batch.info, **self._fault_columns(n)})
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
        """Warn about the first failures of the run; an all-failed batch (of two or more) is an
        error (``fallback``) or, up to ``max_failed_batches`` in a row, a warning (``mask``)."""
        if n >= 2 and len(failures) == n:
            self._all_failed(failures[0][1], n)
        else:
            self.failed_batches = 0
        what = "left out of the update" if self.on_error == "mask" else f"scored {self.fallback}"
        for i, error in failures:
            self.errors += 1
            if self.errors <= _WARNED_ERRORS:
                more = " (further reward errors are only counted: fault/reward_errors)"
                warnings.warn(
                    f"{self._name()}: sample {i} of the batch failed ({type(error).__name__}: "
                    f"{str(error)[:200]}); {what}"
                    + (more if self.errors == _WARNED_ERRORS else ""),
                    RuntimeWarning,
                    stacklevel=3,
                )

    def _all_failed(self, first: BaseException, n: int) -> None:
        self.failed_batches += 1
        cause = f"sample 0: {type(first).__name__}: {str(first)[:200]}"
        if self.on_error == "mask" and self.failed_batches < self.max_failed_batches:
            warnings.warn(
                f"{self._name()} failed on all {n} samples of the batch ({cause}): the batch "
                f"makes no update ({self.failed_batches} such batch(es) in a row; "
                f"{self.max_failed_batches} stop the run)",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        batches = "" if self.on_error == "fallback" else f" and {self.failed_batches} in a row"
        raise FailedBatchError(
            f"{self._name()} failed on all {n} samples of the batch{batches} ({cause}). That is "
            "a broken reward or broken data, not a fault of single samples. Fix: fix the reward "
            "(or its input rows); GuardedReward is for isolated failures"
        ) from first

    def _fault_columns(self, n: int, failed: Tensor | None = None) -> dict[str, Tensor]:
        """The info columns ``reward_error`` (and with ``mask`` ``reward_masked``): 1.0 where
        the sample failed."""
        column = torch.zeros(n) if failed is None else failed.float()
        if self.on_error == "mask":
            return {REWARD_ERROR_KEY: column, REWARD_MASKED_KEY: column.clone()}
        return {REWARD_ERROR_KEY: column}

    def _assembled(self, outputs: list[RewardOutput | None]) -> RewardOutput:
        """[B] scores (the fallback where None) and info (NaN where a sample has no value)."""
        n = len(outputs)
        scores = torch.full((n,), self.fallback)
        info = self._fault_columns(n, torch.tensor([out is None for out in outputs]))
        for i, out in enumerate(outputs):
            if out is None:
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
