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
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import datasets

from lit_rlhf.data.sources import PromptSource, _check_template, _load_table

_SHINGLE = 8  # words per shingle of the containment index

Sampler = Callable[[random.Random, str], dict[str, Any]]


def normalize_prompt(text: str) -> str:
    """The form prompts are compared in: lower case, runs of whitespace as one space."""
    return " ".join(text.lower().split())


class EvaluationPrompts:
    """The normalised prompts of evaluation sources, and the test of whether a training prompt
    contains one (an index of each evaluation prompt's first 8 words makes it linear)."""

    def __init__(self, sources: Iterable[PromptSource]) -> None:
        self.prompts: set[str] = set()
        for source in sources:
            self.prompts.update(normalize_prompt(str(q)) for q in source.load()["question"])
        self._by_head: dict[tuple[str, ...], list[str]] = {}
        self._short: list[str] = []
        for prompt in self.prompts:
            words = prompt.split(" ")
            if len(words) < _SHINGLE:
                self._short.append(prompt)
            else:
                self._by_head.setdefault(tuple(words[:_SHINGLE]), []).append(prompt)

    def __len__(self) -> int:
        return len(self.prompts)

    def contains_one(self, text: str) -> bool:
        """Whether ``text`` equals or contains (normalised) one of the evaluation prompts."""
        norm = normalize_prompt(text)
        if norm in self.prompts or any(p in norm for p in self._short):
            return True
        words = norm.split(" ")
        for i in range(len(words) - _SHINGLE + 1):
            for prompt in self._by_head.get(tuple(words[i : i + _SHINGLE]), ()):
                if prompt in norm:
                    return True
        return False


def _drop_evaluation_prompts(
    rows: list[dict[str, Any]], exclude: Sequence[PromptSource], who: str
) -> list[dict[str, Any]]:
    if not exclude:
        return rows
    held_out = EvaluationPrompts(exclude)
    kept = [row for row in rows if not held_out.contains_one(row["prompt"])]
    if len(kept) < len(rows):
        warnings.warn(
            f"{who}: dropped {len(rows) - len(kept)} of {len(rows)} training prompts that "
            f"contain an evaluation prompt (of {len(held_out)} excluded)",
            stacklevel=3,
        )
    if not kept:
        raise ValueError(f"{who}: every training prompt contains an evaluation prompt")
    return kept


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

    def load(self) -> datasets.Dataset:
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


# ---------------------------------------------------------------- the offline generator

_REQUESTS = (
    "Write a short story about {topic}.",
    "Explain {topic} to a curious ten-year-old.",
    "Write a product description for a gadget related to {topic}.",
    "Give advice to someone who is new to {topic}.",
    "Write a blog post about {topic}.",
    "Summarise the main arguments for and against {topic}.",
    "Write a letter to a friend about {topic}.",
    "Describe a typical day of a person who works with {topic}.",
    "Write a poem about {topic}.",
    "Draft a short speech on {topic} for a school assembly.",
    "List the most common misconceptions about {topic}.",
    "Write a job advertisement for a role involving {topic}.",
    "Plan a weekend workshop on {topic}.",
    "Write a dialogue between two neighbours arguing about {topic}.",
    "Write a review of an imaginary book on {topic}.",
    "Describe how {topic} might change over the next fifty years.",
    "Write a news report about a surprising discovery in {topic}.",
    "Compare two different approaches to {topic}.",
    "Write a riddle whose answer is related to {topic}.",
    "Write an email asking a colleague for help with {topic}.",
)
_TOPICS = (
    "beekeeping", "tidal energy", "urban gardening", "the history of maps", "sourdough baking",
    "volcanoes", "public libraries", "migratory birds", "chess openings", "recycling plastics",
    "the night sky", "learning a second language", "bicycle repair", "coral reefs",
    "ancient pottery", "rainwater harvesting", "jazz improvisation", "lighthouses",
    "mushroom foraging", "train timetables", "origami", "desert ecosystems", "board games",
    "solar eclipses", "knitting", "river restoration", "street food", "glaciers",
    "typewriters", "community theatre", "honey", "weather forecasting", "fountain pens",
    "tree planting", "museum curation", "kite flying", "deep sea fish", "wind turbines",
    "early photography", "marathon training",
)  # fmt: skip
_WORDS = (
    "river", "lantern", "harvest", "compass", "velvet", "orbit", "meadow", "signal",
    "copper", "whisper", "bridge", "falcon", "puzzle", "ember", "harbor", "quiet",
)  # fmt: skip
_END_PHRASES = (
    "Is there anything else I can help with?",
    "Let me know if you have additional questions.",
    "That is all for today.",
)
_LANGUAGES = ("fr", "de", "es", "it", "pt")


