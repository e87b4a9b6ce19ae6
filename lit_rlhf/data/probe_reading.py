"""Rule-based reading of a reconstruction for the faithfulness probes (:mod:`lit_rlhf.data.probes`;
the size-fidelity paradox, arXiv 2602.09789): whether a word is asserted or negated, who did what
to whom, and in which order two events happened. Deterministic, no model, no evaluation of text.

Three readings, each judged on meaning rather than surface position:

- polarity (:func:`is_negated`): a word is negated when its clause, read back from the word to
  the nearest clause boundary, holds an odd number of negators ("not", "n't", "never", "no",
  "nobody", "neither", ...), or when the clause was opened by a contrast ("rather than",
  "instead of", "as opposed to", "unlike", "in place of", "nor"), or by a "that" after "not
  true" / "not the case" / "false". So in "red, not white" and "not white but red" the word
  "white" is negated and "red" asserted; "not only X" does not negate X.
- roles (:func:`read_roles`): the agent is the name nearest before the verb and the patient the
  first name after it; in the passive (a form of "be"/"get" before the verb) the subject is the
  patient and the name after "by" the agent; with no name after the verb and both before it
  (a cleft or object relative: "It was Bob whom Alice thanked") the nearer is the agent.
- event order (:func:`event_order`): events are said in the order they happened unless a
  connective says otherwise; "before"/"after"/"once"/"having"/"following" bind to the clause
  they open, "then"/"after that"/"before that"/"earlier"/"first"/"beforehand" to the event they
  precede or follow. So "Before watering the plants, Mira fed the cat" puts the cat first.

Known limits are listed in docs/compressor.md ("What the probe scorers still misjudge").
"""

from __future__ import annotations

import re
from typing import Literal

Polarity = Literal["asserted", "denied", "absent"]
Order = Literal["in_order", "reversed", "lost"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# a clause ends at punctuation or at a word that opens a new clause; the "neg" group opens a
# clause whose content is contrasted away ("white rather than red": red is not asserted)
_BOUNDARY = re.compile(
    r"(?P<neg>\b(?:rather\s+than|instead\s+of|as\s+opposed\s+to|unlike|in\s+place\s+of|nor)\b)"
    r"|(?P<that>\bthat\b)"
    r"|[,;:!?.()\u2014\u2013]|\s-\s"
    r"|\b(?:but|yet|and|although|though|whereas|while|because|since|which|who|whom|whose|when"
    r"|if|unless|until|before|after|once|then|however|having|following)\b",
    re.IGNORECASE,
)
_NEGATOR = re.compile(
    r"\b(?:not|never|no|nobody|none|nothing|neither|without|cannot)\b|n['\u2019]t\b",
    re.IGNORECASE,
)
_NOT_NEGATING = re.compile(r"\bnot\s+(?:only|just|merely|simply)\b", re.IGNORECASE)
_NEGATED_THAT = re.compile(
    r"\b(?:not\s+(?:true|the\s+case)|never\s+the\s+case|false|untrue)\s*$", re.IGNORECASE
)
_PASSIVE_AUX = re.compile(
    r"\b(?:am|is|are|was|were|be|been|being|get|gets|got|gotten)(?:n['\u2019]t)?"
    r"(?:\s+(?:not|never|\w+ly))*\s*$",
    re.IGNORECASE,
)


def find_word(text: str, word: str, start: int = 0) -> re.Match[str] | None:
    """The first whole-word, case-insensitive occurrence of ``word`` at or after ``start``."""
    return re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE).search(text, start)


