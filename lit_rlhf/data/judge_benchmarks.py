"""The judge benchmarks the two judge papers report (ConsistRM arXiv 2604.07484: RewardBench /
PPE / RM-Bench / RMB / JudgeBench; ReflectRM arXiv 2604.07506: RewardBench / RM-Bench / RMB /
PPE) as :class:`~lit_rlhf.data.PreferencePairs` schemas, fields as the benchmarks publish them:

- ``rm_bench`` (RM-Bench, arXiv 2410.16184, ``THU-KEG/RM-Bench``): ``id``, ``prompt``,
  ``chosen`` and ``rejected`` (3 responses each, in the styles concise / detailed plain /
  detailed markdown), ``domain`` (chat, code, math, safety-refuse, safety-response; the per-domain
  files of the authors' repo have none). Each row is 3 x 3 = 9 comparisons, chosen style i
  against rejected style j, tagged ``"c{i}r{j}"``; the row id is ``"{domain}-{id}"`` (ids repeat
  across the domain files). The benchmark's hard / normal / easy accuracies are the comparisons
  with i < j / i = j / i > j (:mod:`lit_rlhf.metrics.judge_benchmarks`).
- ``rmb`` (RMB, arXiv 2410.09893; no hub copy: the ``RMB_dataset`` folder of
  github.com/Zhou-Zoey/RMB-Reward-Model-Benchmark): ``conversation_input`` (chat turns),
  ``category_path`` (``"Pairwise_set/Helpfulness/Code/..."``, ``"BoN_set/Harmlessness/S1"``);
  a pairwise row has ``pair_uid``, ``chosen`` and ``reject`` (``{llm_name, answer}``), a
  Best-of-N row ``bon_uid``, ``bon_best`` and ``loser_list`` (the best against each loser,
  tagged ``"loser{k}"``). Subsets: ``helpfulness-pairwise``, ``helpfulness-bon``,
  ``harmlessness-pairwise``, ``harmlessness-bon``. Pairwise and BoN files have different
  columns: load them as separate sources.
- ``judgebench`` (JudgeBench, arXiv 2410.12784, ``ScalerLab/JudgeBench``, splits ``gpt`` and
  ``claude``): ``pair_id``, ``question``, ``response_A``, ``response_B``, ``label`` (``"A>B"`` or
  ``"B>A"``), ``source``; subsets are the paper's categories by source: knowledge (mmlu-pro),
  reasoning (livebench-reasoning), math (livebench-math), coding (livecodebench).
- ``ppe_preference`` (PPE human preference, arXiv 2410.14872,
  ``lmarena-ai/PPE-Human-Preference-V1``, split ``test``): ``prompt``, ``response_1``,
  ``response_2`` (from ``model_a`` / ``model_b``), ``winner`` (``model_a``, ``model_b``, ``tie``,
  ``tie (bothbad)``; ties are dropped unless ``keep_ties``). ``question_id`` is not used as the
  pair id (the id is a hash of the texts), so a repeated question cannot merge two battles.

Chosen / rejected data (RM-Bench, RMB) place the chosen response first or second by a seeded coin
per comparison; JudgeBench and PPE keep the published order. Offline samples in these schemas,
synthetic rows written for the tests, are in ``lit_rlhf/data/samples/*_synthetic.json*``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from lit_rlhf.data.pair_fields import (
    Comparisons,
    MalformedRow,
    Read,
    Schema,
    conversation_text,
    text_field,
    text_value,
)

RM_BENCH_STYLES = ("concise", "detailed", "detailed markdown")  # order of chosen / rejected


class JudgeBenchmark(NamedTuple):
    """Where a benchmark is published and how to read it."""

    title: str  # as the papers name it
    schema: str  # the PreferencePairs schema
    hub_id: str | None  # None: no hub copy, give local files
    split: str
    config: str | None = None


JUDGE_BENCHMARKS: dict[str, JudgeBenchmark] = {
    "rewardbench": JudgeBenchmark("RewardBench", "rewardbench", "allenai/reward-bench", "filtered"),
    "rm_bench": JudgeBenchmark("RM-Bench", "rm_bench", "THU-KEG/RM-Bench", "train"),
    "rmb": JudgeBenchmark("RMB", "rmb", None, "train"),
    "judgebench": JudgeBenchmark("JudgeBench", "judgebench", "ScalerLab/JudgeBench", "gpt"),
    "ppe_preference": JudgeBenchmark(
        "PPE-Preference", "ppe_preference", "lmarena-ai/PPE-Human-Preference-V1", "test"
    ),
    "helpsteer3": JudgeBenchmark("HelpSteer3", "helpsteer3", "nvidia/HelpSteer3", "validation"),
}


def rm_bench_tag(chosen_style: int, rejected_style: int) -> str:
    """The comparison tag of RM-Bench's chosen style ``i`` against rejected style ``j``."""
    return f"c{chosen_style}r{rejected_style}"


