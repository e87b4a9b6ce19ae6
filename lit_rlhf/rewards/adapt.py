"""Rewards as users already write them, adapted at the edge into the reward protocol.

Any callable is a reward: lit-rlhf's classes, a plain function given by import path
(``--model.init_args.reward=my_rewards.brevity``), a class with or without type hints.

Calling convention, read from the callable's signature once, when it is adapted:

- a parameter named ``rows``: ``reward(prompts, completions, rows)``, the rows being the data rows
  (dicts) the prompts came from (lit-rlhf's own protocol, :class:`RewardFunction`);
- otherwise, with a ``completions`` parameter or ``**kwargs``: TRL's convention,
  ``reward(prompts=..., completions=..., **columns)`` where each row field is passed as a keyword
  argument holding that field's value for every sample (a function without ``**kwargs`` gets
  only the fields it names);
- otherwise three positional parameters are ``(prompts, completions, rows)`` and two are
  ``(prompts, completions)``.

``prompts`` are the rendered prompt texts (a chat dataset's prompt after the chat template) and
``completions`` the decoded response texts: always strings, never message lists.

Return values: a :class:`RewardOutput`, a 1-D tensor or NumPy array, or a sequence of numbers,
one per completion. ``None`` (or NaN) means "no score for this sample": in
:class:`~lit_rlhf.rewards.WeightedRewards` a sample's unscored terms are skipped (TRL's nansum);
a sample with no score at all gets the module's ``reward_fallback`` and is counted as
``reward/unscored``. Anything else (strings, wrong length, 2-D, infinities) is refused on the
first batch with one line naming the reward, what it returned and what is expected.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from lit_rlhf.errors import SettingError
from lit_rlhf.types import RewardOutput

Convention = Literal["rows", "keywords", "pair"]


class RewardReturnError(SettingError, ValueError):
    """A reward returned something that is not one score per completion."""

    setting = "model.init_args.reward"
    fix = (
        "make the reward return one number per completion (None for no score): a list, a 1-D "
        "tensor or array, or a RewardOutput"
    )


class RewardSignatureError(SettingError, TypeError):
    """A reward whose parameters fit no calling convention."""

    setting = "model.init_args.reward"


class CallableReward:
    """Any callable, called by the convention its signature declares, its result converted to a
    :class:`RewardOutput` whose ``scores`` hold NaN where the reward gave no score.

    Args:
        fn: the reward (function, callable instance or lit-rlhf reward).
        name: its logging name; default :func:`reward_name`.
        log_scores: a result that is not a ``RewardOutput`` also puts its scores into ``info``
            under ``name`` (logged as ``reward/<name>``), so a plain function's reward shows
            under its own name (off inside ``WeightedRewards``, which logs every component).
    """

    def __init__(
        self, fn: Callable[..., Any], name: str | None = None, log_scores: bool = True
    ) -> None:
        if isinstance(fn, type):
            raise TypeError(
                f"reward {fn.__qualname__} is a class, not a reward: give an instance (YAML: "
                "class_path + init_args) or a function"
            )
        if not callable(fn):
            raise TypeError(f"a reward must be callable, got {type(fn).__name__}: {fn!r:.80}")
        self.fn = fn
        self.name = name or reward_name(fn)
        self.log_scores = log_scores
        self.convention, self.accepted = calling_convention(fn)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        if self.convention == "rows":
            result = self.fn(prompts, completions, rows)
        elif self.convention == "pair":
            result = self.fn(prompts, completions)
        else:
            columns = self._columns(rows)
            result = self.fn(prompts=list(prompts), completions=list(completions), **columns)
        if isinstance(result, RewardOutput):
            scores = as_scores(result.scores, len(completions), self.name)
            return RewardOutput(scores=scores, info=dict(result.info))
        scores = as_scores(result, len(completions), self.name)
        return RewardOutput(scores=scores, info={self.name: scores} if self.log_scores else {})

    def _columns(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
        keys: dict[str, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        keys.pop("prompts", None)
        keys.pop("completions", None)
        wanted = keys if self.accepted is None else [k for k in keys if k in self.accepted]
        return {key: [row.get(key) for row in rows] for key in wanted}


def calling_convention(fn: Callable[..., Any]) -> tuple[Convention, frozenset[str] | None]:
    """How :class:`CallableReward` calls ``fn``, and (keyword convention without ``**kwargs``)
    the row fields it accepts. See the module docstring for the rules."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a C callable): lit-rlhf's protocol
        return "rows", None
    names = {p.name for p in params}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    if "rows" in names:
        return "rows", None
    if "completions" in names or var_kw:
        return "keywords", None if var_kw else frozenset(names)
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    var_pos = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if len(positional) >= 3 or var_pos:
        return "rows", None
    if len(positional) == 2:
        return "pair", None
    raise RewardSignatureError(
        f"reward {reward_name(fn)!r} takes {[p.name for p in params]}; a reward takes "
        "(prompts, completions, rows), (prompts, completions, **kwargs) or "
        "(prompts, completions). Fix: give it one of those parameter lists"
    )


