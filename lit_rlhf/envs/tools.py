"""The tool-call format of multi-turn rollouts: a tag in the agent's text.

The agent calls a tool by writing ``<tool>NAME: ARGUMENT</tool>``, e.g.
``<tool>calculator: 3*(4+5)</tool>``; the first complete tag of a turn is the call. The answer
comes back as the environment's turn, ``<result>...</result>`` for a result and
``<error>...</error>`` for a bad call. The tag format works with every tokenizer (tiny-llama has
no chat template; SmolLM2's template has no tool-call syntax).

Chat templates with a tool syntax (Qwen2.5, Hermes-style: the tools' JSON schemas rendered into
the system prompt by ``apply_chat_template(tools=...)``, which ``PromptDataModule`` passes on from
``chat_template_kwargs: {tools: [...]}``) make the model call
``<tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}</tool_call>``;
:func:`parse_tool_call` reads that form too (``json.loads``, never ``eval``): a one-argument
call gives that argument's value, a call of several arguments their JSON object as text. The
environment's answer is rendered with the template's ``tool`` role either way.
"""

from __future__ import annotations

import json
from typing import NamedTuple

OPEN, CLOSE = "<tool>", "</tool>"
JSON_OPEN, JSON_CLOSE = "<tool_call>", "</tool_call>"


class ToolCall(NamedTuple):
    name: str
    argument: str


class ToolCallError(ValueError):
    """A turn that opens a tool tag but does not hold a well-formed call."""


def parse_tool_call(text: str, *, max_chars: int = 1000) -> ToolCall | None:
    """The first tool call in ``text`` (the tag form or the chat templates' JSON form, whichever
    opens first); None when the text opens neither.

    Raises:
        ToolCallError: an unclosed tag, a call without ``NAME:`` (tag form) or without a name
            and arguments (JSON form), invalid JSON, an empty name or argument, or a call longer
            than ``max_chars``.
    """
    tag, js = text.find(OPEN), text.find(JSON_OPEN)
    if js >= 0 and (tag < 0 or js < tag):
        return _json_call(_body(text, js, JSON_OPEN, JSON_CLOSE, max_chars))
    if tag < 0:
        return None
    body = _body(text, tag, OPEN, CLOSE, max_chars)
    name, colon, argument = body.partition(":")
    if not colon or not name.strip() or not argument.strip():
        raise ToolCallError(f"malformed tool call {body!r}: write {OPEN}name: argument{CLOSE}")
    return ToolCall(name.strip(), argument.strip())


def _body(text: str, start: int, opening: str, closing: str, max_chars: int) -> str:
    end = text.find(closing, start)
    if end < 0:
        raise ToolCallError(f"unclosed {opening} tag: close the call with {closing}")
    body = text[start + len(opening) : end]
    if len(body) > max_chars:
        raise ToolCallError(f"tool call has {len(body)} characters, more than {max_chars}")
    return body


def _json_call(body: str) -> ToolCall:
    """``{"name": ..., "arguments": {...} | "..."}`` (``parameters`` also accepted)."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        raise ToolCallError(f"the tool call is not valid JSON ({err.msg})") from err
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ToolCallError('write {"name": "TOOL", "arguments": {...}} inside <tool_call>')
    args = call.get("arguments", call.get("parameters"))
    if isinstance(args, dict) and len(args) == 1:
        args = next(iter(args.values()))
    argument = args if isinstance(args, str) else json.dumps(args) if args else ""
    if not call["name"].strip() or not str(argument).strip():
        raise ToolCallError(f"tool call {body.strip()!r} has an empty name or no arguments")
    return ToolCall(call["name"].strip(), str(argument).strip())


def result_text(value: str) -> str:
    return f"<result>{value}</result>"


def error_text(reason: str) -> str:
    return f"<error>{reason}</error>"
