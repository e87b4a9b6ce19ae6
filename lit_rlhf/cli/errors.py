"""What ``lit-rlhf`` prints when a configuration is refused: the cause, last.

jsonargparse reports a bad setting inside the union it tried (``LightningModule | None``), then
the whole value it was given: for a module, a namespace dump with the tokenizer's repr, so the
cause ends up in the middle of a hundred lines. Here a parse error is printed as the nested keys
that lead to it, and a last line ``error: <key>: <cause>. Fix: ...``; an error raised by a
class's ``__init__`` while the CLI builds it is re-raised as itself, so the traceback ends with
that class's own message.

An error of a known kind met later, while the run builds or trains (a
:class:`~lit_rlhf.errors.SettingError`: a reward breaking its contract, ``eval.pass_metric``
missing from the reward's info, malformed data, ...), ends the command with one line,
``lit-rlhf: error: <setting>: <cause>. Fix: <fix>``, and exit code 1
(:func:`one_line_errors`); ``LIT_RLHF_DEBUG=1`` raises it with its traceback instead.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from lit_rlhf.cli.suggest import suggest
from lit_rlhf.errors import SettingError
from lit_rlhf.settings import closest_field, group_params

# jsonargparse's lines that describe its own search rather than the cause
_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Expected a <class 'NoneType'>",
)
_KEY = re.compile(r'^Parser key "([^"]+)":?$')
_KEY_AND_CAUSE = re.compile(r'^Parser key "([^"]+)": (.+)$')
_CLASS = re.compile(r"^Problem with given class_path '([^']+)':$")
_OPTION = re.compile(r"^Option '([^']+)' is not accepted")
_GROUP_OPTION = re.compile(r"^Group '([^']+)' does not accept option '([^']+)'")
_CONTAINER_MISMATCH = re.compile(r"^- Expected a <class '(list|dict|tuple)'>$")
_NOT_BY_SHAPE = re.compile(r"subclass of (EnvironmentLike|GenerationEngineLike)$")
_GIVEN_PATH = re.compile(r"^Expected a path but (\S+) either")
_SHAPE_REFUSALS = {  # imported when needed: the CLI starts without the envs and engines
    "EnvironmentLike": ("lit_rlhf.envs", "environment_refusal"),
    "GenerationEngineLike": ("lit_rlhf.rollout", "engine_refusal"),
}


class LitRLHFParser(LightningArgumentParser):
    """LightningCLI's parser, printing a refused configuration as :func:`explain_parse_error`
    (nested parsers, which raise instead of exiting, are unchanged)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # raises
        subcommand = getattr(getattr(ex, "subcommand_parser", None) or self, "subcommand", None)
        sys.stderr.write(explain_parse_error(message, subcommand) + "\n")
        self.exit(2)


def explain_parse_error(message: str, subcommand: str | None = None) -> str:
    """jsonargparse's ``message`` without the value dumps, followed by one line that names the
    setting, the cause and the fix."""
    head = re.split(r"\n\s*Given value type:", message, maxsplit=1)[0]  # the rest: the input
    lines = [line for line in _first_branches(head.splitlines()) if _kept(line)]
    key, class_path, cause = _locate(lines)
    command = f"lit-rlhf {subcommand}" if subcommand else "lit-rlhf"
    report = ["lit-rlhf: the configuration was refused:", *(f"  {line}" for line in lines)]
    report.append(f"tip: `{command} --help` lists the options, `--print_config` shows the config")
    where = f"{key}: " if key else ""
    if shape := _shape_refusal(lines):  # an environment / engine without a method it needs
        cause, _, fix = shape.partition(". Fix: ")
    else:
        fix = _fix(key, class_path, cause)
    report.append(f"error: {where}{cause.rstrip('.')}. Fix: {fix}")
    return "\n".join(report)


def _shape_refusal(lines: list[str]) -> str | None:
    """For a class refused as an environment or an engine (:mod:`lit_rlhf.shapes`): which
    method the class lacks, with the fix (jsonargparse names neither)."""
    found = _NOT_BY_SHAPE.search(lines[-1]) if lines else None
    texts = (line.strip().removeprefix("- ") for line in lines)
    given = next((m.group(1) for text in texts if (m := _GIVEN_PATH.match(text))), None)
    if found is None or given is None:
        return None
    module, _, name = given.rpartition(".")
    try:  # jsonargparse imported it already; a failure here leaves its own message
        cls = getattr(importlib.import_module(module), name)
    except Exception:
        return None
    module, name = _SHAPE_REFUSALS[found.group(1)]
    refusal: Any = getattr(importlib.import_module(module), name)
    return refusal(cls)


