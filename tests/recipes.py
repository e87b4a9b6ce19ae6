"""Read docs/recipes.md (the authors' recipe of every GPU preset) and hold a composed config to it.

The format is described at the top of docs/recipes.md: a heading
``### configs/<family>/<name>.yaml`` (optionally ``+ configs/trainer/<fragment>.yaml``) opens
the table of one preset; its rows are
``| setting | authors | source | ours | deviation |``. A ``setting`` in backticks is a dotted path
into the composed config (``model.init_args.optim.lr``; a list entry by the class name of its
``class_path``, ``trainer.callbacks[TrustRegionEntropy].init_args.alpha``, or by index, ``[0]``);
``script:<name> ...`` names a setting outside the config, which is not checked here. ``authors``
and ``ours`` are YAML values in backticks; an ``authors`` cell without backticks is prose (the
authors fix no value there), which equals nothing, so its row needs a deviation reason. The
``source`` cites a file and line, a paper's section, table or equation, or says ``unverified: why``
(:func:`citation`, :func:`check_citations`).

Used by tests/test_preset_dry_run.py; unit-tested in tests/test_recipes.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

RECIPES = Path(__file__).parents[1] / "docs" / "recipes.md"
_HEADING = re.compile(
    r"^###\s+`?(configs/\S+?\.yaml)`?(?:\s*\+\s*`?(configs/trainer/\S+?\.yaml)`?)?\s*$"
)
_STEP = re.compile(r"([^.\[\]]+)|\[([^\]]+)\]")
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
REL_TOL = 1e-9
# The three forms of a source cell (docs/recipes.md, "Table format"): a file and line of the
# authors' code (``path:12`` or ``path:12,30``), a section / table / equation of a paper
# (``P §4.1``, ``P Table 2``, ``P eq. 13``, ``P abstract``, ``P[ICAE] §3.1``), or
# ``unverified: why``.
_FILE_CITE = re.compile(r"[\w.\-/]+\.[A-Za-z]{1,5}:\d+(?:,\d+)*\b")
_PAPER_CITE = re.compile(
    r"(?<![\w`])P(?:\[[^\]]+\])? (?:§ ?\d[\w.]*|Table [\w.]+|eq\. ?\d+|Fig\. ?\d+|abstract)"
)
_UNVERIFIED = re.compile(r"unverified: *\S")


@dataclass(frozen=True)
class RecipeRow:
    """One row of a preset's table; ``authors`` / ``ours`` are parsed YAML values, or the cell's
    text when the cell is not in backticks (``authors_is_value`` / ``ours_is_value`` False)."""

    setting: str
    authors: Any
    authors_is_value: bool
    source: str
    ours: Any
    ours_is_value: bool
    deviation: str
    line: int

    @property
    def is_config(self) -> bool:
        """A dotted config path (checked), not a ``script:`` setting."""
        return not self.setting.startswith("script:")

    @property
    def citation(self) -> str | None:
        """How ``source`` cites the authors' value: ``file``, ``paper``, ``unverified``, or None."""
        return citation(self.source)


def citation(source: str) -> str | None:
    """``unverified`` (the cell starts ``unverified: <why>``), ``file`` (a ``path:line``),
    ``paper`` (``P §...``, ``P Table ...``, ``P eq. ...``, ``P abstract``), or None: no citation."""
    if _UNVERIFIED.match(source):
        return "unverified"
    if _FILE_CITE.search(source):
        return "file"
    if _PAPER_CITE.search(source):
        return "paper"
    return None


def check_citations(tables: dict[str, RecipeTable]) -> list[str]:
    """Every row whose source cites neither a file and line, nor a paper's section, table or
    equation, nor says ``unverified: <why>``."""
    return [
        f"docs/recipes.md:{row.line} `{row.setting}` ({name}): the source {row.source!r} cites "
        "no `path:line`, no `P §...` / `P Table ...` / `P eq. ...`, and is not `unverified: <why>`"
        for name, table in tables.items()
        for row in table.rows
        if row.citation is None
    ]


@dataclass(frozen=True)
class RecipeTable:
    config: str  # configs/<family>/<name>.yaml
    fragment: str | None  # configs/trainer/<fragment>.yaml composed after it, or None
    rows: tuple[RecipeRow, ...]


def load_recipes(path: Path = RECIPES) -> dict[str, RecipeTable]:
    """Every preset table of ``path``, by config path."""
    return parse_recipes(path.read_text())