def sentences(text: str) -> list[str]:
    """``text`` split after ``.``, ``!`` and ``?``; empty pieces dropped."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def clause_start(text: str, position: int) -> tuple[int, bool]:
    """Where the clause holding ``position`` starts, and whether a contrast or a negated "that"
    opened it (see the module docstring)."""
    last: re.Match[str] | None = None
    for match in _BOUNDARY.finditer(text, 0, position):
        last = match
    if last is None:
        return 0, False
    negated = last.group("neg") is not None
    if last.group("that") is not None:
        negated = _NEGATED_THAT.search(text, 0, last.start()) is not None
    return last.end(), negated


def is_negated(text: str, position: int) -> bool:
    """Whether the word at ``position`` is negated or contrasted away in its clause: the parity
    of the negators between the clause's start and the word, plus one when a contrast opened
    the clause. Negators after the word ("White they are not") are not read."""
    start, negated = clause_start(text, position)
    scope = _NOT_NEGATING.sub(" ", text[start:position])
    return negated ^ (len(_NEGATOR.findall(scope)) % 2 == 1)


def polarity(text: str, word: str) -> Polarity:
    """ "asserted" when some occurrence of ``word`` in ``text`` is not negated, "denied" when
    every occurrence is, "absent" when there is none."""
    found = False
    for match in re.finditer(rf"\b{re.escape(word)}\b", text, re.IGNORECASE):
        found = True
        if not is_negated(text, match.start()):
            return "asserted"
    return "denied" if found else "absent"


def _nearest_before(text: str, names: tuple[str, str]) -> str | None:
    best: tuple[int, str] | None = None
    for name in names:
        for match in re.finditer(rf"\b{re.escape(name)}\b", text, re.IGNORECASE):
            if best is None or match.start() > best[0]:
                best = (match.start(), name)
    return best[1] if best else None


def _first_after(text: str, names: tuple[str, str], prefix: str = "") -> str | None:
    hits = [
        (match.start(), name)
        for name in names
        if (match := re.search(rf"{prefix}\b{re.escape(name)}\b", text, re.IGNORECASE))
    ]
    return min(hits)[1] if hits else None


def read_roles(
    sentence: str, verb: re.Match[str], names: tuple[str, str]
) -> tuple[str | None, str | None]:
    """(agent, patient) of the verb matched in ``sentence``, each one of ``names`` or None."""
    before, after = sentence[: verb.start()], sentence[verb.end() :]
    if _PASSIVE_AUX.search(before):  # "Bob was (not) thanked by Alice"
        return _first_after(after, names, prefix=r"\bby\s+"), _nearest_before(before, names)
    a, b = (re.escape(n) for n in names)
    if re.search(rf"\b(?:{a}\s+and\s+{b}|{b}\s+and\s+{a})\b", before, re.IGNORECASE):
        return None, None  # "Alice and Bob thanked each other": no direction
    agent, patient = _nearest_before(before, names), _first_after(after, names)
    if patient is None and agent is not None:  # "It was Bob whom Alice thanked"
        other = names[1] if agent == names[0] else names[0]
        if re.search(rf"\b{re.escape(other)}\b", before, re.IGNORECASE):
            patient = other
    return agent, patient


def _markers(pairs: str) -> tuple[re.Pattern[str], dict[str, int]]:
    """``"phrase:sign,..."`` -> a regex of the phrases (longest first) and their signs."""
    table = {}
    for entry in pairs.split(","):
        phrase, sign = entry.rsplit(":", 1)
        table[phrase.strip()] = int(sign)
    ordered = sorted(table, key=len, reverse=True)
    body = "|".join(r"\s+".join(map(re.escape, p.split())) for p in ordered)
    return re.compile(rf"\b(?:{body})\b", re.IGNORECASE), table


def _sign(table: dict[str, int], match: re.Match[str]) -> int:
    return table[" ".join(match.group(0).lower().split())]


# +1: the event after the marker came later than the other; -1: it came earlier.
# Anaphoric markers (they point back to the other event wherever it is in the text).
_ANAPHORIC, _ANAPHORIC_SIGN = _markers(
    "then:1,and then:1,after that:1,after this:1,after which:1,afterwards:1,afterward:1,"
    "later:1,next:1,subsequently:1,finally:1,before that:-1,before this:-1,before which:-1,"
    "prior to that:-1,earlier:-1,previously:-1,first:-1,but first:-1,already:-1"
)
# Subordinators: they bind to the clause they open ("after she fed the cat").
_SUBORDINATE, _SUBORDINATE_SIGN = _markers(
    "before:1,prior to:1,until:1,after:-1,following:-1,once:-1,as soon as:-1,having:-1"
)
# Adverbs after an event, in its own sentence ("She had fed the cat beforehand.")
_TAIL, _TAIL_SIGN = _markers(
    "first:-1,earlier:-1,beforehand:-1,previously:-1,already:-1,"
    "afterwards:1,afterward:1,later:1,next:1,last:1"
)
# Sentence adverbs before the event mentioned first ("First, Mira fed the cat")
_LEAD, _LEAD_SIGN = _markers("first:1,firstly:1,initially:1,finally:-1,lastly:-1")
_CLAUSE_SPLIT = re.compile(r"[,;:!?.()\u2014\u2013]|\b(?:and|but|or|yet|so)\b", re.IGNORECASE)


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for match in pattern.finditer(text):
        found = match
    return found


def _sentence_start(text: str, position: int) -> int:
    return max([m.end() for m in _SENTENCE_END.finditer(text, 0, position)] or [0])


def _nearest_marker(clause: str) -> int:
    """The sign of the marker nearest the end of ``clause`` (an anaphoric one over a
    subordinator starting at the same place: "before that" is not "before"); 0 if none."""
    sub, ana = _last(_SUBORDINATE, clause), _last(_ANAPHORIC, clause)
    if ana is not None and (sub is None or ana.start() >= sub.start()):
        return _sign(_ANAPHORIC_SIGN, ana)
    return _sign(_SUBORDINATE_SIGN, sub) if sub is not None else 0


def _second_sign(text: str, a_end: int, b: re.Match[str]) -> int:
    """+1 / -1 from the markers of the second-mentioned event's own clause ("..., but first she
    fed the cat", "after she fed the cat"), a clause made of a marker alone before it ("Before
    that, she ..."), or an adverb after it in its sentence; 0 when none speaks."""
    between = text[max(a_end, _sentence_start(text, b.start())) : b.start()]
    pieces = _CLAUSE_SPLIT.split(between)
    if sign := _nearest_marker(pieces[-1]):
        return sign
    if len(pieces) > 1 and (alone := _ANAPHORIC.fullmatch(pieces[-2].strip())) is not None:
        return _sign(_ANAPHORIC_SIGN, alone)
    tail = _SENTENCE_END.split(text[b.end() :], maxsplit=1)[0]
    if (adverb := _TAIL.search(tail)) is not None:
        return _sign(_TAIL_SIGN, adverb)
    return 0