def _first_branches(lines: list[str]) -> list[str]:
    """Each union's first branch only: a union's later branches repeat the cause for types the
    value was never meant as (``reward``: a class path is tried as a ``RewardFunction``, then as
    a function, then as a list; the first branch is the reading the user meant)."""
    kept: list[str] = []
    blocks: list[list[int]] = []  # per open "Errors:" block: [its indent, its branches' indent]
    skip_below: int | None = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if skip_below is not None and indent > skip_below:
            continue
        skip_below = None
        while blocks and indent <= blocks[-1][0]:
            blocks.pop()
        text = line.strip()
        if blocks and text.startswith("- "):
            if _CONTAINER_MISMATCH.match(text):
                continue  # "not a list": a union branch the value was not meant as
            if blocks[-1][1] < 0:
                blocks[-1][1] = indent  # the first branch
            elif indent == blocks[-1][1]:
                skip_below = indent  # a later branch and everything under it
                continue
        if text == "Errors:":
            blocks.append([indent, -1])
        kept.append(line)
    return kept


def _kept(line: str) -> bool:
    text = line.strip().removeprefix("- ")
    return bool(text) and not text.startswith(_NOISE)


def _locate(lines: list[str]) -> tuple[str | None, str | None, str]:
    """(dotted key, class whose settings hold it, cause): the cause is the last line, the key
    is made of the ``Parser key`` and class-path lines above it."""
    keys: list[str] = []
    classes: list[str] = []
    for line in lines[:-1]:
        text = line.strip().removeprefix("- ")
        if match := _KEY.match(text):
            keys.append(match.group(1))
        elif match := _CLASS.match(text):
            classes.append(match.group(1))
            keys.append("init_args")
    cause = lines[-1].strip().removeprefix("- ") if lines else "invalid arguments"
    if match := _KEY_AND_CAUSE.match(cause):  # e.g. 'Parser key "config": File does not exist'
        keys.append(match.group(1))
        cause = match.group(2)
    if match := _OPTION.match(cause):
        keys.append(match.group(1))
    elif match := _GROUP_OPTION.match(cause):
        keys.extend(match.groups())  # a settings group's field: <module's init_args>.group.field
    elif keys and keys[-1] == "init_args":
        keys.pop()  # the class itself is the problem (e.g. it does not exist)
        classes.pop()
    return ".".join(keys) or None, (classes[-1] if classes else None), cause


def _fix(key: str | None, class_path: str | None, cause: str) -> str:
    if key and class_path and key.count(".init_args.") == 1 and key.startswith(("model.", "data.")):
        where = f"`--{key.split('.', 1)[0]}.help {class_path}` lists its settings"
    elif class_path:
        where = f"the arguments of {class_path} are the settings"
    else:
        where = "`--help` lists the settings"
    if _OPTION.match(cause):
        hint = suggest(class_path, key.split(".init_args.")[-1]) if key else None
        if hint and hint.startswith("'"):  # a TRL name: its lit-rlhf setting is the fix
            return hint
        return f"remove {key} or correct its spelling{f'; {hint}' if hint else ''} ({where})."
    if match := _GROUP_OPTION.match(cause):
        group, option = match.groups()
        close = _closest_group_field(class_path, group, option)
        hint = f"; did you mean {group}.{close}?" if close else ""
        return f"remove {key} or correct its spelling{hint} (docs/settings.md lists the fields)."
    if cause.startswith("Expected a"):
        return f"give {key} a value of the expected type ({where})."
    if "--lr_scheduler" in cause:
        return (
            "leave them out and set the module's own schedule in model.init_args.optim: "
            "lr_warmup_steps or lr_warmup_ratio, lr_schedule (constant, linear, cosine), "
            "min_lr_ratio, lr_interval (batch, optimizer_step) and lr_total_steps (Lightning "
            "never steps an --lr_scheduler under manual optimisation)."
        )
    if "--optimizer" in cause:
        return (
            "leave them out: each module builds its own AdamW from model.init_args.optim.lr, "
            "weight_decay and max_grad_norm (an --optimizer would replace its param groups; "
            "the lr schedule is model.init_args.optim.lr_schedule and the other lr_* fields)."
        )
    if cause.startswith("unrecognized arguments"):
        hints = _module_hints(key, class_path, cause)
        return f"remove them or correct their spelling{hints} ({where})."
    if missing := _MISSING_MODULE.search(cause):
        return _import_fix(missing.group(1))
    return f"correct this setting in the config or on the command line ({where})."


