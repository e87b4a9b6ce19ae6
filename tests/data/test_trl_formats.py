"""TRL's dataset formats read as they are, with no column or schema setting: prompt-only rows
(GRPO) by FilePrompts, preference rows (DPO, RM, judge pairs) by PreferencePairs' default schema
and by ``schema: trl``, language-modeling and prompt-completion rows (SFT) by SFTDataModule; and
malformed rows refused naming the row and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lit_rlhf.data import FilePrompts, PreferencePairs, PromptDataModule, SFTDataModule
from lit_rlhf.data.pair_fields import MalformedRow
from lit_rlhf.data.sft import IGNORE
from lit_rlhf.rewards.adapt import as_reward

TINY = "builtin:tiny-llama"  # chat template: <|role|>content<|end|>\n


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


# ---------------------------------------------------------------- prompt-only (GRPO)
@pytest.mark.parametrize("conversational", [False, True])
def test_trl_prompt_rows_need_no_column_setting(tmp_path: Path, conversational: bool) -> None:
    questions = ["What is 2 + 3?", "What is 7 * 6?"]
    rows = [
        {"prompt": [user(q)] if conversational else q, "solution": s, "level": 1}
        for q, s in zip(questions, ["5", "42"], strict=True)
    ]
    data = FilePrompts(write_jsonl(tmp_path / "prompts.jsonl", rows)).load()
    assert data["question"] == questions and data["solution"] == ["5", "42"]
    assert "answer" not in data.column_names  # the default answer column is optional


def test_trl_prompt_columns_reach_the_reward_as_keywords(tmp_path: Path) -> None:
    rows = [
        {"prompt": [user("What is 2 + 3?")], "solution": "5"},
        {"prompt": "1+1?", "solution": "2"},
    ]
    source = FilePrompts(write_jsonl(tmp_path / "prompts.jsonl", rows))
    module = PromptDataModule(TINY, source, batch_size=2, shuffle=False)
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    seen: dict[str, Any] = {}

    def correctness(completions: list[str], solution: list[str], **kwargs: Any) -> list[float]:
        seen.update(kwargs, solution=solution)
        return [float(c == s) for c, s in zip(completions, solution, strict=True)]

    out = as_reward(correctness)(batch["prompt"], ["5", "3"], batch["row"])
    assert out.scores.tolist() == [1.0, 0.0]
    assert seen["solution"] == ["5", "2"] and seen["question"] == ["What is 2 + 3?", "1+1?"]
    assert seen["prompts"] == batch["prompt"] == seen["prompt"]  # the chat-rendered prompts
    assert batch["prompt"][0] == "<|user|>What is 2 + 3?<|end|>\n<|assistant|>"


def test_prompt_rows_without_a_question_column_name_the_setting(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"problem": "1+1?", "answer": "2"}])
    with pytest.raises(ValueError, match=r"no 'prompt' column.*question_field= to one of"):
        FilePrompts(path).load()
    assert FilePrompts(path, question_field="problem").load()["question"] == ["1+1?"]
    with pytest.raises(ValueError, match=r"row 0 has no field 'solution'.*answer_field"):
        FilePrompts(path, question_field="problem", answer_field="solution").load()


# ---------------------------------------------------------------- preference pairs
STANDARD = [
    {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    {"prompt": "Grass is", "chosen": " green.", "rejected": " purple."},
]
EXPLICIT = [  # conversational, explicit prompt; the replies hold the assistant's turn only
    {"prompt": [user(r["prompt"])], "chosen": [assistant(r["chosen"])],
     "rejected": [assistant(r["rejected"])]}
    for r in STANDARD
]  # fmt: skip
IMPLICIT = [  # conversational, implicit prompt: the shared leading turns
    {"chosen": [user(r["prompt"]), assistant(r["chosen"])],
     "rejected": [user(r["prompt"]), assistant(r["rejected"])]}
    for r in STANDARD
]  # fmt: skip
REPEATED = [{**r, "prompt": [user(s["prompt"])]} for r, s in zip(IMPLICIT, STANDARD, strict=True)]


def triples(data: Any) -> list[tuple[str, str, str]]:
    """(prompt, chosen, rejected) per pair, whichever order the placement coin chose."""
    out = []
    for row in data:
        first, second = row["response_1"], row["response_2"]
        chosen, rejected = (first, second) if row["label"] == -1 else (second, first)
        out.append((row["query"], chosen, rejected))
    return out


@pytest.mark.parametrize("rows", [STANDARD, EXPLICIT, IMPLICIT, REPEATED],
                         ids=["standard", "explicit", "implicit", "explicit-repeated"])  # fmt: skip
@pytest.mark.parametrize("schema", ["auto", "trl"])
def test_trl_preference_rows(tmp_path: Path, rows: list[dict], schema: str) -> None:
    source = PreferencePairs(write_jsonl(tmp_path / "pairs.jsonl", rows), schema=schema)  # type: ignore[arg-type]
    assert triples(source.load()) == [(r["prompt"], r["chosen"], r["rejected"]) for r in STANDARD]
    assert source.format == "trl"


def test_multi_turn_prompt_and_the_other_formats_still_detected(tmp_path: Path) -> None:
    turns = [user("Hi"), assistant("Hello!"), user("Name a colour.")]
    row = {"chosen": [*turns, assistant("Blue.")], "rejected": [*turns, assistant("7")]}
    data = PreferencePairs(write_jsonl(tmp_path / "multi.jsonl", [row])).load()
    assert triples(data) == [
        ("User: Hi\n\nAssistant: Hello!\n\nUser: Name a colour.", "Blue.", "7")
    ]
    hh = {
        "chosen": "\n\nHuman: Hi\n\nAssistant: Blue.",
        "rejected": "\n\nHuman: Hi\n\nAssistant: 7",
    }
    plain = {"prompt": "Hi", "response_1": "a", "response_2": "b", "label": 1}
    for name, sample in (("hh_rlhf", hh), ("pairs", plain)):
        source = PreferencePairs(write_jsonl(tmp_path / f"{name}.jsonl", [sample]))
        source.load()
        assert source.format == name


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ({"prompt": "Q", "chosen": "A", "rejected": ""}, "rejected", "non-empty string"),
        ({"chosen": "The sky is blue.", "rejected": "The sky is green."}, "prompt", "implicit"),
        ({"chosen": [assistant("A")], "rejected": [assistant("B")]}, "prompt", "no prompt"),
        ({"prompt": [user("Q")], "chosen": [assistant("A")], "rejected": "B"}, "rejected",
         "list of {role, content}"),
        ({"chosen": [user("Q"), assistant("A")], "rejected": [user("Q"), user("B")]},
         "rejected", "assistant's messages only"),
    ],
)  # fmt: skip
def test_malformed_trl_pair_rows_name_row_and_field(
    tmp_path: Path, row: dict, field: str, message: str
) -> None:
    good = STANDARD[0] if isinstance(row["chosen"], str) else IMPLICIT[0]
    path = write_jsonl(tmp_path / "bad.jsonl", [good, row])
    with pytest.raises(MalformedRow, match=message) as err:
        PreferencePairs(path, schema="trl").load()
    text = str(err.value)
    assert "bad.jsonl" in text and "row 1" in text and repr(field) in text and "Fix:" in text


def test_auto_schema_without_a_known_format_names_the_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "odd.jsonl", [{"question": "Q", "good": "A", "bad": "B"}])
    with pytest.raises(ValueError, match=r"schema 'auto'.*\['question', 'good', 'bad'\].*schema="):
        PreferencePairs(path).load()


# ---------------------------------------------------------------- SFT
def sft_spans(data: SFTDataModule) -> list[tuple[bool, str]]:
    """The first row as (trained, text) runs of tokens."""
    row, tok = data.data["train"][0], data.tokenizer
    runs: list[tuple[bool, list[int]]] = []
    for token, label in zip(row["input_ids"], row["labels"], strict=True):
        if runs and runs[-1][0] == (label != IGNORE):
            runs[-1][1].append(token)
        else:
            runs.append((label != IGNORE, [token]))
    return [(trained, tok.decode(ids)) for trained, ids in runs]


def sft(tmp_path: Path, row: dict) -> SFTDataModule:
    data = SFTDataModule(TINY, train=write_jsonl(tmp_path / "sft.jsonl", [row]), shuffle=False)
    data.setup("fit")
    return data


def test_sft_messages_and_prompt_completion_rows(tmp_path: Path) -> None:
    prompt = "<|user|>The sky?<|end|>\n<|assistant|>"
    standard = sft(tmp_path, {"prompt": "The sky?", "completion": "Blue."})
    assert sft_spans(standard) == [(False, prompt), (True, "Blue.<|endoftext|>")]
    chat = [user("Hi"), assistant("Hello!"), user("The sky?")]
    row = {"prompt": chat, "completion": [assistant("Blue.")]}
    context = "<|user|>Hi<|end|>\n<|assistant|>Hello!<|end|>\n" + prompt
    assert sft_spans(sft(tmp_path, row)) == [(False, context), (True, "Blue.<|end|>\n")]
    messages = sft(tmp_path, {"messages": [*chat, assistant("Blue.")]})  # every assistant turn
    assert [trained for trained, _ in sft_spans(messages)] == [False, True, False, True]


def test_malformed_sft_completion_names_row_and_field(tmp_path: Path) -> None:
    row = {"prompt": [user("Q")], "completion": [user("not a reply")]}
    with pytest.raises(
        ValueError, match=r"sft\.jsonl.*row 0.*'completion'.*no non-empty assistant"
    ):
        sft(tmp_path, row)
    with pytest.raises(ValueError, match=r"row 0: field 'response' must be a non-empty string"):
        sft(tmp_path, {"prompt": "Q", "answer": "A"})