def as_scores(value: Any, n: int, name: str) -> torch.Tensor:
    """``value`` as a float32 tensor [n] on the CPU, None -> NaN; one-line error otherwise."""
    expected = (
        f"expected a RewardOutput, a 1-D tensor or array, or a list of {n} numbers "
        "(None for no score), one per completion"
    )
    if isinstance(value, np.ndarray) and value.dtype == object:  # e.g. None entries
        value = list(value)
    if isinstance(value, torch.Tensor | np.ndarray):
        if isinstance(value, np.ndarray) and not (
            np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_
        ):
            raise RewardReturnError(
                f"reward {name!r} returned an array of {value.dtype}; {expected}"
            )
        tensor = torch.as_tensor(value).detach().to("cpu", torch.float32)
        if tensor.shape != (n,):
            raise RewardReturnError(
                f"reward {name!r} returned a {type(value).__name__} of shape "
                f"{tuple(tensor.shape)} for {n} completions; {expected}"
            )
        return _finite_or_nan(tensor, name)
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise RewardReturnError(
            f"reward {name!r} returned {type(value).__name__} {_short(value)}; {expected}"
        )
    if len(value) != n:
        raise RewardReturnError(
            f"reward {name!r} returned {len(value)} values for {n} completions; {expected}"
        )
    out = []
    for i, item in enumerate(value):
        if item is None:
            out.append(math.nan)
        elif _is_number(item):
            out.append(float(item))
        else:
            raise RewardReturnError(
                f"reward {name!r} returned {type(item).__name__} {_short(item)} at position {i}; "
                f"{expected}"
            )
    return _finite_or_nan(torch.tensor(out, dtype=torch.float32), name)


def _is_number(item: Any) -> bool:  # bools count (True = 1.0): "correct" rewards return them
    if isinstance(item, torch.Tensor):
        return item.numel() == 1
    return isinstance(item, numbers.Real | np.bool_)


def _finite_or_nan(scores: torch.Tensor, name: str) -> torch.Tensor:
    if torch.isinf(scores).any():
        i = int(torch.isinf(scores).nonzero()[0])
        raise RewardReturnError(
            f"reward {name!r} returned {float(scores[i])} at position {i}; scores must be "
            "finite (None or NaN for no score)"
        )
    return scores


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def reward_name(reward: object) -> str:
    """A reward's logging name: a function's name, or the snake_case class name without a
    trailing "Reward" (``CountdownReward`` -> ``countdown``)."""
    if isinstance(reward, CallableReward):
        return reward.name
    name = getattr(reward, "__name__", None) or type(reward).__name__
    if name.endswith("Reward") and len(name) > len("Reward"):
        name = name[: -len("Reward")]
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return name.lower()


def as_reward(
    reward: Callable[..., Any], name: str | None = None, log_scores: bool = True
) -> CallableReward:
    """``reward`` adapted into the protocol (its inner callable re-wrapped when it already is a
    ``CallableReward``)."""
    if isinstance(reward, CallableReward):
        if name in (None, reward.name) and log_scores == reward.log_scores:
            return reward
        reward = reward.fn
    return CallableReward(reward, name, log_scores)
