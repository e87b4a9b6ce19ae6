"""The judges' per-row records (issue 40 item 5): what each inference rule said on each held-out
row of ConsistRM's and ReflectRM's reproductions, kept in the runs' figures so that
``results.json`` holds them and the primaries' pair-clustered bootstrap
(:func:`repro.intervals.clustered_difference`) can resample the rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from repro.judge_common import Judged, majority

RULES = ("greedy", "majority", "reflective")


def row_outputs(judged: Sequence[Judged], rule: str) -> list[dict[str, Any]]:
    """The per-row record of one inference rule (``greedy``, ``majority``, ``reflective`` or
    ``anchor``): each row's id, its pair (``family``: the bootstrap's cluster), gold label, the
    verdict (and the votes it came from) and whether it was right."""
    out = []
    for j in judged:
        verdict = {"greedy": j.greedy, "majority": majority(j.votes), "reflective": j.reflective,
                   "anchor": None if j.anchor is None else j.votes[j.anchor]}[rule]  # fmt: skip
        row: dict[str, Any] = {"id": j.query_id, "family": j.family, "label": j.label,
                               "verdict": verdict, "right": verdict == j.label}  # fmt: skip
        if rule != "greedy":
            row["votes"] = list(j.votes)
        if rule in ("reflective", "anchor"):
            row["anchor"] = j.anchor
        out.append(row)
    return out