def parse_recipes(text: str) -> dict[str, RecipeTable]:
    """Every preset table of the markdown ``text``, by config path (a second table for the same
    config is an error)."""
    tables: dict[str, RecipeTable] = {}
    current: tuple[str, str | None] | None = None
    rows: list[RecipeRow] = []

    def close() -> None:
        if current is not None:
            if current[0] in tables:
                raise ValueError(f"docs/recipes.md: two tables for {current[0]}")
            tables[current[0]] = RecipeTable(current[0], current[1], tuple(rows))

    for number, line in enumerate(text.splitlines(), start=1):
        heading = _HEADING.match(line.strip())
        if heading:
            close()
            current, rows = (heading.group(1), heading.group(2)), []
        elif line.startswith("#"):
            close()
            current, rows = None, []
        elif current is not None and line.lstrip().startswith("|"):
            row = _parse_row(line, number)
            if row is not None:
                rows.append(row)
    close()
    return tables


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row (``\\|`` is a literal bar)."""
    body = line.strip().strip("|").replace("\\|", "\0")
    return [cell.replace("\0", "|").strip() for cell in body.split("|")]


def _parse_row(line: str, number: int) -> RecipeRow | None:
    cells = _cells(line)
    if cells[0].lower() == "setting" or set("".join(cells)) <= set("-: "):
        return None  # the header or the separator
    if len(cells) != 5:
        raise ValueError(
            f"docs/recipes.md line {number}: a row needs 5 cells (setting | authors | source | "
            f"ours | deviation), got {len(cells)}: {line.strip()}"
        )
    setting, authors, source, ours, deviation = cells
    setting = setting.strip("`").strip()
    authors_value, authors_ok = _value(authors, number)
    ours_value, ours_ok = _value(ours, number)
    return RecipeRow(
        setting, authors_value, authors_ok, source, ours_value, ours_ok, deviation, number
    )


def _value(cell: str, number: int) -> tuple[Any, bool]:
    if len(cell) >= 2 and cell.startswith("`") and cell.endswith("`"):
        try:
            value = yaml.safe_load(cell[1:-1])
        except yaml.YAMLError as err:
            raise ValueError(f"docs/recipes.md line {number}: {cell} is not YAML: {err}") from None
        return _number(value), True
    return cell, False


def _number(value: Any) -> Any:
    """YAML 1.1 reads ``1e-6`` (no dot) as a string: read it as the float it means."""
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        return float(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def lookup(config: Any, path: str) -> Any:
    """The value at the dotted ``path`` of a composed config; KeyError naming the missing step."""
    node, walked = config, ""
    for name, selector in _STEP.findall(path):
        step = name or f"[{selector}]"
        if name:
            if not isinstance(node, dict) or name not in node:
                raise KeyError(f"{path}: {walked or 'the config'} has no {name!r}")
            node = node[name]
        else:
            node = _select(node, selector, path, walked)
        walked = f"{walked}.{step}" if name and walked else walked + step
    return node


def _select(node: Any, selector: str, path: str, walked: str) -> Any:
    if not isinstance(node, list):
        raise KeyError(f"{path}: {walked} is not a list (got {type(node).__name__})")
    if selector.lstrip("-").isdigit():
        index = int(selector)
        if not -len(node) <= index < len(node):
            raise KeyError(f"{path}: {walked} has {len(node)} entries, no [{index}]")
        return node[index]
    found = [
        item
        for item in node
        if isinstance(item, dict) and str(item.get("class_path", "")).split(".")[-1] == selector
    ]
    if len(found) != 1:
        raise KeyError(f"{path}: {walked} holds {len(found)} entries of class {selector}, not 1")
    return found[0]


# The rows every vLLM preset's table holds: settings that a CPU dry run (the HF engine, one
# process) cannot exercise, so only the table can hold them to the authors'.
VLLM_ROWS = {
    "engine": ("model.init_args.engine.class_path",),
    "rollout dtype": ("model.init_args.engine.init_args.dtype",),
    "tensor parallel size": ("tensor_parallel_size", "tensor_model_parallel_size"),
    "devices per node": ("trainer.devices",),
    "nodes": ("trainer.num_nodes",),
    "sleep mode": ("model.init_args.engine.init_args.enable_sleep_mode",),
    "weight-sync snapshot": ("model.init_args.engine.init_args.snapshot_device",),
}


def uses_vllm(preset: Any) -> bool:
    """The preset's YAML (as loaded) rolls out with ``VLLMGenerationEngine``."""
    engine = ((preset or {}).get("model") or {}).get("init_args", {}).get("engine") or {}
    return str(engine.get("class_path", "")).endswith("VLLMGenerationEngine")


def missing_vllm_rows(table: RecipeTable) -> list[str]:
    """The rows of :data:`VLLM_ROWS` that ``table`` lacks (a tensor-parallel row matches by
    name: it is a ``script:`` row, as lit-rlhf's vLLM engine has no such setting)."""
    settings = [row.setting for row in table.rows]
    return [
        what
        for what, names in VLLM_ROWS.items()
        if not any(s == n or s.endswith(n) for s in settings for n in names)
    ]


def values_equal(a: Any, b: Any) -> bool:
    """YAML values equal; numbers within a relative tolerance of 1e-9 (bools only to bools)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def check_table(table: RecipeTable, config: Any) -> list[str]:
    """Every problem of a composed ``config`` against its recipe ``table`` (empty: it holds).

    For each config row: the config's value equals ``ours``, and ``ours`` equals ``authors``
    unless the row gives a deviation reason; a path missing from the config is a problem."""
    problems = []
    for row in table.rows:
        where = f"docs/recipes.md:{row.line} `{row.setting}`"
        if not row.is_config:
            continue
        if not row.ours_is_value:
            problems.append(f"{where}: ours must be a YAML value in backticks, got {row.ours!r}")
            continue
        try:
            value = lookup(config, row.setting)
        except KeyError as err:
            problems.append(f"{where}: not in the composed config ({err.args[0]})")
            continue
        if not values_equal(value, row.ours):
            problems.append(
                f"{where}: the config holds {value!r}, the table says ours = {row.ours!r}"
            )
        same = row.authors_is_value and values_equal(row.ours, row.authors)
        if not same and not row.deviation:
            problems.append(
                f"{where}: ours = {row.ours!r} differs from the authors' {row.authors!r} and the "
                "row gives no deviation reason"
            )
    return problems
