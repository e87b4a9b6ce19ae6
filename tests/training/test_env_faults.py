"""Environment code that misbehaves never ends the run: every kind of fault is answered, ends the
episode where the environment can no longer be trusted, and is counted in ``env/faults`` and
``env/faults/<kind>`` (in process, a scripted engine; the CLI runs are in
tests/envs/test_user_envs_cli.py)."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest

from lit_rlhf.envs import StepResult
from lit_rlhf.models import load_causal_lm
from lit_rlhf.settings import EnvironmentSettings
from lit_rlhf.training.multiturn import FAULT_KINDS, MultiTurnRollout, _guarded, as_step_result
from lit_rlhf.training.rollouts import RolloutCollector
from tests.helpers import ConstantReward
from tests.training.test_multiturn_tokens import ScriptedEngine, _batch, _encode, tokenizer

__all__ = ["tokenizer"]  # the fixture, shared with test_multiturn_tokens


def _raise(err: BaseException):
    raise err


@pytest.fixture(scope="module")
def policy():
    return load_causal_lm("builtin:tiny-llama")


class Misbehaving:
    """Its first step does ``how``; a second step answers and ends the episode."""

    def __init__(self, how: str) -> None:
        self.how, self.steps = how, 0

    def reset(self, row) -> None:
        if self.how == "reset_exit":
            raise SystemExit(2)  # argparse inside environment code
        self.steps = 0

    def step(self, turn: str) -> StepResult:
        self.steps += 1
        if self.steps > 1:
            return StepResult("bye", reward=0.5, done=True)
        actions = {
            "exit": lambda: _raise(SystemExit(2)),
            "interrupt": lambda: _raise(KeyboardInterrupt()),
            "error": lambda: _raise(ValueError("bad")),
            "none": lambda: None,
            "string_reward": lambda: ("obs", "high"),
            "too_long": lambda: ("obs", 0.0, False, None, False, "extra"),
            "nan": lambda: StepResult("obs", reward=math.nan),
            "inf": lambda: ("obs", math.inf),
            "reported": lambda: StepResult("format!", fault="bad call"),
            "reset_exit": lambda: StepResult("never"),
        }
        return actions[self.how]()


CASES = [  # how, kind, agent turns the episode took
    ("exit", "base_exception", 2),
    ("interrupt", "base_exception", 2),
    ("error", "exception", 2),
    ("none", "bad_return", 1),
    ("string_reward", "bad_return", 1),
    ("too_long", "bad_return", 1),
    ("nan", "nonfinite_reward", 1),
    ("inf", "nonfinite_reward", 1),
    ("reported", "reported", 2),
    ("reset_exit", "reset", 1),
]


@pytest.mark.parametrize(("how", "kind", "turns"), CASES)
def test_each_fault_is_counted_by_kind_and_the_rollout_finishes(
    tokenizer, policy, how, kind, turns
):
    eos = tokenizer.eos_token_id
    turn = [*_encode(tokenizer, "<guess>3</guess>"), eos]
    engine = ScriptedEngine([[turn], [turn], [turn]])
    loop = MultiTurnRollout(Misbehaving(how), EnvironmentSettings(max_turns=3))
    collector = RolloutCollector(engine, ConstantReward(0.0), multiturn=loop)
    rollout = collector.collect(policy, tokenizer, _batch(tokenizer), samples_per_prompt=1)
    stats = rollout.term_stats
    assert float(stats[f"env/faults/{kind}"]) == 1
    assert (
        float(stats["env/faults"]) == 1 == sum(float(stats[f"env/faults/{k}"]) for k in FAULT_KINDS)
    )
    assert float(stats["env/turns"]) == turns
    assert math.isfinite(float(rollout.scores[0]))
    if kind in ("bad_return", "nonfinite_reward"):  # ended, its turn scored 0
        assert float(rollout.turn_rewards[0].sum()) == 0.0
    if turns == 2:  # the episode went on to the second step, which scored 0.5
        assert float(rollout.turn_rewards[0, 1]) == 0.5


def test_a_step_result_is_checked_field_by_field():
    assert as_step_result(StepResult("a", 1, 1)) == StepResult("a", 1.0, True)
    assert as_step_result(["a", 0.5]) == StepResult("a", 0.5)
    assert as_step_result(("a", True)) == StepResult("a", 1.0)  # reward=guess == target
    for bad in (None, "text", ("a", "1"), (3, 0.0), ("a", 0.0, False, 7), {"observation": "a"}):
        assert as_step_result(bad) is None, bad


def test_the_runs_own_interrupt_reaches_the_main_thread_through_the_guard():
    """Ctrl-C is delivered to the main thread, which waits in the guard's join: it is not the
    environment's fault and is not caught; the same exception raised by environment code in its
    own thread is."""
    assert _guarded(lambda _: _raise(KeyboardInterrupt()), None, timeout=1.0)[1] == (
        "base_exception",
        "failed (KeyboardInterrupt)",
    )
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # to the process, as a terminal sends it (the kernel may hand it to any thread)
    timer = threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            _guarded(lambda _: time.sleep(3), None, timeout=5.0)
        assert time.monotonic() - start < 1.5  # at once, not when the step returns
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
