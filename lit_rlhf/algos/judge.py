"""Reading a generative reward model's judgment: the verdict, the format check, the critique.

The judge (ConsistRM, arXiv 2604.07484; ReflectRM, arXiv 2604.07506, same output format) writes
``<Criterion>..</Criterion><Analysis>..</Analysis><Result>..</Result>``, and the result says
"Response 1 is better than Response 2" (label -1) or "Response 2 is better than Response 1"
(label +1). ReflectRM's analysis-preference task says "Critique X is better than Critique Y".

Judge output is untrusted model text: it is read with linear-time regular expressions only, and
the verdict parser looks at a bounded tail of it, so a long or adversarial output costs little.

The format rule of a judgment (:func:`judge_format_ok`) follows the ConsistRM authors' code
(``RewardManager.check_format``): each tag exactly once, and nothing but whitespace after the
``</Result>`` (``allow_trailing_text=True`` relaxes this, for reading off-the-shelf judges). A
leading think trace (Qwen3's ``<think>..</think>``, empty with ``/no_think``; unclosed when the
length limit cut the thinking) is removed first (:func:`strip_think`): an unclosed one leaves
nothing, so the judgment is malformed.

Where ours still differs from the authors' code (docs/grm.md): tags are read case-insensitively
and must come in the given order; the result must be exactly one verdict sentence (the authors
accept any block that *contains* one, the first of "1 better" / "2 better" winning); a response
cut by the length limit just after ``</Result>`` is accepted (the authors require the end-of-turn
token there, which the rewards here do not see).

Decisions the papers leave open:
- :func:`parse_verdict` reads the LAST complete ``<Result>..</Result>`` block (judges sometimes
  restate; text after its ``</Result>``, including a second block cut off by the length limit, is
  ignored by the parser, and makes the judgment malformed by the format rule);
- "X is worse than Y" is accepted as the reverse of "Y is better than X";
- the block must hold exactly one verdict sentence (an optional trailing period); any other words
  (hedges, a second verdict, "slightly") make it unparsable, so a policy cannot hedge its way
  to the reward;
- tolerated: case, any whitespace (Unicode included, e.g. non-breaking spaces), spaces inside
  tags (``< /Result >``), markdown emphasis and code marks (``*``, ``_`` and backticks are
  dropped); not tolerated: numbers other than ASCII 1 and 2 (full-width digits are not
  NFKC-normalised, nor are "01" or "3" read) or the same number on both sides.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

JUDGE_TAGS = ("Criterion", "Analysis", "Result")
_THINK_OPEN = re.compile(r"\s*<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_EMPHASIS = re.compile(r"[*_`]")
_WHITESPACE = re.compile(r"\s+")
_WINNER_LABEL = {"1": -1, "2": 1}


def _tag(name: str, *, closing: bool) -> re.Pattern[str]:
    # re caches compiled patterns, so building them per call is cheap.
    slash = r"/\s*" if closing else ""
    return re.compile(rf"<\s*{slash}{re.escape(name)}\s*>", re.IGNORECASE)


def _last(pattern: re.Pattern[str], text: str, end: int | None = None) -> re.Match[str] | None:
    last = deque(pattern.finditer(text, 0, len(text) if end is None else end), maxlen=1)
    return last[0] if last else None


def _verdict_label(result: str, subject: str) -> int | None:
    sentence = _WHITESPACE.sub(" ", _EMPHASIS.sub("", result)).strip()
    name = re.escape(_WHITESPACE.sub(" ", subject.strip()))
    verdict = re.fullmatch(
        rf"{name} ([0-9]+) is (better|worse) than {name} ([0-9]+)\.?", sentence, re.IGNORECASE
    )
    if verdict is None:
        return None
    first, relation, second = verdict.groups()
    if {first, second} != {"1", "2"}:
        return None
    winner = first if relation.lower() == "better" else second
    return _WINNER_LABEL[winner]


def parse_verdict(text: str, *, subject: str = "Response", max_chars: int = 4000) -> int | None:
    """The label of a pairwise judgment (ConsistRM arXiv 2604.07484, sec. 3; ReflectRM
    arXiv 2604.07506 shares the format).

    Args:
        text: the judge's whole output (one rollout).
        subject: what is compared: ``"Response"`` for response preference, ``"Critique"`` for
            ReflectRM's analysis preference.
        max_chars: only the last ``max_chars`` characters are scanned (the result comes last),
            which bounds the work on untrusted text; a block that starts earlier is not found.

    Returns:
        -1 when the last complete Result block says "<subject> 1 is better than <subject> 2"
        (or "2 is worse than 1"), +1 for the reverse, None when it is unparsable: no complete
        block, an empty block, no verdict, two verdicts, other words, or bad numbers.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if not subject.strip():
        raise ValueError("subject must be a non-empty word such as 'Response' or 'Critique'")
    tail = text[-max_chars:]
    close = _last(_tag("Result", closing=True), tail)
    if close is None:
        return None
    opening = _last(_tag("Result", closing=False), tail, close.start())
    if opening is None:
        return None
    return _verdict_label(tail[opening.end() : close.start()], subject)


def strip_think(text: str) -> str:
    """``text`` without a leading think trace (Qwen3's thinking mode, arXiv 2505.09388): when it
    opens with ``<think>`` (after optional whitespace), everything up to and including the first
    ``</think>`` is dropped (an empty ``<think>\n\n</think>``, as written under ``/no_think``,
    included); an unclosed ``<think>`` (the length limit cut the thinking) leaves ``""``. Text
    that does not open with ``<think>`` is returned unchanged. Linear time."""
    opening = _THINK_OPEN.match(text)
    if opening is None:
        return text
    close = _THINK_CLOSE.search(text, opening.end())
    return "" if close is None else text[close.end() :]


