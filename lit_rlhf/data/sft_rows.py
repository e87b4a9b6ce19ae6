"""Supervised fine-tuning rows -> token ids and labels (the row formats are in
:mod:`lit_rlhf.data.sft`'s docstring): :class:`SFTEncoder`, used by ``SFTDataModule`` and by
``DPOModule`` to encode (prompt, response) pairs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lit_rlhf.data.prompt_batches import render_chat_prompt
from lit_rlhf.errors import DataError

IGNORE = -100  # the label of a token that is not trained (torch's cross-entropy ignore_index)
RESPONSE_COLUMNS = ("response", "completion")  # read in this order when response_field is None


class LongPromptError(DataError):
    """A row whose prompt leaves no response token within ``max_length``."""

    setting = "data.init_args.max_length"


class SFTEncoder:
    """Rows -> ``{"input_ids", "labels"}`` (the module docstring says how). ``chat_template``:
    render with the tokenizer's chat template (True only when the tokenizer has one);
    ``response_field=None`` reads ``response``, else ``completion`` (TRL's column)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_length: int,
        chat_template: bool,
        system_prompt: str | None = None,
        prompt_field: str = "prompt",
        response_field: str | None = None,
        messages_field: str = "messages",
    ) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError(
                "the tokenizer has no EOS token: a response could not end. Fix: use a tokenizer "
                "that defines one."
            )
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.chat_template = chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.system_prompt = system_prompt
        self.fields = (prompt_field, response_field, messages_field)

    def encode(self, row: Mapping[str, Any], where: str) -> dict[str, list[int]]:
        """One row's ``input_ids`` and ``labels``, cut to ``max_length``, and ``length`` (``[n]``:
        its tokens before the cut); ``where`` names the row in errors. Raises ValueError for a
        malformed row, :class:`LongPromptError` for one with no trained token left."""
        pieces, chat = self._pieces(row, where)
        ids: list[int] = []
        labels: list[int] = []
        for number, (text, trained) in enumerate(pieces):
            special = number == 0 and not self.chat_template  # a raw prompt: BOS etc.
            piece = self.tokenizer(text, add_special_tokens=special)["input_ids"]
            if trained and not chat:
                piece = [*piece, self.tokenizer.eos_token_id]
            ids += piece
            labels += piece if trained else [IGNORE] * len(piece)
        length, ids, labels = len(ids), ids[: self.max_length], labels[: self.max_length]
        if all(label == IGNORE for label in labels[1:]):  # position 0 is never predicted
            raise LongPromptError(
                f"{where}: no response token is left within max_length={self.max_length} "
                f"tokens (the prompt/context takes {_untrained_prefix(labels)} of them). Fix: "
                "raise data max_length, shorten or remove the row, or set data long_prompts: "
                "drop to skip such rows."
            )
        return {"input_ids": ids, "labels": labels, "length": [length]}

    def _pieces(self, row: Mapping[str, Any], where: str) -> tuple[list[tuple[str, bool]], bool]:
        """The row's (text, trained) pieces, and whether they come from a chat (whose rendered
        assistant turns carry their own end-of-turn text, so no EOS is added)."""
        prompt_field, response_field, messages_field = self.fields
        if row.get(messages_field) is not None:
            return self._chat_pieces(row[messages_field], where, messages_field), True
        response_field = response_field or next(
            (c for c in RESPONSE_COLUMNS if row.get(c) is not None), RESPONSE_COLUMNS[0]
        )
        if isinstance(row.get(prompt_field), list):  # TRL's conversational prompt-completion
            turns = _check_messages(row[prompt_field], where, prompt_field, reply=False)
            completion = _check_messages(row.get(response_field), where, response_field)
            messages = [*turns, *completion]
            return self._chat_pieces(messages, where, response_field, len(turns)), True
        names = (prompt_field, response_field, messages_field)
        prompt = _text(row, prompt_field, where, "prompt_field", names)
        response = _text(row, response_field, where, "response_field", names)
        return [(self._render_prompt(prompt), False), (response, True)], False

    def _render_prompt(self, prompt: str) -> str:
        return render_chat_prompt(
            self.tokenizer,
            prompt,
            system_prompt=self.system_prompt,
            use_chat_template=self.chat_template,
        )

    def _chat_pieces(
        self, messages: Any, where: str, field: str, trained_from: int = 0
    ) -> list[tuple[str, bool]]:
        """(text, trained) pieces of a rendered chat: context up to each assistant turn from
        index ``trained_from`` on, then that turn; anything after the last such turn is left out
        (nothing to train)."""
        messages = _check_messages(messages, where, field, reply=trained_from == 0)
        if not self.chat_template:
            why = (
                "the tokenizer has none"
                if self.tokenizer.chat_template is None
                else ("data chat_template is false")
            )
            raise ValueError(
                f"{where}: a chat row ({field!r}) needs a chat template, and {why}. "
                "Fix: set data chat_template: true with a tokenizer that has a template, or "
                "write the rows as prompt/response pairs."
            )
        if self.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
            trained_from += 1
        pieces: list[tuple[str, bool]] = []
        done = ""
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or i < trained_from:
                continue
            before = self._render(messages[:i], opened=True) if i else ""
            after = self._render(messages[: i + 1], opened=False)
            if not (before.startswith(done) and after.startswith(before)):
                raise ValueError(
                    f"{where}: the tokenizer's chat template does not render the chat up to "
                    f"assistant turn {i} as a prefix of the chat including it (it rewrites "
                    "earlier turns, e.g. drops their reasoning), so the turn's tokens cannot be "
                    "cut out. Fix: end each row at its first assistant turn (one row per "
                    "turn), or use prompt/response rows."
                )
            pieces += [(before[len(done) :], False), (after[len(before) :], True)]
            done = after
        return [(text, trained) for text, trained in pieces if text]

    def _render(self, messages: Sequence[Mapping[str, str]], *, opened: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=opened
            )
        )


def _text(
    row: Mapping[str, Any], field: str, where: str, setting: str, fields: tuple[str, ...]
) -> str:
    value = row.get(field)
    if not isinstance(value, str) or not value.strip():
        got = "missing" if value is None else f"{type(value).__name__} {value!r:.60}"
        raise ValueError(
            f"{where}: field {field!r} must be a non-empty string, got {got}. A row is "
            f"{{{fields[0]!r}: str, {fields[1]!r}: str}} or {{{fields[2]!r}: [{{role, "
            f"content}}, ...]}}. Fix: repair or remove the row, or set data {setting} to the "
            f"column that holds it (columns: {sorted(row)})."
        )
    return value


def _check_messages(
    messages: Any, where: str, field: str, *, reply: bool = True
) -> list[dict[str, str]]:
    """A list of ``{role, content}`` string dicts; with ``reply``, one with at least one
    non-empty assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: {field!r} must be a non-empty list of {{role, content}} "
                         "messages. Fix: repair or remove the row.")  # fmt: skip
    for i, message in enumerate(messages):
        if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):  # fmt: skip
            raise ValueError(
                f"{where}: message {i} of {field!r} is {message!r:.80}, not a {{role: str, "
                "content: str}} dict. Fix: repair or remove the row."
            )
    if reply and not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise ValueError(
            f"{where}: the chat in {field!r} has no non-empty assistant turn, so there is "
            "nothing to train on. Fix: add the assistant's reply, or remove the row."
        )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _untrained_prefix(labels: Sequence[int]) -> int:
    return next((i for i, label in enumerate(labels) if label != IGNORE), len(labels))
