"""The tool-call format of multi-turn rollouts: a tag in the agent's text.

The agent calls a tool by writing ``<tool>NAME: ARGUMENT</tool>``, e.g.
``<tool>calculator: 3*(4+5)</tool>``; the first complete tag of a turn is the call. The answer
comes back as the environment's turn, ``<result>...</result>`` for a result and
``<error>...</error>`` for a bad call. The tag format is used with every tokenizer (tiny-llama
has no chat template; SmolLM2's template has no tool-call syntax), so the same environment
works with both.
"""

from __future__ import annotations

from typing import NamedTuple

OPEN, CLOSE = "<tool>", "</tool>"


class ToolCall(NamedTuple):
    name: str
    argument: str


class ToolCallError(ValueError):
    """A turn that opens a tool tag but does not hold a well-formed call."""


def parse_tool_call(text: str, *, max_chars: int = 1000) -> ToolCall | None:
    """The first tool call in ``text``; None when the text opens no ``<tool>`` tag.

    Raises:
        ToolCallError: an unclosed tag, a call without ``NAME:``, an empty name or argument, or
            a call longer than ``max_chars``.
    """
    start = text.find(OPEN)
    if start < 0:
        return None
    end = text.find(CLOSE, start)
    if end < 0:
        raise ToolCallError(f"unclosed {OPEN} tag: write {OPEN}name: argument{CLOSE}")
    body = text[start + len(OPEN) : end]
    if len(body) > max_chars:
        raise ToolCallError(f"tool call has {len(body)} characters, more than {max_chars}")
    name, colon, argument = body.partition(":")
    if not colon or not name.strip() or not argument.strip():
        raise ToolCallError(f"malformed tool call {body!r}: write {OPEN}name: argument{CLOSE}")
    return ToolCall(name.strip(), argument.strip())


def result_text(value: str) -> str:
    return f"<result>{value}</result>"


def error_text(reason: str) -> str:
    return f"<error>{reason}</error>"
