"""Errors a user meets at run time whose cause is one setting, or the user's code behind it.

A :class:`SettingError` carries the dotted key of that setting as written in a config or on the
command line (``model.init_args.reward``, ``model.init_args.eval.pass_metric``) and a fix. The
``lit-rlhf`` command prints one of them as one line, ``lit-rlhf: error: <setting>: <cause>.
Fix: <fix>``, and exits with 1; with ``LIT_RLHF_DEBUG=1`` it raises it with its traceback
(:mod:`lit_rlhf.cli.errors`). Python callers catch it like any exception; the known kinds also
keep their built-in base (a reward's wrong return value is still a ``ValueError``).

Known kinds: a reward breaking its contract (:class:`~lit_rlhf.rewards.adapt.RewardReturnError`,
a signature no calling convention fits, a :class:`~lit_rlhf.rewards.GuardedReward` whose reward
fails on every sample), ``eval.pass_metric`` missing from the reward's info, an environment or
engine without its methods, and malformed data rows.
"""

from __future__ import annotations

from typing import Any


class SettingError(Exception):
    """An error one setting causes; ``setting`` and ``fix`` are given at the raise or by the
    subclass (its class attributes).

    Args:
        message: the cause (one line; it may already end with ``Fix: ...``).
        setting: the dotted key, as in the config (default: the class's ``setting``).
        fix: what to change, when the message does not say it (default: the class's ``fix``).
    """

    setting: str = ""
    fix: str = ""

    def __init__(
        self, message: str = "", *args: Any, setting: str | None = None, fix: str | None = None
    ) -> None:
        super().__init__(message, *args)
        if setting is not None:
            self.setting = setting
        if fix is not None:
            self.fix = fix

    @property
    def cause(self) -> str:
        """The message (``str`` of a ``KeyError`` would quote it)."""
        return str(self.args[0]) if self.args else ""

    def one_line(self) -> str:
        """``<setting>: <cause>. Fix: <fix>`` on one line (the fix only when the message has
        none)."""
        lines = [line.strip() for line in self.cause.splitlines() if line.strip()]
        # a message re-raised from a DataLoader worker carries the worker's traceback above it
        cause = lines[-1] if lines else type(self).__name__
        if self.fix and "Fix:" not in cause:
            cause = f"{cause.rstrip('.')}. Fix: {self.fix}"
        return f"{self.setting}: {cause}" if self.setting else cause


class DataError(SettingError, ValueError):
    """Data the run cannot use: a missing column or field, a malformed row, prompts that do not
    fit; the message names the file and row."""

    setting = "data"


class ConfigValueError(SettingError, ValueError):
    """A class's own refusal of its configuration while the CLI builds it (a settings group's
    range, a combination that would do nothing or the opposite): the message names the dotted
    key and says ``Fix: ...``. Still a ``ValueError`` for Python callers."""


class ConfigTypeError(SettingError, TypeError):
    """As :class:`ConfigValueError`, for a refusal raised as a ``TypeError``."""


def config_refusal(err: BaseException) -> SettingError | None:
    """``err`` as a one-line setting error when it is a class's own refusal of a setting (a
    ``ValueError`` or ``TypeError`` whose message says ``Fix:``); None for anything else (a bug
    keeps its traceback)."""
    if isinstance(err, SettingError) or "Fix:" not in str(err):
        return None
    if isinstance(err, ValueError):
        return ConfigValueError(str(err))
    if isinstance(err, TypeError):
        return ConfigTypeError(str(err))
    return None