def _module_hints(key: str | None, class_path: str | None, cause: str) -> str:
    """``; --a.b: <suggestion>`` for each unrecognised module argument (``key`` ``model``)."""
    if key not in ("model", "model.init_args"):
        return ""
    hints = []
    for name in re.findall(r"--([\w.]+)", cause):
        if hint := suggest(class_path, name.removeprefix("init_args.")):
            hints.append(f"--{name}: {hint}")
    return "".join(f"; {h}" for h in hints)


_MISSING_MODULE = re.compile(r"No module named '([^']+)'")


def _import_fix(module: str) -> str:
    """The fix for a class path whose module is not found: where it was looked for."""
    top = module.split(".")[0]
    return (
        f"{module!r} was looked for in the installed packages and in the working folder "
        f"{os.getcwd()} (searched last; see lit_rlhf.cli.app.importable_working_folder). Put "
        f"{top}.py (or the package {top}/) in this folder and run from here, add its folder to "
        "PYTHONPATH, or correct the class path (module.attribute)."
    )


def _closest_group_field(class_path: str | None, group: str, option: str) -> str | None:
    """The field closest to ``option`` in the settings group ``class_path`` takes as ``group``."""
    module, _, name = (class_path or "").rpartition(".")
    try:
        found = group_params(getattr(importlib.import_module(module), name)).get(group)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    return closest_field(found, option) if found is not None else None


def refuse_abbreviations(parser: Any, argv: Sequence[str], config: Any) -> None:
    """Refuse a command-line option that is an abbreviation of a setting (jsonargparse completes
    ``--model.init_args.loss.clip_h`` to ``clip_high`` inside settings groups): every
    ``--a.b.c`` given must be a key of the parsed config, or name no setting at all."""
    subcommand = config.get("subcommand")
    parsed = config.get(subcommand) if subcommand else config
    if parsed is None:
        return
    keys = list(parsed.keys())
    for token in argv:
        if not token.startswith("--") or "." not in token:
            continue
        key = token[2:].split("=", 1)[0]
        if key in parsed or key.endswith((".help", "+")):
            continue
        parent, _, last = key.rpartition(".")
        full = [
            k
            for k in keys
            if k.rpartition(".")[0] == parent and k.rpartition(".")[2].startswith(last)
        ]
        if len(full) == 1:
            parser.error(
                f"unrecognized arguments: --{key} (an abbreviation of --{full[0]}: abbreviations "
                "are refused, so that a typo never sets another setting)"
            )


def _completes(key: str, parent: str, last: str) -> bool:
    head, _, tail = key.rpartition(".")
    return head == parent and tail.startswith(last)


def root_cause(err: BaseException) -> BaseException:
    """The exception a class raised while jsonargparse built it: ``err`` with jsonargparse's
    wrappers (``raise ... from``) taken off."""
    while err.__cause__ is not None and _raised_by_jsonargparse(err):
        err = err.__cause__
    return err


def _raised_by_jsonargparse(err: BaseException) -> bool:
    tb: Any = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("jsonargparse")


DEBUG_VARIABLE = "LIT_RLHF_DEBUG"  # set (not 0 / empty): known errors keep their traceback


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Inside: a :class:`~lit_rlhf.errors.SettingError` (raised, or the ``__cause__`` of what
    was raised) is printed as one line on stderr and ends the process with exit code 1; any
    other error, and every error with ``LIT_RLHF_DEBUG=1``, propagates with its traceback."""
    try:
        yield
    except Exception as err:
        known = setting_error(err)
        if known is None or os.environ.get(DEBUG_VARIABLE, "") not in ("", "0"):
            raise
        sys.stderr.write(
            f"lit-rlhf: error: {known.one_line()} ({DEBUG_VARIABLE}=1 shows the traceback)\n"
        )
        raise SystemExit(1) from None


def setting_error(err: BaseException) -> SettingError | None:
    """``err`` if it is a :class:`~lit_rlhf.errors.SettingError`, else the first one among its
    causes (``raise ... from``), else None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, SettingError):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None
