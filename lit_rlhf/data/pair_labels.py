"""Which response of a labelled pair row is the chosen one, for the modules that train on pair
rows (``query``, ``response_1``, ``response_2``, ``label``: -1 = response 1 better, +1 =
response 2 better): the scalar reward model and DPO."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_rlhf.data.judge_templates import require_label

KEEP_LABELLED = "use a labelled source, and leave PreferencePairs(keep_ties=False)."


def chosen_and_rejected(
    rows: Sequence[Mapping[str, Any]], *, user: str, fix: str = KEEP_LABELLED
) -> tuple[list[int], list[int]]:
    """Per row, the index (1 or 2) of the chosen and of the rejected response; a ValueError
    naming the row, ``user`` (what needs the label) and ``fix`` for a row without a -1 / +1
    label (a tie or an unlabelled row)."""
    chosen, rejected = [], []
    for i, row in enumerate(rows):
        label = require_label(row, i, user=user, fix=fix)
        chosen.append(1 if label == -1 else 2)
        rejected.append(2 if label == -1 else 1)
    return chosen, rejected