def _read_rm_bench(row: Mapping[str, Any], where: str) -> Comparisons:
    prompt = text_field(row, "prompt", where)
    chosen, rejected = (_styles(row, field, where) for field in ("chosen", "rejected"))
    domain = row.get("domain") or ""
    if not isinstance(domain, str):
        raise MalformedRow(
            f"{where}: field 'domain' must be a string (chat, code, math, safety-refuse, "
            f"safety-response), got {domain!r:.60}. Fix: repair or remove the row."
        )
    items: list[tuple[str, Read]] = []
    for i, better in enumerate(chosen):
        for j, worse in enumerate(rejected):
            if better.strip() == worse.strip():
                raise MalformedRow(
                    f"{where}: field 'rejected' item {j} is identical to field 'chosen' item "
                    f"{i}, so that comparison has no preference. Fix: remove the row."
                )
            items.append((rm_bench_tag(i, j), (prompt, better, worse, -1, domain)))
    raw_id = row.get("id")
    key = None if raw_id in (None, "") else (f"{domain}-{raw_id}" if domain else str(raw_id))
    return Comparisons(key, items)


def _styles(row: Mapping[str, Any], field: str, where: str) -> list[str]:
    value = row.get(field)
    if not isinstance(value, list) or len(value) != len(RM_BENCH_STYLES):
        raise MalformedRow(
            f"{where}: field {field!r} must be a list of {len(RM_BENCH_STYLES)} responses "
            f"({', '.join(RM_BENCH_STYLES)}), got {value!r:.100}. Fix: repair or remove the row."
        )
    return [text_value(v, f"field {field!r} item {i}", where) for i, v in enumerate(value)]


_RMB_PATH = re.compile(r"(Pairwise|BoN)_set/(Helpfulness|Harmlessness)(/|$)")


def _read_rmb(row: Mapping[str, Any], where: str) -> Comparisons:
    path = text_field(row, "category_path", where)
    match = _RMB_PATH.match(path)
    if match is None:
        raise MalformedRow(
            f"{where}: field 'category_path' must start with Pairwise_set/ or BoN_set/ and then "
            f"Helpfulness or Harmlessness (RMB's folders), got {path!r:.100}. Fix: repair or "
            "remove the row."
        )
    kind, goal = match[1], match[2]
    subset = f"{goal.lower()}-{kind.lower()}"
    prompt = conversation_text(row.get("conversation_input"), where, "conversation_input")
    if kind == "Pairwise":
        chosen, rejected = _answer(row, "chosen", where), _answer(row, "reject", where)
        _differ(chosen, rejected, "field 'reject'", "field 'chosen'", where)
        return Comparisons(
            _rmb_key(row, "pair_uid"), [("", (prompt, chosen, rejected, -1, subset))]
        )
    best = _answer(row, "bon_best", where)
    losers = row.get("loser_list")
    if not isinstance(losers, list) or not losers:
        raise MalformedRow(
            f"{where}: field 'loser_list' must be a non-empty list of {{llm_name, answer}}, got "
            f"{losers!r:.100}. Fix: repair or remove the row."
        )
    items: list[tuple[str, Read]] = []
    for k, loser in enumerate(losers):
        what = f"field 'loser_list' item {k}"
        worse = _answer({"loser": loser}, "loser", where, what)
        _differ(best, worse, what, "field 'bon_best'", where)
        items.append((f"loser{k}", (prompt, best, worse, -1, subset)))
    return Comparisons(_rmb_key(row, "bon_uid"), items)


