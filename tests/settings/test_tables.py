"""README's settings overview and docs/settings.md equal what the settings dataclasses generate
(``python scripts/settings_tables.py`` rewrites both)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "settings_tables", ROOT / "scripts/settings_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_and_docs_show_the_generated_tables() -> None:
    for path, text in _script().render().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} differs from the settings dataclasses. Fix: run "
            "python scripts/settings_tables.py"
        )


def test_the_tables_name_every_group_and_field() -> None:
    script = _script()
    page = (ROOT / "docs" / "settings.md").read_text()
    for group in script.groups():
        for spec in dataclasses.fields(group):
            assert f"| `{group.GROUP}.{spec.name}` |" in page
    assert "| `optim` |" in (ROOT / "README.md").read_text()
