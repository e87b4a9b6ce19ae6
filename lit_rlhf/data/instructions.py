"""Training prompts with verifiable instructions, kept apart from the IFEval evaluation set.

The instruction-following domain of MGS (arXiv 2602.02301) is trained on prompts that carry
IFEval-style instructions (Zhou et al. 2023) and is scored by the fraction of them a response
satisfies (:class:`~lit_rlhf.rewards.InstructionReward`). IFEval's 541 prompts
(``google/IFEval``) are an EVALUATION set: training on them leaks the benchmark. Two training
sources, both in the rows :class:`~lit_rlhf.rewards.InstructionReward` checks
(``instruction_id_list``, ``kwargs``), both able to drop every prompt of given evaluation sets
(``exclude``):

- :class:`InstructionPrompts`: a hub (or local) dataset in the schema of the MGS authors'
  instruction-following data, ``nvidia/Llama-Nemotron-Post-Training-Dataset`` (config ``RL``,
  split ``instruction_following``: ``input`` = chat messages, ``args`` = ``instruction_id_list``
  and ``instruction_kwargs``; the authors train on a "hard" subset of it,
  ``instruction_following_subset_hard.parquet``, which they did not publish);
- :class:`GeneratedInstructionPrompts`: a seeded offline generator for CPU runs and tests, which
  composes requests we wrote with instructions whose wording is built by the checker itself
  (``if-verifiable``'s ``build_description``), restricted to the instructions the checker
  verifies offline (the two that need NLTK's ``punkt`` data are left out, see
  :data:`OFFLINE_INSTRUCTIONS`), avoiding IFEval's conflicting pairs.

A prompt is excluded when an evaluation prompt, lower-cased with its whitespace collapsed,
equals it or occurs inside it (training prompts of this kind often prepend an unrelated request).

The exclusion check lives in :mod:`lit_rlhf.data.evaluation_prompts`, the generator's requests,
topics and instruction samplers in :mod:`lit_rlhf.data.offline_instructions`; both are
re-exported here.
"""

from __future__ import annotations

import hashlib
import random
import re
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from lit_rlhf.data.evaluation_prompts import (
    EvaluationPrompts,
    _drop_evaluation_prompts,
    normalize_prompt,
)
from lit_rlhf.data.offline_instructions import (
    _REQUESTS,
    _TOPICS,
    OFFLINE_INSTRUCTIONS,
    Sampler,
    _conflicts,
)
from lit_rlhf.data.sources import PromptSource, _check_template, _load_table
from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


__all__ = [  # the held-out check and the generator's tables are re-exported
    "OFFLINE_INSTRUCTIONS",
    "EvaluationPrompts",
    "GeneratedInstructionPrompts",
    "InstructionPrompts",
    "Sampler",
    "_conflicts",
    "normalize_prompt",
]


def _registry() -> dict[str, Any]:
    try:
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as err:
        raise ImportError(
            f"instruction prompts need the if-verifiable package ({err}). Fix: pip install "
            "'lit-rlhf[ifeval]' (Python 3.11+)."
        ) from err
    return dict(INSTRUCTION_DICT)


def _row(prompt: str, ids: list[str], kwargs: list[dict[str, Any]], template: str) -> dict:
    return {
        "query_id": f"ifeval-train-{hashlib.sha1(prompt.encode()).hexdigest()[:12]}",
        "task": "ifeval",
        "question": template.format(question=prompt),
        "prompt": prompt,
        "instruction_id_list": ids,
        "kwargs": kwargs,
    }


