"""What :class:`~lit_rlhf.data.instructions.GeneratedInstructionPrompts` draws from: the requests
and topics we wrote, the instructions the checker verifies offline with how their arguments are
drawn (:data:`OFFLINE_INSTRUCTIONS`), and the table of instructions no response can satisfy
together (:func:`_conflicts`, IFEval's own plus ours). Re-exported by
:mod:`lit_rlhf.data.instructions`.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

Sampler = Callable[[random.Random, str], dict[str, Any]]

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
