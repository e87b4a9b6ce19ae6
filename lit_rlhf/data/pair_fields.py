"""Row readers shared by the preference-pair schemas (:mod:`lit_rlhf.data.pairs` and the judge
benchmarks of :mod:`lit_rlhf.data.judge_benchmarks`): the error a malformed row raises, typed
field readers whose messages name source, row and field, and the schema record.

A schema's ``read(row, where)`` returns one comparison (a :data:`Read`) or, for a benchmark row
that holds several (RM-Bench's 3 x 3 style variants, an RMB Best-of-N list), a
:class:`Comparisons`: one pair record is made per comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from lit_rlhf.errors import DataError

HH_ASSISTANT = "\n\nAssistant:"  # opens an assistant turn of an HH-RLHF transcript

Read = tuple[str, str, str, int | None, str]
"""prompt, response 1, response 2, label (-1: response 1 better, +1: response 2, 0: a tie,
None: unlabelled), subset"""


class MalformedRow(DataError):
    """A data row that cannot become a pair; the message names source, row, field and fix."""


class Comparisons(NamedTuple):
    """The comparisons of one benchmark row; each becomes a pair with the id ``"{row id}/{tag}"``
    and its tag in the ``comparison`` column (an empty tag keeps the row id)."""

    key: str | None  # the row's id; None: the schema's id column or a hash of the texts
    items: list[tuple[str, Read]]  # (tag, comparison)


class Schema(NamedTuple):
    """How rows of one data format become pairs."""

    read: Callable[[Mapping[str, Any], str], Read | Comparisons]
    columns: tuple[str, ...]  # required; the last two hold the responses (named in messages)
    id_field: str | None  # the data's own id column, used where a row has one
    chosen_first: bool = False  # (chosen, rejected) data: each pair placed by a seeded coin


def text_value(value: Any, what: str, where: str) -> str:
    """``value`` as a non-empty string; ``what`` names it in the error (``"field 'prompt'"``)."""
    if not isinstance(value, str) or not value.strip():
        got = "missing/None" if value is None else f"{type(value).__name__} {value!r}"
        raise MalformedRow(
            f"{where}: {what} must be a non-empty string, got {got:.100}. Fix: repair or remove "
            "the row, or choose the schema= that matches the data."
        )
    return value


def text_field(row: Mapping[str, Any], field: str, where: str) -> str:
    """The row's ``field`` as a non-empty string."""
    return text_value(row.get(field), f"field {field!r}", where)


def integer_value(value: Any) -> int | None:
    """An int from an int or an integral float (CSV/parquet may store ints as floats)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None


def chat_turns(turns: Any, where: str, field: str) -> list[Mapping[str, Any]]:
    """``turns`` checked to be a non-empty list of chat turns, each with a string ``role``."""
    if (
        not isinstance(turns, list)
        or not turns
        or not all(isinstance(t, Mapping) and isinstance(t.get("role"), str) for t in turns)
    ):
        raise MalformedRow(
            f"{where}: field {field!r} must be a non-empty list of {{role, content}} chat turns, "
            f"got {turns!r:.100}. Fix: repair or remove the row."
        )
    return turns


def conversation_text(turns: Any, where: str, field: str = "context") -> str:
    """A list of chat turns ``{role, content}`` as text: one turn as its content, several as
    ``"User: ..\\n\\nAssistant: .."`` (HelpSteer3's ``context``, RMB's ``conversation_input``)."""
    turns = chat_turns(turns, where, field)
    texts = [
        text_field(t, "content", f"{where}, field {field!r} turn {i}") for i, t in enumerate(turns)
    ]
    if len(turns) == 1:
        return texts[0]
    return "\n\n".join(
        f"{t['role'].capitalize()}: {text}" for t, text in zip(turns, texts, strict=True)
    )