def _first_sign(text: str, a: re.Match[str]) -> int:
    """+1 / -1 from a subordinator opening the first-mentioned event's clause ("Before
    watering the plants, ...": that event came later) or a sentence adverb before it."""
    lead = text[_sentence_start(text, a.start()) : a.start()]
    if (sub := _last(_SUBORDINATE, _CLAUSE_SPLIT.split(lead)[-1])) is not None:
        return -_sign(_SUBORDINATE_SIGN, sub)
    if (adverb := _last(_LEAD, lead)) is not None:
        return _sign(_LEAD_SIGN, adverb)
    return 0


def event_order(text: str, first: str, second: str) -> Order:
    """Whether ``text`` tells that the event named by ``first`` happened before the one named
    by ``second`` ("in_order"), after it ("reversed"), or does not name both ("lost").

    The event mentioned first (A) is taken to come first unless a marker says otherwise, in
    this precedence: a connective between A and the other event (B) nearest to B ("..., but
    first she fed the cat", "after she fed the cat", "Before that, ..."); an adverb after B in
    its sentence ("beforehand", "afterwards"); a subordinator opening A's clause ("Before
    watering the plants, ...") or a sentence adverb before A ("First, ...").
    """
    one, two = find_word(text, first), find_word(text, second)
    if one is None or two is None:
        return "lost"
    a, b = (one, two) if one.start() < two.start() else (two, one)
    sign = _second_sign(text, a.end(), b) or _first_sign(text, a) or 1
    a_is_first = a is one
    return "in_order" if (sign > 0) == a_is_first else "reversed"