class InstructionPrompts:
    """Instruction-following training prompts in the schema of the MGS authors' data.

    Args:
        path: hub id or local file/folder (default: the authors' source dataset).
        name: the hub configuration (``RL``).
        split: the split, with optional slicing (``instruction_following``).
        messages_field: the chat-messages column; the prompt is its last user message.
        args_field: the column holding ``instruction_id_list`` and ``instruction_kwargs``.
        max_examples: keep only the first this many usable rows.
        question_template: ``str.format`` template over ``{question}`` (the prompt), e.g. a
            chat format around it; the raw prompt stays in the ``prompt`` column.
        exclude: evaluation prompt sources (e.g. ``FilePrompts`` of ``google/IFEval``) whose
            prompts must not be trained on: rows containing one are dropped (with a warning).

    Rows whose instructions the checker does not know are dropped with a warning (they could
    not be scored); ``None`` values in the kwargs are dropped.
    """

    def __init__(
        self,
        path: str = "nvidia/Llama-Nemotron-Post-Training-Dataset",
        name: str | None = "RL",
        split: str = "instruction_following",
        messages_field: str = "input",
        args_field: str = "args",
        max_examples: int | None = None,
        question_template: str = "{question}",
        exclude: Sequence[PromptSource] = (),
    ) -> None:
        if max_examples is not None and max_examples < 1:
            raise ValueError(f"max_examples must be >= 1 or None, got {max_examples}")
        _check_template(question_template)
        self.path, self.name, self.split = path, name, split
        self.messages_field, self.args_field = messages_field, args_field
        self.max_examples, self.question_template = max_examples, question_template
        self.exclude = list(exclude)
        self.known = set(_registry())

    def load(self) -> Table:
        raw = _load_table(self.path, self.name, self.split)
        for field in (self.messages_field, self.args_field):
            if field not in raw.column_names:
                raise ValueError(
                    f"{self.path}: no column {field!r} (columns: {raw.column_names}). Fix: set "
                    "messages_field= / args_field= to the chat-messages and instruction columns."
                )
        rows, unknown = [], 0
        for index, record in enumerate(raw):
            row = self._convert(index, dict(record))
            if row is None:
                unknown += 1
                continue
            rows.append(row)
            if self.max_examples is not None and len(rows) >= self.max_examples:
                break
        if unknown:
            warnings.warn(
                f"{self.path}: dropped {unknown} rows with instructions the checker does not know",
                stacklevel=2,
            )
        rows = _drop_evaluation_prompts(rows, self.exclude, type(self).__name__)
        return datasets.Dataset.from_list(rows)

    def _convert(self, index: int, record: dict[str, Any]) -> dict[str, Any] | None:
        where = f"{self.path} (split {self.split!r}), row {index}"
        messages, args = record[self.messages_field], record[self.args_field] or {}
        users = [m for m in messages or [] if isinstance(m, Mapping) and m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise ValueError(f"{where}: {self.messages_field!r} holds no user message")
        ids = list(args.get("instruction_id_list") or [])
        kwargs = list(args.get("instruction_kwargs") or args.get("kwargs") or [{} for _ in ids])
        if not ids or len(kwargs) != len(ids):
            raise ValueError(
                f"{where}: {self.args_field!r} needs a non-empty instruction_id_list and one "
                f"kwargs dict per instruction, got {args!r:.200}"
            )
        if not set(ids) <= self.known:
            return None
        clean = [{k: v for k, v in (kw or {}).items() if v is not None} for kw in kwargs]
        return _row(users[-1]["content"], ids, clean, self.question_template)


class GeneratedInstructionPrompts:
    """Seeded offline prompts with verifiable instructions, for CPU runs and tests.

    Each prompt is one request we wrote (``_REQUESTS`` x ``_TOPICS`` of
    :mod:`lit_rlhf.data.offline_instructions`) followed by 1 to ``max_instructions``
    instructions drawn from :data:`OFFLINE_INSTRUCTIONS` with no two in conflict, each worded by
    the checker's own ``build_description`` from the drawn arguments.
    None of the text is IFEval's prompts, so the set is disjoint from the IFEval evaluation set
    by construction (``exclude`` checks it anyway when given). Prompts are unique; the same
    arguments give the same rows, whatever the global random state.

    Args:
        num_examples: prompts to generate.
        seed: seeds every draw.
        min_instructions, max_instructions: instructions per prompt (drawn uniformly).
        instructions: the instruction ids to draw from (default: all of
            :data:`OFFLINE_INSTRUCTIONS`); any other id is refused.
        question_template: as in :class:`InstructionPrompts`.
        exclude: evaluation prompt sources whose prompts must not appear.
    """

    def __init__(
        self,
        num_examples: int = 1000,
        seed: int = 0,
        min_instructions: int = 1,
        max_instructions: int = 3,
        instructions: Sequence[str] | None = None,
        question_template: str = "{question}",
        exclude: Sequence[PromptSource] = (),
    ) -> None:
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples}")
        if not 1 <= min_instructions <= max_instructions:
            raise ValueError(
                "need 1 <= min_instructions <= max_instructions, got "
                f"{min_instructions} and {max_instructions}"
            )
        chosen = list(instructions) if instructions is not None else list(OFFLINE_INSTRUCTIONS)
        bad = [i for i in chosen if i not in OFFLINE_INSTRUCTIONS]
        if bad or not chosen:
            raise ValueError(
                f"instructions {bad or chosen} cannot be generated: the generator draws only "
                f"instructions checked offline: {sorted(OFFLINE_INSTRUCTIONS)}"
            )
        _check_template(question_template)
        self.registry = _registry()
        self.num_examples, self.seed = num_examples, seed
        self.min_instructions, self.max_instructions = min_instructions, max_instructions
        self.instructions, self.question_template = chosen, question_template
        self.exclude = list(exclude)

    def load(self) -> Table:
        rng, conflicts = random.Random(self.seed), _conflicts()
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for _ in range(50 * self.num_examples):
            if len(rows) == self.num_examples:
                break
            prompt, ids, kwargs = self._compose(rng, conflicts)
            if prompt not in seen:
                seen.add(prompt)
                rows.append(_row(prompt, ids, kwargs, self.question_template))
        if len(rows) < self.num_examples:
            raise ValueError(
                f"only {len(rows)} distinct prompts could be drawn, fewer than num_examples="
                f"{self.num_examples}. Fix: allow more instructions or ask for fewer prompts."
            )
        rows = _drop_evaluation_prompts(rows, self.exclude, type(self).__name__)
        return datasets.Dataset.from_list(rows)

    def _compose(
        self, rng: random.Random, conflicts: Mapping[str, set[str]]
    ) -> tuple[str, list[str], list[dict[str, Any]]]:
        request = rng.choice(_REQUESTS).format(topic=rng.choice(_TOPICS))
        wanted = rng.randint(self.min_instructions, self.max_instructions)
        ids: list[str] = []
        for candidate in rng.sample(self.instructions, len(self.instructions)):
            if len(ids) == wanted:
                break
            if not any(candidate in conflicts.get(i, {i}) or i in conflicts.get(candidate, set())
                       for i in ids):  # fmt: skip
                ids.append(candidate)
        kwargs = [OFFLINE_INSTRUCTIONS[i](rng, request) for i in ids]
        texts = [self._describe(i, kw) for i, kw in zip(ids, kwargs, strict=True)]
        return " ".join([request, *texts]), ids, kwargs

    def _describe(self, instruction: str, kwargs: dict[str, Any]) -> str:
        checker = self.registry[instruction](instruction)
        text = str(checker.build_description(**kwargs))
        return re.sub(r"\s+", " ", text).strip()