def _answer(row: Mapping[str, Any], field: str, where: str, what: str | None = None) -> str:
    """The ``answer`` of an RMB response record ``{llm_name, answer}``."""
    what = what or f"field {field!r}"
    record = row.get(field)
    if not isinstance(record, Mapping):
        raise MalformedRow(
            f"{where}: {what} must be a record {{llm_name, answer}}, got {record!r:.100}. Fix: "
            "repair or remove the row, or load RMB's pairwise and BoN files as separate sources."
        )
    return text_value(record.get("answer"), f"{what} 'answer'", where)


def _differ(better: str, worse: str, worse_what: str, better_what: str, where: str) -> None:
    if better.strip() == worse.strip():
        raise MalformedRow(
            f"{where}: {worse_what} is identical to {better_what}, so the comparison has no "
            "preference. Fix: remove the row."
        )


def _rmb_key(row: Mapping[str, Any], field: str) -> str | None:
    """``"pair_uid:15089"`` / ``"bon_uid:3294"``: the two sets number their rows separately."""
    value = row.get(field)
    return None if value in (None, "") else f"{field}:{value}"


JUDGEBENCH_CATEGORIES = (
    ("mmlu-pro", "knowledge"),
    ("livebench-reasoning", "reasoning"),
    ("livebench-math", "math"),
    ("livecodebench", "coding"),
)
_JUDGEBENCH_LABELS = {"A>B": -1, "B>A": 1}


def _read_judgebench(row: Mapping[str, Any], where: str) -> Read:
    given = row.get("label")
    label = _JUDGEBENCH_LABELS.get(given) if isinstance(given, str) else None
    if label is None:
        raise MalformedRow(
            f"{where}: field 'label' must be 'A>B' (response A better) or 'B>A', got "
            f"{given!r:.60}. Fix: repair or remove the row (JudgeBench has no ties)."
        )
    source = str(row.get("source") or "")
    subset = next((name for prefix, name in JUDGEBENCH_CATEGORIES if source.startswith(prefix)), "")
    texts = [text_field(row, field, where) for field in ("question", "response_A", "response_B")]
    return texts[0], texts[1], texts[2], label, subset or source


_PPE_WINNERS = {"model_a": -1, "model_b": 1, "tie": 0, "tie (bothbad)": 0}


def _read_ppe(row: Mapping[str, Any], where: str) -> Read:
    winner = row.get("winner")
    if not isinstance(winner, str) or winner not in _PPE_WINNERS:
        raise MalformedRow(
            f"{where}: field 'winner' must be one of {', '.join(map(repr, _PPE_WINNERS))}, got "
            f"{winner!r:.60}. Fix: repair or remove the row."
        )
    texts = [text_field(row, field, where) for field in ("prompt", "response_1", "response_2")]
    return texts[0], texts[1], texts[2], _PPE_WINNERS[winner], ""


BENCHMARK_SCHEMAS: dict[str, Schema] = {
    "rm_bench": Schema(_read_rm_bench, ("prompt", "chosen", "rejected"), None, chosen_first=True),
    "rmb": Schema(_read_rmb, ("category_path", "conversation_input"), None, chosen_first=True),
    "judgebench": Schema(
        _read_judgebench, ("label", "question", "response_A", "response_B"), "pair_id"
    ),
    "ppe_preference": Schema(_read_ppe, ("winner", "prompt", "response_1", "response_2"), None),
}
