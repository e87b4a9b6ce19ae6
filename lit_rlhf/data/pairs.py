"""Preference pairs for generative reward models (LLM judges that read a query and two responses
and write a critique and a verdict: ConsistRM arXiv 2604.07484, ReflectRM arXiv 2604.07506).

Pair sources are prompt sources (:class:`~lit_rlhf.data.sources.PromptSource`), so a judge module
trains from the same :class:`~lit_rlhf.data.PromptDataModule` as PPO. Columns of every row:

- ``query_id`` (str): the pair id, or ``"<pair id>#swap"`` for the order-swapped copy: one id per
  (pair, order), the key of ConsistRM's per-query memory;
- ``family_id`` (str): the pair id, shared by both orders;
- ``task`` (str): ``"judge"`` unless configured;
- ``question`` (str): the judge instruction (:mod:`lit_rlhf.data.judge_templates`), the user
  message the data module wraps in the chat template;
- ``query``, ``response_1``, ``response_2`` (str): the query and the responses as shown;
- ``label`` (int | None): -1 = response 1 better, +1 = response 2 better, None = unlabelled;
  swapping the order negates it;
- ``subset`` (str, ``""`` when none; ``"reflection"`` for reflection pairs), ``swapped`` (bool),
  ``template`` (str, the template name);
- ``comparison`` (str): which comparison of its benchmark row the pair is (RM-Bench ``"c0r2"``:
  chosen style 0 against rejected style 2; RMB Best-of-N ``"loser1"``), ``""`` for a row that
  is one comparison; such a pair's id is ``"{row id}/{comparison}"``;
- ``subject`` (str): what the verdict compares, ``"Response"``, or ``"Critique"`` for a ReflectRM
  reflection pair (analysis preference), whose ``critique_1`` / ``critique_2`` (str, None on
  other rows) hold the two critiques and whose ``label`` says which critique is better.

The raw query is the ``query`` column (files name it ``prompt``): ``PromptDataModule`` gives
every row a ``prompt`` of its own, the chat-rendered judge prompt.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections import Counter
from collections.abc import Mapping
from typing import Any, Literal

from lit_rlhf.data.judge_benchmarks import BENCHMARK_SCHEMAS
from lit_rlhf.data.judge_templates import (
    PreferencePair,
    SwapMode,
    check_pair_options,
    judge_rows,
    seeded_coin,
)
from lit_rlhf.data.pair_fields import (
    HH_ASSISTANT,
    Comparisons,
    MalformedRow,
    Read,
    Schema,
    conversation_text,
    integer_value,
    text_field,
)
from lit_rlhf.data.sources import _load_table
from lit_rlhf.data.trl_pairs import detect_pair_schema, read_trl
from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


PairSchema = Literal[
    "auto",
    "trl",
    "pairs",
    "helpsteer3",
    "hh_rlhf",
    "ultrafeedback",
    "rewardbench",
    "rm_bench",
    "rmb",
    "judgebench",
    "ppe_preference",
]


class PreferencePairs:
    """Preference pairs from a local file/folder (``.json``/``.jsonl``/``.parquet``/``.csv``) or
    a hub dataset, in one of these schemas (fields as on the datasets' cards):

    - ``auto`` (the default): detected from the columns of the first row
      (:func:`~lit_rlhf.data.trl_pairs.detect_pair_schema`): ``pairs``, ``helpsteer3``,
      ``hh_rlhf`` or ``trl``.
    - ``trl``: TRL's preference rows, ``prompt`` (optional with conversations), ``chosen``,
      ``rejected`` as strings or as ``{role, content}`` message lists
      (:mod:`lit_rlhf.data.trl_pairs`); optional ``subset``, ``id``.
    - ``pairs`` (ours): ``prompt``, ``response_1``, ``response_2`` (str); optional ``label``
      (-1: response 1 better, 1: response 2 better, null: unlabelled), ``subset``, ``id``, and
      ``task``: ``preference`` (the default) or ``reflection``, a ReflectRM analysis-preference
      record that also has ``critique_1`` and ``critique_2`` (its label: -1 critique 1 better,
      1 critique 2 better), as ``scripts/data/build_reflectrm_data.py`` writes them.
    - ``helpsteer3`` (``nvidia/HelpSteer3``, preference): ``context`` (chat turns
      ``{role, content}``; one turn becomes its text, several ``"User: ..\\n\\nAssistant: .."``),
      ``response1``, ``response2``, ``overall_preference`` in -3..3 (< 0: response 1 better,
      > 0: response 2, 0: tie; ties are dropped, or kept unlabelled with ``keep_ties``);
      ``domain`` becomes ``subset``.
    - ``hh_rlhf`` (``Anthropic/hh-rlhf``): ``chosen``, ``rejected``, whole transcripts
      ``"\\n\\nHuman: ..\\n\\nAssistant: .."``; the prompt is their shared text before the last
      ``"\\n\\nAssistant:"``, the responses their final assistant turns.
    - ``ultrafeedback`` (``HuggingFaceH4/ultrafeedback_binarized``, splits ``train_prefs`` /
      ``test_prefs``): ``prompt``; ``chosen``, ``rejected`` as message lists whose last message
      is the assistant's; id ``prompt_id``.
    - ``rewardbench`` (``allenai/reward-bench``, split ``filtered``): ``prompt``, ``chosen``,
      ``rejected``, ``subset``, ``id``.
    - ``rm_bench``, ``rmb``, ``judgebench``, ``ppe_preference``: the judge benchmarks of
      :mod:`lit_rlhf.data.judge_benchmarks` (RM-Bench and RMB rows hold several comparisons,
      one pair each).

    Chosen/rejected schemas put the chosen response first or second by a coin seeded by
    (``seed``, pair id), so labels are balanced and a pair's placement survives slicing.

    Args:
        path: a local file or folder, or a hub dataset id.
        split: split with optional slicing (``"train[:1000]"``); a single file is one split.
        template: the judge template (:data:`~lit_rlhf.data.judge_templates.JUDGE_TEMPLATES`).
        critique_template: the template of reflection records (a ``subject="Critique"`` one).
        swap: ``none``; ``both`` (each pair in both orders, 2N rows); ``random`` (each pair's
            order flipped by a coin seeded by (``seed``, pair id), N rows).
        seed: seeds the placement and swap coins.
        num_examples: keep the first this many pairs (before ``swap``, after dropped ties; the
            comparisons of one benchmark row stay together, so a row may take it past this).
        task: every row's ``task``.
        id_field: the column used as the pair id; ``None`` uses the schema's id column where a
            row has one, else ``"{task}-{sha1(prompt, responses in source order)[:12]}"``.
        keep_ties: keep HelpSteer3 ties (label None) instead of dropping them.
        skip_malformed: skip malformed rows with a warning instead of raising.
        name: the hub dataset's configuration name.
    """

    def __init__(
        self,
        path: str,
        schema: PairSchema = "auto",
        split: str = "train",
        template: str = "consistrm-v1",
        swap: SwapMode = "none",
        seed: int = 0,
        num_examples: int | None = None,
        task: str = "judge",
        id_field: str | None = None,
        keep_ties: bool = False,
        skip_malformed: bool = False,
        name: str | None = None,
        critique_template: str = "reflectrm-critique-v1",
    ) -> None:
        if schema != "auto" and schema not in _SCHEMAS:
            raise ValueError(f"unknown schema {schema!r}; available: auto, {', '.join(_SCHEMAS)}")
        check_pair_options(template, swap, num_examples, critique_template)
        self.critique_template = critique_template
        self.path, self.schema, self.split, self.name = path, schema, split, name
        self.template, self.swap, self.seed, self.task = template, swap, seed, task
        self.num_examples, self.id_field = num_examples, id_field
        self.keep_ties, self.skip_malformed = keep_ties, skip_malformed
        self.format: str = schema  # the schema read; ``auto`` is resolved by ``load``

    def load(self) -> Table:
        raw = _load_table(self.path, self.name, self.split)
        if self.schema == "auto":
            first = raw[0] if len(raw) else {}
            self.format = detect_pair_schema(self.path, raw.column_names, first)
        self._check_columns(raw.column_names)
        pairs = self._read_pairs(raw)
        if not pairs:
            raise ValueError(f"{self.path} (split {self.split!r}): no pairs left to judge")
        repeats = sum(n - 1 for n in Counter(p.pair_id for p in pairs).values())
        if repeats:
            warnings.warn(
                f"{self.path}: {repeats} pairs repeat an earlier pair id; they share per-query "
                "memory. Fix: set id_field= to a unique column, or null to hash the texts.",
                stacklevel=2,
            )
        rows = judge_rows(
            pairs,
            template=self.template,
            swap=self.swap,
            seed=self.seed,
            task=self.task,
            critique_template=self.critique_template,
        )
        return datasets.Dataset.from_list(rows)

    def _check_columns(self, columns: list[str]) -> None:
        needed = _SCHEMAS[self.format].columns
        missing = [c for c in needed if c not in columns]
        if missing:
            raise ValueError(
                f"{self.path}: row 0 has no field {missing[0]!r}, which schema {self.format!r} "
                f"needs ({list(needed)}). Fix: set schema= to the data's format "
                f"({', '.join(_SCHEMAS)}) or rename the columns (columns: {columns})."
            )
        if self.id_field is not None and self.id_field not in columns:
            raise ValueError(
                f"{self.path}: row 0 has no field {self.id_field!r}. Fix: set id_field= to one "
                f"of the columns {columns}, or id_field=null."
            )

    def _read_pairs(self, raw: datasets.Dataset) -> list[PreferencePair]:
        pairs: list[PreferencePair] = []
        skipped: list[str] = []
        ties = 0
        for index, row in enumerate(raw):
            if self.num_examples is not None and len(pairs) >= self.num_examples:
                break
            try:
                row_pairs, row_ties = self._read_row(
                    row, f"{self.path} (split {self.split!r}), row {index}"
                )
            except MalformedRow as err:
                if not self.skip_malformed:
                    raise
                skipped.append(str(err))
                continue
            pairs.extend(row_pairs)
            ties += row_ties
        if ties:
            warnings.warn(
                f"{self.path}: dropped {ties} tied pairs (HelpSteer3 overall_preference 0, PPE "
                "winner tie); keep_ties=True keeps them unlabelled",
                stacklevel=3,
            )
        if skipped:
            warnings.warn(
                f"{self.path}: skipped {len(skipped)} malformed rows, the first: {skipped[0]}",
                stacklevel=3,
            )
        return pairs

    def _read_row(self, row: Mapping[str, Any], where: str) -> tuple[list[PreferencePair], int]:
        """The row's pairs, one per comparison, and how many tied comparisons it dropped."""
        schema = _SCHEMAS[self.format]
        read = schema.read(row, where)
        key, items = (
            (read.key, read.items) if isinstance(read, Comparisons) else (None, [("", read)])
        )
        critiques = _critiques(row, where) if self.format == "pairs" else None
        texts = tuple(text for _, item in items for text in item[:3]) + (critiques or ())
        row_id = self._pair_id(row, where, schema.id_field, texts, key)
        pairs, ties = [], 0
        for tag, (prompt, first, second, label, subset) in items:
            if first.strip() == second.strip():
                raise MalformedRow(
                    f"{where}: field {schema.columns[-1]!r} is identical to "
                    f"{schema.columns[-2]!r}, so the pair has no preference. Fix: remove the row."
                )
            if label == 0:  # a tie
                if not self.keep_ties:
                    ties += 1
                    continue
                label = None
            pair_id = f"{row_id}/{tag}" if tag else row_id
            pair = PreferencePair(pair_id, prompt, first, second, label, subset, critiques, tag)
            if schema.chosen_first and seeded_coin(self.seed, pair_id, "place"):
                pair = pair.reversed_order()
            pairs.append(pair)
        return pairs, ties

    def _pair_id(
        self,
        row: Mapping[str, Any],
        where: str,
        default: str | None,
        texts: tuple[str, ...],
        key: str | None = None,
    ) -> str:
        """``id_field``'s value, else the row's own key (a benchmark reader's), else the schema's
        id column, else a hash of the texts."""
        if self.id_field is not None:
            if row[self.id_field] in (None, ""):
                raise MalformedRow(
                    f"{where}: field {self.id_field!r} (id_field) is missing or empty. Fix: "
                    "repair or remove the row, or set id_field=null to hash the texts."
                )
            return str(row[self.id_field])
        if key is not None:
            return key
        if default is not None and row.get(default) not in (None, ""):
            return str(row[default])
        return f"{self.task}-{hashlib.sha1(json.dumps(texts).encode()).hexdigest()[:12]}"


def _critiques(row: Mapping[str, Any], where: str) -> tuple[str, str] | None:
    """A ``pairs`` row's critiques when its ``task`` is ``reflection``; None for a preference
    row."""
    task = row.get("task")
    if task in (None, "", "preference"):
        return None
    if task != "reflection":
        raise MalformedRow(
            f"{where}: field 'task' must be 'preference' or 'reflection' (or absent), got "
            f"{task!r:.60}. Fix: repair the row, or rename a task column of another meaning."
        )
    critiques = text_field(row, "critique_1", where), text_field(row, "critique_2", where)
    if critiques[0].strip() == critiques[1].strip():
        raise MalformedRow(
            f"{where}: field 'critique_2' is identical to 'critique_1', so the reflection record "
            "has no preference. Fix: remove the row."
        )
    return critiques


def _read_plain(row: Mapping[str, Any], where: str) -> Read:
    texts = [text_field(row, field, where) for field in ("prompt", "response_1", "response_2")]
    return texts[0], texts[1], texts[2], _label(row, where), str(row.get("subset") or "")


def _label(row: Mapping[str, Any], where: str) -> int | None:
    value = row.get("label")
    if value is None or (isinstance(value, float) and math.isnan(value)):  # CSV: empty is NaN
        return None
    label = integer_value(value)
    if label not in (-1, 1):
        raise MalformedRow(
            f"{where}: field 'label' must be -1 (response 1 better), 1 (response 2 better) or "
            f"null (unlabelled), got {value!r}. Fix: map a preferred response number p in "
            "{1, 2} to 2 * p - 3."
        )
    return label


def _read_helpsteer3(row: Mapping[str, Any], where: str) -> Read:
    prompt = conversation_text(row.get("context"), where)
    preference = integer_value(row.get("overall_preference"))
    if preference is None or not -3 <= preference <= 3:
        raise MalformedRow(
            f"{where}: field 'overall_preference' must be an integer in -3..3, got "
            f"{row.get('overall_preference')!r}. Fix: repair or remove the row."
        )
    label = (preference > 0) - (preference < 0)  # 0 marks a tie
    responses = text_field(row, "response1", where), text_field(row, "response2", where)
    return prompt, *responses, label, str(row.get("domain") or "")


def _read_hh_rlhf(row: Mapping[str, Any], where: str) -> Read:
    (prompt, chosen), (other, rejected) = (_hh_turns(row, f, where) for f in ("chosen", "rejected"))
    if other != prompt:
        raise MalformedRow(
            f"{where}: field 'rejected' does not share the conversation before its last "
            "assistant turn with 'chosen'. Fix: remove the row (the two transcripts must differ "
            "only in the final assistant turn)."
        )
    return prompt, chosen, rejected, -1, ""


def _hh_turns(row: Mapping[str, Any], field: str, where: str) -> tuple[str, str]:
    transcript = text_field(row, field, where)
    cut = transcript.rfind(HH_ASSISTANT)
    prompt, reply = transcript[:cut].strip(), transcript[cut + len(HH_ASSISTANT) :].strip()
    if cut < 0 or not prompt or not reply:
        raise MalformedRow(
            f"{where}: field {field!r} must be a transcript '\\n\\nHuman: ...\\n\\nAssistant: "
            "...' ending in a non-empty assistant turn. Fix: repair or remove the row."
        )
    return prompt, reply


def _read_ultrafeedback(row: Mapping[str, Any], where: str) -> Read:
    replies = []
    for field in ("chosen", "rejected"):
        messages = row.get(field)
        last = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(last, Mapping) or last.get("role") != "assistant":
            raise MalformedRow(
                f"{where}: field {field!r} must be a list of {{role, content}} messages ending "
                f"in the assistant's, got {messages!r:.100}. Fix: repair or remove the row."
            )
        replies.append(text_field(last, "content", f"{where}, field {field!r} last message"))
    return text_field(row, "prompt", where), replies[0], replies[1], -1, ""


def _read_rewardbench(row: Mapping[str, Any], where: str) -> Read:
    texts = [text_field(row, field, where) for field in ("prompt", "chosen", "rejected")]
    return texts[0], texts[1], texts[2], -1, str(row.get("subset") or "")


_SCHEMAS: dict[str, Schema] = {
    "trl": Schema(read_trl, ("chosen", "rejected"), "id", chosen_first=True),
    "pairs": Schema(_read_plain, ("prompt", "response_1", "response_2"), "id"),
    "helpsteer3": Schema(
        _read_helpsteer3, ("overall_preference", "context", "response1", "response2"), None
    ),
    "hh_rlhf": Schema(_read_hh_rlhf, ("chosen", "rejected"), None, chosen_first=True),
    "ultrafeedback": Schema(
        _read_ultrafeedback, ("prompt", "chosen", "rejected"), "prompt_id", chosen_first=True
    ),
    "rewardbench": Schema(_read_rewardbench, ("prompt", "chosen", "rejected"), "id", True),
    **BENCHMARK_SCHEMAS,  # RM-Bench, RMB, JudgeBench, PPE-Preference
}
