"""FilePrompts' row filter (``where``: MATH levels 3-5 as in SimpleRL, the MGS authors' math
data) and chat-format question columns (verl parquet files, e.g. the authors' WildChat-IF)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rlhf.data import FilePrompts


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_where_keeps_only_the_listed_levels(tmp_path: Path) -> None:
    rows = [{"problem": f"p{i}", "solution": f"\\boxed{{{i}}}", "level": f"Level {i % 5 + 1}"}
            for i in range(10)]  # fmt: skip
    path = _write(tmp_path / "math.jsonl", rows)
    levels = {"level": ["Level 3", "Level 4", "Level 5"]}
    source = FilePrompts(path, question_field="problem", answer_field="solution", where=levels,
                         max_examples=4)  # fmt: skip
    table = source.load()
    assert table["problem"] == ["p2", "p3", "p4", "p7"]  # filtered first, then the first 4
    assert set(table["level"]) == {"Level 3", "Level 4", "Level 5"}
    with pytest.raises(ValueError, match=r"where names columns \['difficulty'\]"):
        FilePrompts(path, question_field="problem", where={"difficulty": [1]}).load()
    with pytest.raises(ValueError, match="no row passes"):
        FilePrompts(path, question_field="problem", where={"level": ["Level 9"]}).load()
    with pytest.raises(ValueError, match="non-empty lists"):
        FilePrompts(path, where={"level": []})


def test_a_chat_format_question_is_its_user_message(tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": "How do tides work?"}], "ability": "chat"}]
    path = _write(tmp_path / "chat.jsonl", rows)
    (row,) = FilePrompts(path, question_field="prompt", answer_field=None, task="chat",
                         question_template="User: <query>{question}</query>\n").load()  # fmt: skip
    assert row["question"] == "User: <query>How do tides work?</query>\n"
    assert row["prompt"] == "How do tides work?"  # the column holds the text now
    turns = [("user", "a"), ("assistant", "b"), ("user", "c")]
    two_turns = [{"prompt": [{"role": r, "content": c} for r, c in turns]}]
    with pytest.raises(ValueError, match="a chat with 2 user messages"):
        FilePrompts(_write(tmp_path / "two.jsonl", two_turns), question_field="prompt",
                    answer_field=None).load()  # fmt: skip
