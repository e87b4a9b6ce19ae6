"""ReflectRM records: hard-pair selection, reflection labels in both orders, the 4 : 1 mix, and
reading the records back through PreferencePairs (reflection rows compare critiques)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_rlhf.data import PreferencePairs
from lit_rlhf.data.reflectrm import Judgment, build_reflectrm_records


def _item(i: int, label: int = -1) -> dict:
    return {"id": f"p{i}", "prompt": f"q{i}", "response_1": f"a{i}", "response_2": f"b{i}",
            "label": label}  # fmt: skip


def _mixed(label: int) -> list[Judgment]:
    """Two correct analyses and two wrong ones (the text names which)."""
    return [Judgment("right-1", label), Judgment("wrong-1", -label),
            Judgment("right-2", label), Judgment("wrong-2", -label)]  # fmt: skip


def test_all_correct_items_are_dropped_and_hard_items_kept() -> None:
    items = [_item(0), _item(1, 1), _item(2)]
    judgments = [
        [Judgment("ok", -1)] * 4,  # always right: dropped
        [Judgment("x", -1), Judgment("y", None), Judgment("z", 1)],  # one wrong: hard
        [Judgment("bad", 1), Judgment("", None)],  # never right: hard, no reflection
    ]
    records, stats = build_reflectrm_records(items, judgments, ratio=2)  # 2 : 1, nothing cut
    ids = {r["id"] for r in records if r["task"] == "preference"}
    assert ids == {"p1", "p2"} and stats.all_correct == 1
    assert stats.no_correct_analysis == 1  # p2 has no correct analysis
    (reflection,) = [r for r in records if r["task"] == "reflection"]
    assert reflection["id"] == "p1#reflection"


def test_reflection_labels_point_at_the_correct_analysis_in_both_orders() -> None:
    items = [_item(i, label=(-1) ** i) for i in range(200)]
    records, stats = build_reflectrm_records(
        items, [_mixed(item["label"]) for item in items], seed=3, ratio=1
    )
    reflections = [r for r in records if r["task"] == "reflection"]
    assert len(reflections) == 200 == stats.reflection
    firsts = 0
    for r in reflections:
        better = r["critique_1"] if r["label"] == -1 else r["critique_2"]
        worse = r["critique_2"] if r["label"] == -1 else r["critique_1"]
        assert better.startswith("right-") and worse.startswith("wrong-")
        firsts += r["label"] == -1
    assert 70 < firsts < 130  # the correct analysis is shown first about half the time


def test_the_mix_is_four_preference_records_per_reflection_record() -> None:
    items = [_item(i) for i in range(50)]
    judgments = [_mixed(-1) for _ in range(40)] + [[Judgment("w", 1)] * 2 for _ in range(10)]
    records, stats = build_reflectrm_records(items, judgments)
    kinds = [r["task"] for r in records]
    assert kinds.count("preference") == 48 and kinds.count("reflection") == 12  # 50 // 4
    assert stats.reflection_cut == 40 - 12 and stats.preference_cut == 2
    assert kinds[:12].count("reflection") < 12  # shuffled, not all reflections first
    # fewer reflection candidates than P / 4: the preference records are cut to 4x
    few = [_mixed(-1) for _ in range(3)] + [[Judgment("w", 1)] * 2 for _ in range(47)]
    records, stats = build_reflectrm_records(items, few)
    assert (stats.preference, stats.reflection, stats.preference_cut) == (12, 3, 38)


def test_bad_inputs_name_the_item() -> None:
    with pytest.raises(ValueError, match="item 0"):
        build_reflectrm_records([_item(0, label=0)], [[Judgment("a", 1)]])
    with pytest.raises(ValueError, match="judgment lists"):
        build_reflectrm_records([_item(0)], [])


def test_pair_source_reads_reflection_records_as_critique_comparisons(tmp_path: Path) -> None:
    items = [_item(i) for i in range(8)]
    records, _ = build_reflectrm_records(items, [_mixed(-1)] * 8, seed=1, ratio=4)
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = PreferencePairs(str(path), template="reflectrm-v1", swap="both", id_field="id").load()
    rows = {row["query_id"]: row for row in data}
    reflection = next(r for r in records if r["task"] == "reflection")
    shown, swapped = rows[reflection["id"]], rows[reflection["id"] + "#swap"]
    assert shown["subject"] == "Critique" and shown["template"] == "reflectrm-critique-v1"
    assert shown["subset"] == "reflection"
    assert reflection["critique_1"] in shown["question"] and "[Critique 1]" in shown["question"]
    assert shown["label"] == reflection["label"] and swapped["label"] == -reflection["label"]
    # swapping exchanges the critiques; the responses they refer to stay in place
    assert swapped["critique_1"] == shown["critique_2"]
    assert swapped["critique_2"] == shown["critique_1"]
    assert swapped["response_1"] == shown["response_1"]
    preference = next(r for r in records if r["task"] == "preference")
    assert rows[preference["id"]]["subject"] == "Response"
    assert rows[preference["id"]]["critique_1"] is None


def test_malformed_reflection_rows_name_the_field(tmp_path: Path) -> None:
    base = {"prompt": "q", "response_1": "a", "response_2": "b", "label": -1}
    for extra, field in (({"task": "reflection", "critique_1": "c"}, "critique_2"),
                         ({"task": "summary"}, "task"),
                         ({"task": "reflection", "critique_1": "c", "critique_2": "c"},
                          "critique_2")):  # fmt: skip
        path = tmp_path / "bad.jsonl"
        path.write_text(json.dumps({**base, **extra}) + "\n")
        with pytest.raises(ValueError, match=f"row 0: field '{field}'"):
            PreferencePairs(str(path)).load()


def test_a_subject_placeholder_prefills_and_reads_each_rows_verdict(tmp_path: Path) -> None:
    from lit_rlhf.algos.judge import JudgeFormat
    from lit_rlhf.data import FilePrompts, PromptDataModule

    items = [_item(i) for i in range(8)]
    records, _ = build_reflectrm_records(items, [_mixed(-1)] * 8, seed=1, ratio=4)
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    source = PreferencePairs(str(path), template="verdict-short-v1", id_field="id")
    data = PromptDataModule(
        "builtin:tiny-llama",
        train=source,
        use_chat_template=False,
        response_prefix=" <Result>{subject} 1 is",
        max_prompt_length=4096,
    )
    data.setup("fit")
    for row in data.train_data:  # type: ignore[union-attr]
        assert row["prompt"].endswith(f" <Result>{row['subject']} 1 is")
    fmt = JudgeFormat(
        ("Result",), prefix=" <Result>{subject} 1 is", suffix=" than {subject} 2</Result>"
    )
    assert fmt.verdict(" worse", "Critique") == 1 and fmt.verdict(" better") == -1
    assert (
        fmt.text(" better", "Critique") == " <Result>Critique 1 is better than Critique 2</Result>"
    )
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "hi", "answer": "1"}) + "\n")
    plain = PromptDataModule("builtin:tiny-llama", train=FilePrompts(str(questions)),
                             response_prefix="<{subject}>")  # fmt: skip
    with pytest.raises(ValueError, match="no subject column"):
        plain.setup("fit")