def _only(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The match of ``pattern`` if it occurs exactly once in ``text`` (stops at the second)."""
    found = None
    for count, match in enumerate(pattern.finditer(text)):
        if count == 1:
            return None
        found = match
    return found


def judge_format_ok(
    text: str,
    *,
    tags: Sequence[str] = JUDGE_TAGS,
    subject: str = "Response",
    allow_trailing_text: bool = False,
) -> bool:
    """Whether a judgment has the required format (the format term of ConsistRM's reward,
    arXiv 2604.07484; ReflectRM arXiv 2604.07506 uses ``tags=("Analysis", "Result")``).

    After :func:`strip_think`: True iff every tag in ``tags`` is opened exactly once and closed
    exactly once, the blocks come in the given order without overlapping, only whitespace follows
    the last block's closing tag (the ConsistRM authors' rule; unless ``allow_trailing_text``),
    and :func:`parse_verdict` reads a verdict. Text before the blocks and between them is allowed.

    Args:
        text: the judge's whole output.
        tags: the block names, in their required order (case-insensitive).
        subject: passed to :func:`parse_verdict`.
        allow_trailing_text: accept text after the last block (it is ignored).
    """
    text = strip_think(text)
    position = 0
    for name in tags:
        opening = _only(_tag(name, closing=False), text)
        close = _only(_tag(name, closing=True), text)
        if opening is None or close is None:
            return False
        if opening.start() < position or close.start() < opening.end():
            return False
        position = close.end()
    if not allow_trailing_text and text[position:].strip():
        return False
    return parse_verdict(text, subject=subject) is not None


def critique_text(text: str) -> str:
    """A judgment's critique: everything before the last ``<Result>`` tag, after
    :func:`strip_think`, stripped; the whole text, stripped, when there is no such tag.
    (ConsistRM's authors embed the whole response instead: :func:`response_text`.)"""
    text = strip_think(text)
    opening = _last(_tag("Result", closing=False), text)
    return (text if opening is None else text[: opening.start()]).strip()


def response_text(text: str) -> str:
    """The whole judgment after :func:`strip_think`, stripped: the text the ConsistRM authors
    embed for the critique reward (arXiv 2604.07484; ``response_content`` in their
    ``RewardManager``)."""
    return strip_think(text).strip()


def analysis_text(text: str) -> str:
    """The analysis of a judgment that ReflectRM's reflection compares (arXiv 2604.07506): its
    :func:`critique_text`, or the whole judgment, stripped, when nothing precedes the result (a
    verdict-only judge)."""
    return critique_text(text) or response_text(text)


def judge_verdict(
    text: str,
    *,
    tags: Sequence[str] = JUDGE_TAGS,
    subject: str = "Response",
    allow_trailing_text: bool = False,
) -> int | None:
    """The verdict (-1 / +1) of a well-formed judgment (:func:`judge_format_ok`, same
    arguments), None when it is malformed or unparsable: what a judge's reward and its
    evaluation count."""
    if not judge_format_ok(
        text, tags=tags, subject=subject, allow_trailing_text=allow_trailing_text
    ):
        return None
    return parse_verdict(strip_think(text), subject=subject)


@dataclass(frozen=True)
class JudgeFormat:
    """How one judge's outputs are read: its tags and subject, and the text around each output
    that the judge did not generate: ``prefix`` (the assistant pre-fill of the prompt, e.g.
    ``"<Result>Response 1 is"``) and ``suffix`` (a fixed ending, for a judge that generates only
    the verdict word, e.g. ``" than Response 2</Result>"``). ``{subject}`` in the prefix or
    suffix stands for the subject of the judgment (``"<Result>{subject} 1 is"``), so one format
    reads ReflectRM's response and critique verdicts alike. ``allow_trailing_text`` accepts text
    after the last block (:func:`judge_format_ok`; the ConsistRM authors' rule refuses it)."""

    tags: tuple[str, ...] = JUDGE_TAGS
    subject: str = "Response"
    prefix: str = ""
    suffix: str = ""
    allow_trailing_text: bool = False

    def __post_init__(self) -> None:
        if not self.tags:
            raise ValueError("tags must name at least the result tag")
        if not self.subject.strip():
            raise ValueError("subject must be a non-empty word, e.g. 'Response'")

    def opening(self, subject: str | None = None) -> str:
        """The prefix, ``{subject}`` filled in (the format's subject unless given)."""
        return self.prefix.replace("{subject}", subject or self.subject)

    def text(self, output: str, subject: str | None = None) -> str:
        """The whole judgment: prefix + output + suffix, ``{subject}`` filled in."""
        subject = subject or self.subject
        return self.opening(subject) + output + self.suffix.replace("{subject}", subject)

    def verdict(self, output: str, subject: str | None = None) -> int | None:
        """:func:`judge_verdict` of the whole judgment; ``subject`` overrides the format's (a
        row of ReflectRM's mixed data says whether it compares responses or critiques)."""
        subject = subject or self.subject
        return judge_verdict(
            self.text(output, subject),
            tags=self.tags,
            subject=subject,
            allow_trailing_text=self.allow_trailing_text,
        )