def _relation(rng: random.Random) -> str:
    return rng.choice(("at least", "less than"))


def _number_words(rng: random.Random, _: str) -> dict[str, Any]:
    relation = _relation(rng)
    low, high = (40, 200) if relation == "at least" else (80, 400)
    return {"num_words": rng.randrange(low, high + 1, 20), "relation": relation}


def _nth_paragraph(rng: random.Random, _: str) -> dict[str, Any]:
    paragraphs = rng.randint(2, 5)
    return {
        "num_paragraphs": paragraphs,
        "nth_paragraph": rng.randint(1, paragraphs),
        "first_word": rng.choice(_WORDS),
    }


OFFLINE_INSTRUCTIONS: dict[str, Sampler] = {
    "punctuation:no_comma": lambda rng, _: {},
    "length_constraints:number_words": _number_words,
    "length_constraints:number_paragraphs": lambda rng, _: {"num_paragraphs": rng.randint(2, 5)},
    "length_constraints:nth_paragraph_first_word": _nth_paragraph,
    "detectable_format:title": lambda rng, _: {},
    "detectable_format:number_bullet_lists": lambda rng, _: {"num_bullets": rng.randint(2, 6)},
    "detectable_format:number_highlighted_sections": lambda rng, _: {
        "num_highlights": rng.randint(1, 4)
    },
    "detectable_format:multiple_sections": lambda rng, _: {
        "section_spliter": rng.choice(("Section", "SECTION", "Part")),
        "num_sections": rng.randint(2, 5),
    },
    "detectable_format:json_format": lambda rng, _: {},
    "detectable_format:constrained_response": lambda rng, _: {},
    "detectable_content:postscript": lambda rng, _: {
        "postscript_marker": rng.choice(("P.S.", "P.P.S"))
    },
    "detectable_content:number_placeholders": lambda rng, _: {
        "num_placeholders": rng.randint(1, 4)
    },
    "keywords:existence": lambda rng, _: {"keywords": rng.sample(_WORDS, 2)},
    "keywords:frequency": lambda rng, _: {
        "keyword": rng.choice(_WORDS),
        "frequency": rng.randint(1, 4),
        "relation": _relation(rng),
    },
    "keywords:forbidden_words": lambda rng, _: {"forbidden_words": rng.sample(_WORDS, 2)},
    "keywords:letter_frequency": lambda rng, _: {
        "letter": rng.choice("abcdefghijklmnopqrstuvwxyz"),
        "let_frequency": rng.randint(2, 10),
        "let_relation": _relation(rng),
    },
    "change_case:english_lowercase": lambda rng, _: {},
    "change_case:english_capital": lambda rng, _: {},
    "startend:end_checker": lambda rng, _: {"end_phrase": rng.choice(_END_PHRASES)},
    "startend:quotation": lambda rng, _: {},
    "combination:two_responses": lambda rng, _: {},
    "combination:repeat_prompt": lambda rng, request: {"prompt_to_repeat": request},
    "language:response_language": lambda rng, _: {"language": rng.choice(_LANGUAGES)},
}
"""The instructions the generator draws (``if-verifiable``'s ids) and how their arguments are
drawn. Left out: ``length_constraints:number_sentences`` and
``change_case:capital_word_frequency``, whose checks need NLTK's ``punkt`` data."""

# a pair IFEval's own conflict table does not list but no response can satisfy: the section
# markers (Section, SECTION, Part) are matched case-sensitively and hold capitals (the other
# checks that compare words lower-case them first, e.g. end phrases and postscript markers)
_EXTRA_CONFLICTS = (("change_case:english_lowercase", "detectable_format:multiple_sections"),)


def _conflicts() -> dict[str, set[str]]:
    from if_verifiable.ifeval.instructions_registry import INSTRUCTION_CONFLICTS, conflict_make

    table = conflict_make(copy.deepcopy(INSTRUCTION_CONFLICTS))
    for a, b in _EXTRA_CONFLICTS:
        table.setdefault(a, {a}).add(b)
        table.setdefault(b, {b}).add(a)
    return {k: set(v) for k, v in table.items()}


class GeneratedInstructionPrompts:
    """Seeded offline prompts with verifiable instructions, for CPU runs and tests.

    Each prompt is one request we wrote (:data:`_REQUESTS` x :data:`_TOPICS`) followed by 1 to
    ``max_instructions`` instructions drawn from :data:`OFFLINE_INSTRUCTIONS` with no two in
    conflict, each worded by the checker's own ``build_description`` from the drawn arguments.
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

    def load(self) -> datasets.Dataset:
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
