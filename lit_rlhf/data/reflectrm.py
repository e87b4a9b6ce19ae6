"""ReflectRM's training records (arXiv 2604.07506): hard preference items, and analysis-preference
("reflection") items built from a base judge's own correct and wrong analyses of them.

:func:`build_reflectrm_records` is the pure part of ``scripts/data/build_reflectrm_data.py``: given
each preference item and the base judge's N judgments of it (analysis text, verdict), it drops the
items the judge got right in all N, pairs one correct analysis with one wrong one per remaining
item (random order, the label pointing at the correct one) and mixes the two kinds 4 : 1. The
records are JSONL rows of the ``pairs`` schema that :class:`~lit_rlhf.data.PreferencePairs`
reads; their ``task`` column tells them apart (``preference`` / ``reflection``).

Decisions the paper leaves open:
- an item whose N judgments are all wrong (or unreadable) stays a preference record but gives no
  reflection record (there is no correct analysis to prefer); an unreadable judgment counts as
  wrong for dropping and is never used as an analysis;
- the mix is exact: the reflection records are cut to ``floor(P / ratio)`` and, when fewer exist,
  the preference records to ``ratio`` times their number (the statistics say what was cut); when
  no reflection record can be kept, every preference record is (the script warns).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Judgment:
    """One base-judge output on a preference item: its analysis (the text before the result)
    and its verdict (-1 / +1, None when unreadable)."""

    analysis: str
    verdict: int | None


@dataclass(frozen=True)
class RecordStats:
    """What :func:`build_reflectrm_records` kept and dropped."""

    items: int  # preference items read
    all_correct: int  # dropped: judged correctly in every sample
    preference: int  # preference records written
    reflection: int  # reflection records written
    preference_cut: int  # hard items left out to keep the mix
    reflection_cut: int  # reflection candidates left out to keep the mix
    no_correct_analysis: int  # hard items with no correct, readable analysis


def build_reflectrm_records(
    items: Sequence[Mapping[str, Any]],
    judgments: Sequence[Sequence[Judgment]],
    *,
    seed: int = 0,
    ratio: int = 4,
) -> tuple[list[dict[str, Any]], RecordStats]:
    """The mixed, shuffled ReflectRM records and what was kept.

    Args:
        items: preference items with ``id``, ``prompt``, ``response_1``, ``response_2`` and
            ``label`` (-1: response 1 better, +1: response 2 better); ``subset`` optional.
        judgments: per item, the base judge's N judgments.
        seed: seeds the choice of analyses, their order, the cuts and the shuffle.
        ratio: preference records per reflection record (the paper's 4).
    """
    if len(items) != len(judgments):
        raise ValueError(f"{len(items)} items but {len(judgments)} judgment lists")
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1, got {ratio}")
    rng = random.Random(seed)
    preference: list[dict[str, Any]] = []
    reflection: list[dict[str, Any]] = []
    all_correct = no_correct = 0
    for index, (item, samples) in enumerate(zip(items, judgments, strict=True)):
        label = item.get("label")
        if label not in (-1, 1) or not samples:
            raise ValueError(
                f"item {index} (id {item.get('id')!r}): needs label -1 or +1 and at least one "
                f"judgment, got label={label!r} and {len(samples)} judgments"
            )
        correct = [j.analysis for j in samples if j.verdict == label and j.analysis.strip()]
        wrong = [j.analysis for j in samples if j.verdict == -label and j.analysis.strip()]
        if all(j.verdict == label for j in samples):
            all_correct += 1
            continue
        preference.append(_record(item, "preference", label))
        if not correct or not wrong:
            no_correct += not correct
            continue
        good, bad = rng.choice(correct), rng.choice(wrong)
        good_first = rng.random() < 0.5
        critiques = (good, bad) if good_first else (bad, good)
        reflection.append(_record(item, "reflection", -1 if good_first else 1, critiques=critiques))
    keep_reflection = min(len(reflection), len(preference) // ratio)
    keep_preference = (
        min(len(preference), keep_reflection * ratio) if keep_reflection else len(preference)
    )
    records = rng.sample(preference, keep_preference) + rng.sample(reflection, keep_reflection)
    rng.shuffle(records)
    stats = RecordStats(
        items=len(items),
        all_correct=all_correct,
        preference=keep_preference,
        reflection=keep_reflection,
        preference_cut=len(preference) - keep_preference,
        reflection_cut=len(reflection) - keep_reflection,
        no_correct_analysis=no_correct,
    )
    return records, stats


def _record(
    item: Mapping[str, Any], task: str, label: int, *, critiques: tuple[str, str] | None = None
) -> dict[str, Any]:
    record = {
        "id": str(item["id"]) + ("#reflection" if critiques else ""),
        "task": task,
        "prompt": item["prompt"],
        "response_1": item["response_1"],
        "response_2": item["response_2"],
        "label": label,
        "subset": str(item.get("subset") or ""),
    }
    if critiques:
        record["critique_1"], record["critique_2"] = critiques
    return record
