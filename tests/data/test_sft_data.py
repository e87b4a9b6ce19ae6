"""SFTDataModule: labels on the response tokens only (exact positions, by hand), chat rows trained
on their assistant turns only, truncation, and malformed rows / settings refused with the file,
row and fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lit_rlhf.data import SFTDataModule, collate_sft
from lit_rlhf.data.sft import IGNORE, LongPromptError

TINY = "builtin:tiny-llama"  # template: <|role|>content<|end|>\n; EOS <|endoftext|>; no BOS


def _file(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _data(tmp_path: Path, rows: list[dict[str, Any]], **kwargs: Any) -> SFTDataModule:
    data = SFTDataModule(TINY, train=_file(tmp_path / "rows.jsonl", rows), shuffle=False, **kwargs)
    data.setup("fit")
    return data


def _spans(tokenizer: Any, ids: list[int], labels: list[int]) -> list[tuple[bool, str]]:
    """The row as (trained, text) runs of consecutive tokens."""
    runs: list[tuple[bool, list[int]]] = []
    for token, label in zip(ids, labels, strict=True):
        trained = label != IGNORE
        assert not trained or label == token  # a label is the token itself
        if runs and runs[-1][0] == trained:
            runs[-1][1].append(token)
        else:
            runs.append((trained, [token]))
    return [(trained, tokenizer.decode(tokens)) for trained, tokens in runs]


def test_prompt_response_row_is_trained_on_the_response_and_eos_only(tmp_path: Path) -> None:
    data = _data(tmp_path, [{"prompt": "What is 2+2?", "response": "4 it is"}])
    tok, row = data.tokenizer, data.data["train"][0]
    prompt = "<|user|>What is 2+2?<|end|>\n<|assistant|>"  # the template, written out by hand
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    r = tok("4 it is", add_special_tokens=False)["input_ids"]
    assert row["input_ids"] == p + r + [tok.eos_token_id]
    assert row["labels"] == [IGNORE] * len(p) + r + [tok.eos_token_id]
    assert _spans(tok, row["input_ids"], row["labels"]) == [
        (False, prompt), (True, "4 it is<|endoftext|>")
    ]  # fmt: skip


def test_without_a_chat_template_the_raw_prompt_follows_the_system_prompt(tmp_path: Path) -> None:
    rows = [{"prompt": "Q?", "response": "A."}]
    data = _data(tmp_path, rows, chat_template=False, system_prompt="Be brief.")
    row = data.data["train"][0]
    assert _spans(data.tokenizer, row["input_ids"], row["labels"]) == [
        (False, "Be brief.\n\nQ?"), (True, "A.<|endoftext|>")
    ]  # fmt: skip


def test_the_batch_pads_right_and_masks_padding_at_exact_positions() -> None:
    rows = [
        {"input_ids": [5, 6, 7, 8], "labels": [IGNORE, IGNORE, 7, 8]},
        {"input_ids": [5, 9], "labels": [IGNORE, 9]},
    ]
    batch = collate_sft(rows, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [5, 9, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE, IGNORE, 7, 8], [IGNORE, 9, IGNORE, IGNORE]]


def test_chat_rows_train_the_assistant_turns_only(tmp_path: Path) -> None:
    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "left out"},
    ]
    data = _data(tmp_path, [{"messages": chat}])
    row = data.data["train"][0]
    assert _spans(data.tokenizer, row["input_ids"], row["labels"]) == [
        (False, "<|system|>S<|end|>\n<|user|>hi<|end|>\n<|assistant|>"),
        (True, "yo<|end|>\n"),
        (False, "<|user|>q2<|end|>\n<|assistant|>"),
        (True, "a2<|end|>\n"),
    ]  # the trailing user turn has nothing to train and is not kept


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path: Path) -> None:
    data = SFTDataModule(TINY, train=_file(tmp_path / "c.jsonl", [{"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}]))  # fmt: skip
    # like a reasoning template: earlier assistant turns are rendered without their content
    data.tokenizer.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{% if m.role != 'assistant' or loop.last %}"
        "{{ m.content }}{% endif %}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    with pytest.raises(ValueError, match=r"c.jsonl.*row 0: .*assistant turn 3 .*one row per turn"):
        data.setup("fit")


def test_a_long_response_is_cut_to_max_length(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="1 of 1 rows cut to max_length"):
        data = _data(tmp_path, [{"prompt": "Q", "response": "a long answer " * 20}], max_length=24)
    row = data.data["train"][0]
    assert len(row["input_ids"]) == len(row["labels"]) == 24
    assert row["labels"][-1] != IGNORE and row["input_ids"][-1] != data.tokenizer.eos_token_id


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "Q"}, "row 1: field 'response' must be a non-empty string, got missing"),
        ({"prompt": "Q", "response": "  "}, "row 1: field 'response' must be a non-empty"),
        ({"response": "A"}, "row 1: field 'prompt' .* Fix: .*prompt_field"),
        ({"messages": []}, "row 1: 'messages' must be a non-empty list"),
        ({"messages": [{"role": "user"}]}, "row 1: message 0 of 'messages'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "row 1: .*no non-empty assistant"),
    ],
)
def test_malformed_rows_name_file_row_and_fix(tmp_path: Path, row: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"rows.jsonl \(split 'train'\), " + message):
        _data(tmp_path, [{"prompt": "Q", "response": "A"}, row])


def test_a_prompt_longer_than_max_length_is_an_error_or_dropped(tmp_path: Path) -> None:
    rows = [{"prompt": "Q", "response": "A"}, {"prompt": "x" * 200, "response": "A"}]
    with pytest.raises(LongPromptError, match=r"row 1: no response token .*long_prompts: drop"):
        _data(tmp_path, rows, max_length=32)
    with pytest.warns(UserWarning, match="1 rows dropped"):
        data = _data(tmp_path, rows, max_length=32, long_prompts="drop")
    assert len(data.data["train"]) == 1


def test_chat_rows_need_a_chat_template(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with pytest.raises(ValueError, match=r"row 0: a chat row .* data chat_template is false"):
        _data(tmp_path, [{"messages": chat}], chat_template=False)


def test_field_names_are_settings(tmp_path: Path) -> None:
    data = _data(tmp_path, [{"question": "Q", "reference": "A"}],
                 prompt_field="question", response_field="reference")  # fmt: skip
    row = data.data["train"][0]
    assert _spans(data.tokenizer, row["input_ids"], row["labels"])[-1] == (True, "A<|endoftext|>")


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"max_length": 1}, "max_length"),
        ({"long_prompts": "cut"}, "long_prompts"),
        ({"max_examples": 0}, "max_examples"),
    ],
)
def test_bad_settings_are_refused_when_built(settings: dict, name: str) -> None:
    with pytest.raises(
        ValueError, match=rf"SFTDataModule {name}=.* Fix: set data.init_args.{name}"
    ):
        SFTDataModule(TINY, train="unused.jsonl", **settings)


def test_a_missing_file_names_the_path(tmp_path: Path) -> None:
    data = SFTDataModule(TINY, train=str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: no such file"):
        data.setup("fit")
