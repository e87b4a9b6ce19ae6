"""Prompt sources: local files (JSONL, parquet, folders), row validation, hub errors, Countdown."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from lit_rlhf.data import CountdownPrompts, FilePrompts

GSM8K_ROWS = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
        "answer": "48 / 2 = 24. 48 + 24 = 72 #### 72",
    },
    {
        "question": "Weng earns $12 an hour. How much for 50 minutes?",
        "answer": "12 / 60 * 50 = 10 #### 10",
    },
    {
        "question": "Betty has half of $100 and gets $15 + $30. How much more does she need?",
        "answer": "100 / 2 = 50; 100 - 50 - 15 - 30 = 5 #### 5",
    },
    {
        "question": "Julie read 12 pages today and twice as many yesterday. How many pages?",
        "answer": "12 + 24 = 36 #### 36",
    },
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_gsm8k(tmp_path: Path, fmt: str) -> Path:
    if fmt == "jsonl":
        return write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    path = tmp_path / "gsm8k.parquet"
    datasets.Dataset.from_list(GSM8K_ROWS).to_parquet(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_file_prompts_loads_local_files(tmp_path: Path, fmt: str) -> None:
    data = FilePrompts(str(write_gsm8k(tmp_path, fmt))).load()
    assert len(data) == 4
    assert {"query_id", "task", "question", "answer"} <= set(data.column_names)
    assert data["question"] == [row["question"] for row in GSM8K_ROWS]
    assert data[0]["answer"].endswith("#### 72")
    assert set(data["task"]) == {"math"}
    assert all(qid.startswith("math-") for qid in data["query_id"])


def test_split_slicing_on_a_file_and_split_names_in_a_folder(tmp_path: Path) -> None:
    path = write_gsm8k(tmp_path, "jsonl")
    assert len(FilePrompts(str(path), split="train[:50%]").load()) == 2
    assert len(FilePrompts(str(path), split="train[1:]").load()) == 3
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", GSM8K_ROWS[:3])
    write_jsonl(folder / "test.jsonl", GSM8K_ROWS[3:])
    test = FilePrompts(str(folder), split="test").load()
    assert test["question"] == [GSM8K_ROWS[3]["question"]]


def test_template_id_field_task_and_max_examples(tmp_path: Path) -> None:
    rows = [
        {"uid": 7, "problem": "1 + 1?", "solution": 2, "level": "easy"},
        {"uid": 8, "problem": "2 + 3?", "solution": 5, "level": "hard"},
    ]
    path = write_jsonl(tmp_path / "math.jsonl", rows)
    source = FilePrompts(
        str(path),
        question_field="problem",
        answer_field="solution",
        id_field="uid",
        task="arith",
        max_examples=1,
        question_template="[{level}] {problem}\nPut the final answer in \\boxed{{}}.",
    )
    (row,) = source.load()
    assert row["question"] == "[easy] 1 + 1?\nPut the final answer in \\boxed{}."
    assert (row["query_id"], row["task"], row["answer"]) == ("7", "arith", "2")
    assert row["level"] == "easy"  # other columns are kept for rewards


def test_query_ids_are_stable_and_unique(tmp_path: Path) -> None:
    path = str(write_gsm8k(tmp_path, "jsonl"))
    first, second = FilePrompts(path).load(), FilePrompts(path).load()
    assert first["query_id"] == second["query_id"]
    assert len(set(first["query_id"])) == len(GSM8K_ROWS)
    # the id follows the question, not its position
    reversed_path = write_jsonl(tmp_path / "reversed.jsonl", GSM8K_ROWS[::-1])
    assert FilePrompts(str(reversed_path)).load()["query_id"] == first["query_id"][::-1]
    repeated = write_jsonl(tmp_path / "repeated.jsonl", [*GSM8K_ROWS, GSM8K_ROWS[0]])
    with pytest.warns(UserWarning, match="1 rows repeat an earlier query_id"):
        FilePrompts(str(repeated)).load()


@pytest.mark.parametrize(
    ("bad_row", "field", "message"),
    [
        ({"answer": "#### 1"}, "question", "missing/None"),
        ({"question": 123, "answer": "#### 1"}, "question", "int 123"),
        ({"question": "   ", "answer": "#### 1"}, "question", "non-empty string"),
        ({"question": "What is 2 + 2?"}, "answer", "answer_field"),
    ],
)
def test_malformed_row_names_file_row_and_field(
    tmp_path: Path, bad_row: dict, field: str, message: str
) -> None:
    path = write_jsonl(tmp_path / "broken.jsonl", [*GSM8K_ROWS[:2], bad_row])
    with pytest.raises(ValueError, match=message) as err:
        FilePrompts(str(path)).load()
    assert "broken.jsonl" in str(err.value)
    assert "row 2" in str(err.value)
    assert repr(field) in str(err.value)


def test_wrong_field_name_lists_the_columns(tmp_path: Path) -> None:
    path = write_gsm8k(tmp_path, "parquet")
    with pytest.raises(ValueError, match=r"row 0 has no field 'problem'.*question_field= to one"):
        FilePrompts(str(path), question_field="problem").load()
    with pytest.raises(ValueError, match=r"template refers to field 'level'"):
        FilePrompts(str(path), question_template="{level}: {question}").load()


def test_bad_arguments_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="literal braces"):
        FilePrompts("x.jsonl", question_template="\\boxed{}")
    with pytest.raises(ValueError, match="max_examples"):
        FilePrompts("x.jsonl", max_examples=0)
    with pytest.raises(ValueError, match="num_numbers"):
        CountdownPrompts(num_numbers=1)


def test_hub_id_offline_gives_an_actionable_error() -> None:
    with pytest.raises(OSError, match=r"not a local file or folder.*Hub.*download") as err:
        FilePrompts("openai/gsm8k", name="main").load()
    assert "pass the local file as path=" in str(err.value)


def test_missing_local_file_is_not_sent_to_the_hub(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.jsonl: no such file"):
        FilePrompts(str(tmp_path / "nothere.jsonl")).load()


def test_countdown_prompts_rows_and_question() -> None:
    data = CountdownPrompts(num_examples=6, seed=3, num_numbers=3).load()
    assert len(data) == 6
    assert set(data["task"]) == {"countdown"}
    assert len(set(data["query_id"])) == 6
    for row in data:
        assert len(row["numbers"]) == 3
        assert f"[{', '.join(map(str, row['numbers']))}]" in row["question"]
        assert f"equals {row['target']}" in row["question"]
        assert row["solution"]
    assert CountdownPrompts(num_examples=6, seed=3, num_numbers=3).load()[:] == data[:]
