"""TRL's preference format, and which schema a pair file is in when none is named.

TRL's preference rows (https://huggingface.co/docs/trl/dataset_formats) hold ``chosen`` and
``rejected`` and, usually, ``prompt``, in one of two formats:

- standard: three strings, ``{"prompt": "..", "chosen": "..", "rejected": ".."}``;
- conversational: lists of ``{role, content}`` messages. ``prompt`` is a list of messages
  (``chosen`` / ``rejected`` hold the assistant's reply, and may repeat the prompt's turns
  first), or it is absent (the implicit prompt: the messages ``chosen`` and ``rejected`` share
  from the start are the prompt). A ``prompt`` string with message-list responses (UltraFeedback
  binarized) is read the same way, the string being used when the responses share no turns.

A prompt of several turns becomes ``"User: ..\\n\\nAssistant: .."`` text (see
:func:`~lit_rlhf.data.pair_fields.conversation_text`), as HelpSteer3's context does; a response
of several assistant messages the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_rlhf.data.pair_fields import (
    HH_ASSISTANT,
    MalformedRow,
    Read,
    chat_turns,
    conversation_text,
    text_field,
)

_CHAT = "a list of {role, content} messages"


def read_trl(row: Mapping[str, Any], where: str) -> Read:
    """A TRL preference row (standard or conversational) as (prompt, chosen, rejected, -1,
    subset); the chosen response is response 1."""
    subset = str(row.get("subset") or "")
    if not (isinstance(row.get("chosen"), list) or isinstance(row.get("rejected"), list)):
        if row.get("prompt") is None:
            raise MalformedRow(
                f"{where}: field 'prompt' is missing, and 'chosen' / 'rejected' are strings (an "
                "implicit prompt is read only from conversations). Fix: add the prompt as a "
                f"'prompt' column, or write 'chosen' and 'rejected' as {_CHAT}."
            )
        texts = [text_field(row, field, where) for field in ("prompt", "chosen", "rejected")]
        return texts[0], texts[1], texts[2], -1, subset
    chosen, rejected = (chat_turns(row.get(f), where, f) for f in ("chosen", "rejected"))
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        turns = chat_turns(prompt, where, "prompt")
        chosen, rejected = _after(turns, chosen), _after(turns, rejected)
        prompt_text = conversation_text(turns, where, "prompt")
    elif prompt is None or isinstance(prompt, str):
        shared = _shared_turns(chosen, rejected)
        turns, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        if turns:
            prompt_text = conversation_text(turns, where, "chosen")
        elif isinstance(prompt, str) and prompt.strip():
            prompt_text = prompt
        else:
            raise MalformedRow(
                f"{where}: field 'prompt' is missing and 'chosen' / 'rejected' share no leading "
                "messages, so the row has no prompt. Fix: add the prompt's messages as a "
                "'prompt' column, or start both conversations with them."
            )
    else:
        raise MalformedRow(
            f"{where}: field 'prompt' must be a string or {_CHAT}, got {prompt!r:.100}. Fix: "
            "repair or remove the row."
        )
    return (
        prompt_text,
        _reply(chosen, "chosen", where),
        _reply(rejected, "rejected", where),
        -1,
        subset,
    )


def _after(prompt: Sequence[Mapping[str, Any]], messages: list[Mapping[str, Any]]) -> list:
    """``messages`` without the prompt's turns when it repeats them first."""
    head = [(m.get("role"), m.get("content")) for m in messages[: len(prompt)]]
    same = head == [(m.get("role"), m.get("content")) for m in prompt]
    return messages[len(prompt) :] if same else messages


def _shared_turns(chosen: list[Mapping[str, Any]], rejected: list[Mapping[str, Any]]) -> int:
    """How many leading messages the two conversations share, leaving each at least one."""
    limit = min(len(chosen), len(rejected)) - 1
    shared = 0
    while shared < limit and _same(chosen[shared], rejected[shared]):
        shared += 1
    return shared


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("role"), a.get("content")) == (b.get("role"), b.get("content"))


def _reply(messages: list[Mapping[str, Any]], field: str, where: str) -> str:
    """The response after the prompt: assistant messages only."""
    others = [m.get("role") for m in messages if m.get("role") != "assistant"]
    if not messages or others:
        raise MalformedRow(
            f"{where}: field {field!r} must continue the prompt with the assistant's messages "
            f"only, got {len(messages)} messages after the prompt (roles other than assistant: "
            f"{others}). Fix: repair or remove the row."
        )
    if len(messages) == 1:
        return text_field(messages[0], "content", f"{where}, field {field!r} reply")
    return conversation_text(list(messages), where, field)


def detect_pair_schema(path: str, columns: Sequence[str], first: Mapping[str, Any]) -> str:
    """The schema of pair rows with these ``columns`` (``first``: the first row): ``pairs``
    (``response_1`` / ``response_2``), ``helpsteer3`` (``overall_preference``), ``hh_rlhf``
    (``chosen`` / ``rejected`` transcripts with ``"\\n\\nAssistant:"`` and no ``prompt``), else
    ``trl`` for any ``chosen`` / ``rejected`` rows."""
    names = set(columns)
    if {"response_1", "response_2"} <= names:
        return "pairs"
    if {"overall_preference", "response1", "response2"} <= names:
        return "helpsteer3"
    if {"chosen", "rejected"} <= names:
        chosen = first.get("chosen")
        if "prompt" not in names and isinstance(chosen, str) and HH_ASSISTANT in chosen:
            return "hh_rlhf"
        return "trl"
    raise ValueError(
        f"{path}: schema 'auto' found no known pair format in the columns {list(columns)} "
        "(it reads prompt/chosen/rejected, response_1/response_2, HelpSteer3 and HH-RLHF rows). "
        "Fix: set schema= to the data's format, or rename the columns."
    )
