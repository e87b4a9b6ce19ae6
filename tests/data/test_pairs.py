"""Preference-pair sources: schema adapters, seeded placement, order swaps, row errors, judge
templates, synthetic verifiable pairs, and batches through PromptDataModule."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import datasets
import pytest

from lit_rlhf.data import (
    JUDGE_TEMPLATES,
    PreferencePairs,
    PromptDataModule,
    SyntheticPairs,
    render_judge_prompt,
    render_reflection_prompt,
)
from lit_rlhf.rewards.countdown import evaluate_expression, extract_answer

HH_ROWS = [
    {
        "chosen": "\n\nHuman: How do I boil an egg?\n\nAssistant: Simmer it for 9 minutes.",
        "rejected": "\n\nHuman: How do I boil an egg?\n\nAssistant: No idea.",
    },
    {
        "chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a colour.\n\nAssistant: Blue.",
        "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Name a colour.\n\nAssistant: 7",
    },
    {
        "chosen": "\n\nHuman: What is 2 + 2?\n\nAssistant: 4",
        "rejected": "\n\nHuman: What is 2 + 2?\n\nAssistant: 5",
    },
]
REWARDBENCH_ROWS = [
    {
        "prompt": f"Q {i}?",
        "chosen": f"Good {i}.",
        "rejected": f"Bad {i}.",
        "subset": "math-prm",
        "id": 100 + i,
    }
    for i in range(3)
]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def chosen_of(row: dict) -> str:
    """The better response of a labelled row (-1: response 1, +1: response 2)."""
    return row["response_1"] if row["label"] == -1 else row["response_2"]


def test_templates_render_the_pair_and_the_result_sentences() -> None:
    assert {"consistrm-v1", "consistrm-v1-short"} <= set(JUDGE_TEMPLATES)
    for name in [n for n, t in JUDGE_TEMPLATES.items() if t.subject == "Response"]:
        text = render_judge_prompt(name, prompt="QQ{x}?", response_1="AA {1}", response_2="BB-2")
        assert text.index("QQ{x}?") < text.index("AA {1}") < text.index("BB-2")  # braces kept
        assert "Response 1 is better than Response 2" in text
        # the two verdicts; verdict-short-v1 words the second "Response 1 is worse than ..."
        other = "Response 1 is worse than" if name == "verdict-short-v1" else "Response 2 is better"
        assert other in text
        # verdict-only templates ask for the result tag alone
        tags = {
            "verdict": ("Result",),
            "reflectrm": ("Analysis", "Result"),
            "analysis": ("Analysis", "Result"),  # analysis-short-v1: a checkable analysis first
        }.get(name.split("-")[0], ("Criterion", "Analysis", "Result"))
        assert all(f"<{tag}>" in text for tag in tags)
    full = render_judge_prompt("consistrm-v1", prompt="P", response_1="R1", response_2="R2")
    assert "[Response 1]\nR1\n[End of Response 1]" in full
    with pytest.raises(ValueError, match=r"unknown judge template 'v9'.*consistrm-v1-short"):
        render_judge_prompt("v9", prompt="P", response_1="a", response_2="b")


def test_reflection_template_renders_two_critiques_and_is_kept_apart() -> None:
    text = render_reflection_prompt(
        "reflectrm-critique-v1",
        prompt="Q?",
        response_1="R1",
        response_2="R2",
        critique_1="C {a}",
        critique_2="C2",
    )
    assert text.index("Q?") < text.index("R1") < text.index("R2") < text.index("C {a}")
    assert text.index("C {a}") < text.index("C2")
    assert "Critique 1 is better than Critique 2" in text and "<Analysis>" in text
    with pytest.raises(ValueError, match="render it with render_reflection_prompt"):
        render_judge_prompt("reflectrm-critique-v1", prompt="Q", response_1="a", response_2="b")
    with pytest.raises(ValueError, match="compares responses, not critiques"):
        render_reflection_prompt(
            "reflectrm-v1", prompt="Q", response_1="a", response_2="b", critique_1="", critique_2=""
        )
    with pytest.raises(ValueError, match="compares critiques, and a pair source"):
        SyntheticPairs(template="reflectrm-critique-v1")


def test_pairs_schema_labels_subsets_and_ids(tmp_path: Path) -> None:
    rows = [
        {"prompt": "P0", "response_1": "a", "response_2": "b", "label": -1, "id": "x7"},
        {"prompt": "P1", "response_1": "c", "response_2": "d", "label": 1, "subset": "s"},
        {"prompt": "P2", "response_1": "e", "response_2": "f", "label": None},
    ]
    data = PreferencePairs(write_jsonl(tmp_path / "p.jsonl", rows)).load()
    assert data["label"] == [-1, 1, None]
    assert data["response_2"] == ["b", "d", "f"] and data["subset"] == ["", "s", ""]
    assert data["query_id"][0] == "x7" and data["query_id"][1].startswith("judge-")
    assert data["family_id"] == data["query_id"] and data["swapped"] == [False] * 3
    assert set(data["task"]) == {"judge"} and set(data["template"]) == {"consistrm-v1"}
    assert "P1" in data["question"][1] and "[Response 2]\nd\n" in data["question"][1]
    # ids are stable across loads; id_field overrides the schema's id
    assert PreferencePairs(str(tmp_path / "p.jsonl")).load()["query_id"] == data["query_id"]
    by_prompt = PreferencePairs(str(tmp_path / "p.jsonl"), id_field="prompt").load()
    assert by_prompt["query_id"] == ["P0", "P1", "P2"]


def test_pairs_from_csv_and_parquet(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    csv.write_text("prompt,response_1,response_2,label\nP0,a,b,-1\nP1,c,d,\nP2,e,f,1\n")
    assert PreferencePairs(str(csv)).load()["label"] == [-1, None, 1]  # empty cell: unlabelled
    rows = [{"prompt": "P", "response_1": "a", "response_2": "b", "label": 1}]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "p.parquet"))
    assert PreferencePairs(str(tmp_path / "p.parquet")).load()["label"] == [1]


def helpsteer3_rows() -> list[dict]:
    def turn(role: str, content: str) -> dict:
        return {"role": role, "content": content}

    chat = [turn("user", "Hi"), turn("assistant", "Hello!"), turn("user", "Name a fruit.")]
    return [
        {
            "domain": "general",
            "context": chat,
            "response1": "Apple.",
            "response2": "Car.",
            "overall_preference": -2,
        },
        {
            "domain": "code",
            "context": [turn("user", "Print 1 in Python.")],
            "response1": "echo 1",
            "response2": "print(1)",
            "overall_preference": 3,
        },
        {
            "domain": "stem",
            "context": [turn("user", "2 + 2?")],
            "response1": "4",
            "response2": "four",
            "overall_preference": 0,
        },
    ]


def test_helpsteer3_context_preference_and_ties(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "hs3.jsonl", helpsteer3_rows())
    with pytest.warns(UserWarning, match="dropped 1 tied pairs"):
        data = PreferencePairs(path, schema="helpsteer3").load()
    chat = "User: Hi\n\nAssistant: Hello!\n\nUser: Name a fruit."
    assert data["query"] == [chat, "Print 1 in Python."]
    assert data["label"] == [-1, 1] and data["subset"] == ["general", "code"]
    assert data["response_1"] == ["Apple.", "echo 1"]
    kept = PreferencePairs(path, schema="helpsteer3", keep_ties=True).load()
    assert kept["label"] == [-1, 1, None] and kept["query"][2] == "2 + 2?"
    assert len(PreferencePairs(path, schema="helpsteer3", num_examples=1).load()) == 1


def test_hh_rlhf_splits_prompt_and_final_turns(tmp_path: Path) -> None:
    data = PreferencePairs(write_jsonl(tmp_path / "hh.jsonl", HH_ROWS), schema="hh_rlhf").load()
    assert data["query"][0] == "Human: How do I boil an egg?"
    assert data["query"][1] == "Human: Hi\n\nAssistant: Hello!\n\nHuman: Name a colour."
    assert [chosen_of(row) for row in data] == ["Simmer it for 9 minutes.", "Blue.", "4"]
    assert {data[1]["response_1"], data[1]["response_2"]} == {"Blue.", "7"}


def test_ultrafeedback_message_lists(tmp_path: Path) -> None:
    def chat(i: int, reply: str) -> list[dict]:
        return [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": reply}]

    rows = [
        {
            "prompt_id": f"u{i}",
            "prompt": f"Q{i}",
            "chosen": chat(i, f"good{i}"),
            "rejected": chat(i, f"bad{i}"),
        }
        for i in range(3)
    ]
    data = PreferencePairs(write_jsonl(tmp_path / "uf.jsonl", rows), schema="ultrafeedback").load()
    assert data["query_id"] == ["u0", "u1", "u2"] and data["query"] == ["Q0", "Q1", "Q2"]
    assert [chosen_of(row) for row in data] == ["good0", "good1", "good2"]


def test_rewardbench_and_balanced_seeded_placement(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rb.jsonl", REWARDBENCH_ROWS)
    data = PreferencePairs(path, schema="rewardbench").load()
    assert data["query_id"] == ["100", "101", "102"] and set(data["subset"]) == {"math-prm"}
    assert [chosen_of(row) for row in data] == ["Good 0.", "Good 1.", "Good 2."]
    rows = [{**REWARDBENCH_ROWS[0], "prompt": f"Q{i}", "id": i} for i in range(60)]
    path = write_jsonl(tmp_path / "many.jsonl", rows)
    labels = PreferencePairs(path, schema="rewardbench").load()["label"]
    assert 15 <= labels.count(-1) <= 45  # a fair coin: 30 +- 15 (about 4 standard deviations)
    assert PreferencePairs(path, schema="rewardbench").load()["label"] == labels
    assert PreferencePairs(path, schema="rewardbench", seed=1).load()["label"] != labels
    # the coin follows the pair id, not the position: a slice keeps each pair's placement
    part = PreferencePairs(path, schema="rewardbench", split="train[10:20]").load()
    assert part["label"] == labels[10:20]


def test_swap_both_and_random(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": f"P{i}",
            "response_1": f"first {i}",
            "response_2": f"second {i}",
            "label": 1 - 2 * (i % 2),
        }
        for i in range(40)
    ]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    plain = PreferencePairs(path).load()
    both = PreferencePairs(path, swap="both").load()
    assert len(both) == 80
    for i in range(40):
        kept, swapped = both[2 * i], both[2 * i + 1]
        assert kept["query_id"] == plain[i]["query_id"] == kept["family_id"] == swapped["family_id"]
        assert swapped["query_id"] == kept["query_id"] + "#swap" and swapped["swapped"]
        assert swapped["label"] == -kept["label"] and not kept["swapped"]
        assert swapped["response_1"] == kept["response_2"] == f"second {i}"
        assert swapped["response_2"] == kept["response_1"] == f"first {i}"
        question = swapped["question"]
        assert question.index(f"second {i}") < question.index(f"first {i}")
    flipped = PreferencePairs(path, swap="random").load()
    assert len(flipped) == 40 and 8 <= sum(flipped["swapped"]) <= 32  # fair coin: 20 +- 12
    for row, original in zip(flipped, plain, strict=True):
        assert row["label"] == (-original["label"] if row["swapped"] else original["label"])
        assert row["query_id"] == original["query_id"] + ("#swap" if row["swapped"] else "")
    assert PreferencePairs(path, swap="random").load()["swapped"] == flipped["swapped"]


GOOD_PAIRS = [
    {"prompt": f"P{i}", "response_1": "a", "response_2": "b", "label": -1} for i in (0, 1)
]
GOOD_UF = [
    {
        "prompt": f"Q{i}",
        "chosen": [{"role": "assistant", "content": "a"}],
        "rejected": [{"role": "assistant", "content": "b"}],
    }
    for i in (0, 1)
]
HS3 = helpsteer3_rows()
RB = REWARDBENCH_ROWS
MALFORMED = [  # schema, good rows, bad row, the field named, the message
    ("pairs", GOOD_PAIRS, {"response_1": "a", "response_2": "b"}, "prompt", "missing/None"),
    ("pairs", GOOD_PAIRS, {**GOOD_PAIRS[0], "prompt": "  "}, "prompt", "non-empty string"),
    ("pairs", GOOD_PAIRS, {**GOOD_PAIRS[0], "label": 2}, "label", r"must be -1 \(response 1"),
    ("pairs", GOOD_PAIRS, {**GOOD_PAIRS[0], "response_2": "a"}, "response_2", "identical"),
    ("rewardbench", RB[:2], {**RB[2], "rejected": RB[2]["chosen"]}, "rejected", "identical"),
    ("hh_rlhf", HH_ROWS[:2], {"chosen": "no turns", "rejected": "x"}, "chosen", "transcript"),
    (
        "hh_rlhf",
        HH_ROWS[:2],
        {**HH_ROWS[0], "rejected": HH_ROWS[1]["rejected"]},
        "rejected",
        "does not share",
    ),
    ("helpsteer3", HS3[:2], {**HS3[0], "overall_preference": 5}, "overall_preference", "-3..3"),
    (
        "helpsteer3",
        HS3[:2],
        {**HS3[1], "context": [{"role": "user", "content": ""}]},
        "context",
        "non-empty",
    ),
    (
        "ultrafeedback",
        GOOD_UF,
        {**GOOD_UF[0], "chosen": [{"role": "user", "content": "a"}]},
        "chosen",
        "ending in the assistant",
    ),
]


@pytest.mark.parametrize(("schema", "good", "bad", "field", "message"), MALFORMED)
def test_malformed_row_names_file_row_and_field(
    tmp_path: Path, schema: str, good: list[dict], bad: dict, field: str, message: str
) -> None:
    path = write_jsonl(tmp_path / "broken.jsonl", [*good, bad])
    with pytest.raises(ValueError, match=message) as err:
        PreferencePairs(path, schema=schema).load()
    text = str(err.value)
    assert "broken.jsonl" in text and "row 2" in text and repr(field) in text and "Fix:" in text
    with pytest.warns(UserWarning, match="skipped 1 malformed rows"):
        assert len(PreferencePairs(path, schema=schema, skip_malformed=True).load()) == 2


def test_wrong_columns_and_bad_arguments(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rb.jsonl", REWARDBENCH_ROWS)
    with pytest.raises(ValueError, match=r"rb\.jsonl: row 0 has no field 'response_1'.*schema="):
        PreferencePairs(path, schema="pairs").load()
    with pytest.raises(ValueError, match=r"row 0 has no field 'uid'.*id_field="):
        PreferencePairs(path, schema="rewardbench", id_field="uid").load()
    with pytest.raises(ValueError, match=r"unknown judge template 'nope'.*consistrm-v1"):
        PreferencePairs(path, template="nope")
    with pytest.raises(ValueError, match=r"unknown schema 'hh'.*hh_rlhf"):
        PreferencePairs(path, schema="hh")
    with pytest.raises(ValueError, match="swap must be one of"):
        SyntheticPairs(swap="always")
    with pytest.raises(ValueError, match="num_examples"):
        PreferencePairs(path, num_examples=0)
    repeated = write_jsonl(tmp_path / "rep.jsonl", [RB[0], {**RB[1], "id": 100}])
    with pytest.warns(UserWarning, match="1 pairs repeat an earlier pair id"):
        PreferencePairs(repeated, schema="rewardbench").load()


def arithmetic_value(question: str) -> int:
    match = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", question)
    assert match is not None
    a, op, b = match.groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def stated_answer(response: str) -> int:
    return int(re.findall(r"The answer is (-?\d+)\.", response)[-1])


def test_synthetic_arithmetic_is_seeded_balanced_and_verifiable() -> None:
    data = SyntheticPairs(num_examples=200, seed=3).load()
    assert data.to_list() == SyntheticPairs(num_examples=200, seed=3).load().to_list()
    assert data["query"] != SyntheticPairs(num_examples=200, seed=4).load()["query"]
    assert 70 <= data["label"].count(-1) <= 130  # fair coin: 100 +- 30 (about 4 sd)
    assert set(data["subset"]) == {"arithmetic"} and set(data["template"]) == {"consistrm-v1-short"}
    for row in data:
        worse = row["response_2"] if row["label"] == -1 else row["response_1"]
        value = arithmetic_value(row["query"])
        assert stated_answer(chosen_of(row)) == value
        assert 1 <= abs(stated_answer(worse) - value) <= 3
        assert abs(len(worse) - len(chosen_of(row))) <= 2  # no length cue without a distractor


def test_synthetic_length_distractor_pads_the_wrong_response() -> None:
    data = SyntheticPairs(num_examples=50, distractor="length", swap="both").load()
    assert len(data) == 100 and set(data["subset"]) == {"arithmetic+length"}
    for row in data:
        worse = row["response_2"] if row["label"] == -1 else row["response_1"]
        assert len(worse) > 2 * len(chosen_of(row))
        value = arithmetic_value(row["query"])
        assert stated_answer(chosen_of(row)) == value != stated_answer(worse)


@pytest.mark.parametrize("distractor", ["none", "length"])
def test_synthetic_countdown_solution_against_a_miss(distractor: str) -> None:
    source = SyntheticPairs(num_examples=40, seed=1, task_kind="countdown", distractor=distractor)
    data = source.load()
    assert 8 <= data["label"].count(-1) <= 32
    for row in data:
        task = re.search(r"numbers \[([\d, ]+)\], create .* equals (\d+)", row["query"])
        assert task is not None
        numbers, target = sorted(int(n) for n in task[1].split(",")), int(task[2])
        worse = row["response_2"] if row["label"] == -1 else row["response_1"]
        for response, hits in ((chosen_of(row), True), (worse, False)):
            value, used = evaluate_expression(extract_answer(response) or "")
            assert sorted(used) == numbers and (value == target) is hits
        assert (len(worse) > len(chosen_of(row)) + 100) is (distractor == "length")


def test_synthetic_copy_repeats_the_word_and_renders_the_short_template() -> None:
    data = SyntheticPairs(num_examples=60, seed=2, task_kind="copy", template="verdict-short-v1")
    rows = data.load()
    assert 15 <= rows["label"].count(-1) <= 45 and set(rows["subset"]) == {"copy"}
    for row in rows:
        word = re.fullmatch(r"Repeat the word (\w+)\.", row["query"])
        assert word is not None
        worse = row["response_2"] if row["label"] == -1 else row["response_1"]
        assert chosen_of(row) == word[1] != worse and worse.isalpha()
        assert row["question"].startswith(f"Question: {row['query']}\nResponse 1: ")
        assert row["question"].endswith("Judgment:")
        assert "Response 1 is worse than" in row["question"]
    with pytest.raises(ValueError, match="task_kind must be 'arithmetic', 'copy' or"):
        SyntheticPairs(task_kind="echo")  # type: ignore[arg-type]


def test_prompt_data_module_batches_carry_pair_fields() -> None:
    source = SyntheticPairs(num_examples=6, swap="both")
    module = PromptDataModule(
        "builtin:tiny-llama", source, batch_size=4, max_prompt_length=4096, shuffle=False
    )
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["task"] == ["judge"] * 4 and batch["input_ids"].shape[0] == 4
    assert batch["query_id"][1] == batch["query_id"][0] + "#swap"
    for row in batch["row"]:
        assert row["label"] in (-1, 1)
        assert {"label", "response_1", "response_2", "family_id", "swapped", "subset"} <= set(row)
        assert row["response_1"] in row["prompt"] and row["response_2"] in row["prompt"]
    assert Counter(r["family_id"] for r in batch["row"]) == Counter(
        {batch["row"][0]["family_id"]: 2, batch["row"][2]["family_id"]: 2}
    )
