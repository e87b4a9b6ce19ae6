"""Markdown tables of the settings groups, generated from the dataclasses (their fields, defaults
and the ``Args:`` lines of their docstrings): README's overview and docs/settings.md's field-by-
field reference. ``python scripts/settings_tables.py`` writes both; a test fails when they differ
from what is generated here."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence

from docstring_parser import parse

from lit_rlhf.settings.base import SettingsGroup
from lit_rlhf.settings.flat import group_params


def _value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def field_docs(group: type[SettingsGroup]) -> dict[str, str]:
    """{field: its one-paragraph description} from the class docstring's ``Args:``."""
    doc = parse(group.__doc__ or "")
    return {
        p.arg_name: " ".join((p.description or "").split()).replace("``", "`") for p in doc.params
    }


def summary(group: type[SettingsGroup]) -> str:
    """The docstring's first line without the trailing key in parentheses."""
    first = (group.__doc__ or "").strip().splitlines()[0]
    return first.split(" (``model.init_args")[0].rstrip(".").replace("``", "`")


def _users(group: type[SettingsGroup], modules: Mapping[str, type]) -> list[str]:
    return [name for name, cls in modules.items() if group in group_params(cls).values()]


def overview(groups: Sequence[type[SettingsGroup]], modules: Mapping[str, type]) -> str:
    """README's table: one row per group (fields with the group's defaults, the modules)."""
    rows = ["| group | fields (group default) | what | modules |", "|---|---|---|---|"]
    for group in groups:
        fields = ", ".join(f"`{f.name}` {_value(f.default)}" for f in dataclasses.fields(group))
        users = ", ".join(_users(group, modules)) or "-"
        rows.append(f"| `{group.GROUP}` | {fields} | {summary(group)} | {users} |")
    return "\n".join(rows)


def module_defaults(modules: Mapping[str, type]) -> str:
    """The modules' own defaults where they differ from the group's."""
    rows = ["| module | its defaults that differ from the group's |", "|---|---|"]
    for name, cls in modules.items():
        diffs = []
        for arg, group in group_params(cls).items():
            default = _signature_default(cls, arg)
            for spec in dataclasses.fields(group):
                mine = getattr(default, spec.name)
                if mine != spec.default:
                    diffs.append(f"`{arg}.{spec.name}` {_value(mine)}")
        rows.append(f"| {name} | {', '.join(diffs) or '-'} |")
    return "\n".join(rows)


def _signature_default(cls: type, arg: str) -> object:
    return inspect.signature(cls).parameters[arg].default


def reference(groups: Sequence[type[SettingsGroup]]) -> str:
    """docs/settings.md's body: per group, every field's key, default and meaning."""
    parts = []
    for group in groups:
        docs = field_docs(group)
        lines = [f"### `{group.GROUP}`: {summary(group)}", "", "| key | default | meaning |"]
        lines.append("|---|---|---|")
        for spec in dataclasses.fields(group):
            meaning = docs.get(spec.name, "").replace("|", "\\|")
            key = f"{group.GROUP}.{spec.name}"
            lines.append(f"| `{key}` | {_value(spec.default)} | {meaning} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def replace_between(text: str, name: str, body: str) -> str:
    """``text`` with the lines between ``<!-- name:begin -->`` and ``<!-- name:end -->``
    replaced by ``body``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} block to replace")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"
