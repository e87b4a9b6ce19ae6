"""docs/data.md's settings tables match the code: under each ``### `Class``` heading, every row
names an ``__init__`` parameter of that class of ``lit_rlhf.data`` with its default as the code
has it, and every parameter has a row; the file sources are all documented."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch import LightningDataModule

import lit_rlhf.data

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def tables(text: str) -> dict[str, dict[str, str]]:
    """Class name -> {setting: default cell} for every ``### `Name``` section's table."""
    out: dict[str, dict[str, str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if heading := re.fullmatch(r"### `(\w+)`", line.strip()):
            current = heading.group(1)
            out[current] = {}
        elif line.startswith("## "):
            current = None
        elif current and (row := re.match(r"\| `(\w+)` \| (.*?) \|", line)):
            assert row.group(1) not in out[current], f"{current}.{row.group(1)} listed twice"
            out[current][row.group(1)] = row.group(2).strip()
    return out


def shown(default: Any) -> str:
    """A default as the docs write it: YAML spelling, in backticks; ``required`` for none."""
    if default is inspect.Parameter.empty:
        return "required"
    if default is None or isinstance(default, bool):
        return f"`{ {None: 'null', True: 'true', False: 'false'}[default] }`"
    if isinstance(default, tuple):
        return f"`{list(default)}`"
    return '`""`' if default == "" else f"`{default}`"


DOCUMENTED = tables(DOC.read_text())


def test_the_file_sources_are_documented() -> None:
    """Every data module and every source read from a ``path`` that lit_rlhf.data exports."""
    exported = [getattr(lit_rlhf.data, name) for name in lit_rlhf.data.__all__]
    classes = [c for c in exported if isinstance(c, type)]
    file_sources = {
        c.__name__
        for c in classes
        if issubclass(c, LightningDataModule) or "path" in inspect.signature(c).parameters
    }
    assert {"FilePrompts", "PreferencePairs", "SFTDataModule", "TextChunks"} <= file_sources
    assert sorted(file_sources - set(DOCUMENTED)) == []


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_table_matches_the_signature(name: str) -> None:
    params = {
        p.name: p.default
        for p in inspect.signature(getattr(lit_rlhf.data, name).__init__).parameters.values()
        if p.name != "self"
    }
    rows = DOCUMENTED[name]
    assert sorted(set(params) - set(rows)) == [], f"{name}: settings missing from docs/data.md"
    assert sorted(set(rows) - set(params)) == [], f"{name}: docs/data.md lists unknown settings"
    for setting, default in params.items():
        assert rows[setting] == shown(default), f"{name}.{setting}: the docs' default differs"
