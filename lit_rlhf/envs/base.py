"""The environment protocol of multi-turn rollouts: plain Python objects that answer the agent's
turns with observations and rewards.

An environment is injected by class path (``model.init_args.environment``) like a reward. The
injected object is a prototype: every episode works on its own ``copy.deepcopy`` of it, so an
environment keeps its episode state in plain attributes. The rollout loop
(:mod:`lit_rlhf.training.multiturn`) calls ``reset(row)`` once per episode with the data row of
the episode's prompt, then ``step(turn_text)`` after every agent turn with the turn's decoded text
(special tokens stripped). Model text is untrusted input: parse it, never ``eval`` it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol, runtime_checkable

from lit_rlhf.errors import SettingError
from lit_rlhf.shapes import ByShape, missing_methods


class StepResult(NamedTuple):
    """What an environment answers to one agent turn.

    ``observation``: the text shown to the agent as the environment's turn (rendered with the
    chat template's tool role, or the user role where the template has none); ignored when
    ``done``. ``reward``: this turn's reward (summed into the episode score; with a critic it
    sits on the turn's last agent token). ``done``: the episode ends after this turn.
    ``fault``: a short reason when the agent's turn was a bad tool call (counted as
    ``env/faults``; the episode goes on with ``observation`` as the answer). ``tool_call``:
    the turn held a well-formed tool call (:func:`~lit_rlhf.envs.parse_tool_call` returned a
    call, whether or not the tool then succeeded; the share of episodes with one is logged as
    ``env/tool_calls``). Defaults keep environments written before these fields working.
    """

    observation: str
    reward: float = 0.0
    done: bool = False
    fault: str | None = None
    tool_call: bool = False


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment (see the module docstring for the episode lifecycle)."""

    def reset(self, row: Mapping[str, Any]) -> None:
        """Start an episode for the data row of its prompt (targets, numbers, ...)."""
        ...

    def step(self, turn: str) -> StepResult:
        """Answer the agent's turn (its decoded text, a tool call or a final answer)."""
        ...


class EnvironmentLike(ByShape):
    """The type the CLI checks ``environment`` against: any class with callable ``reset`` and
    ``step`` (annotated or not, a subclass of :class:`Environment` or not) passes
    ``issubclass(cls, EnvironmentLike)``; see :mod:`lit_rlhf.shapes`."""

    methods = ("reset", "step")

    @abstractmethod
    def reset(self, row: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def step(self, turn: str) -> StepResult: ...


_SIGNATURES = {"reset": "reset(row)", "step": "step(turn)"}


def environment_refusal(env: Any) -> str | None:
    """Why ``env`` (an object or a class) is not an environment, naming the missing method and
    the class, with the fix; None when it has callable ``reset`` and ``step``."""
    missing = missing_methods(env, EnvironmentLike.methods)
    if not missing:
        return None
    cls = env if isinstance(env, type) else type(env)
    name = f"{cls.__module__}.{cls.__qualname__}"
    lacks = " and ".join(_SIGNATURES[m] for m in missing)
    return (
        f"environment {name} has no method {lacks}; an environment needs reset(row) and "
        f"step(turn). Fix: add {lacks} to {cls.__qualname__}, or pass an environment by class "
        "path, e.g. lit_rlhf.envs.CountdownCalculatorEnv."
    )


class EnvironmentContractError(SettingError, TypeError):
    """An environment without the methods an environment needs."""

    setting = "model.init_args.environment"


def check_environment(env: Any) -> None:
    """Refuse an object that is not an :class:`Environment` (:func:`environment_refusal`)."""
    if (why := environment_refusal(env)) is not None:
        raise EnvironmentContractError(why)
