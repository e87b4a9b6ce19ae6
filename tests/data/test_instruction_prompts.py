"""Instruction-following training prompts (the MGS instruction domain) are disjoint from the
IFEval evaluation prompts: the seeded offline generator by construction, the hub source (in the
MGS authors' data schema) by dropping every row that contains an evaluation prompt."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("if_verifiable", reason="needs the [ifeval] extra")

from lit_rlhf.data import FilePrompts
from lit_rlhf.data.instructions import (
    OFFLINE_INSTRUCTIONS,
    EvaluationPrompts,
    GeneratedInstructionPrompts,
    InstructionPrompts,
    _conflicts,
)
from lit_rlhf.rewards import InstructionReward

SAMPLE = "lit_rlhf/data/samples/ifeval_prompts.jsonl"  # the shipped IFEval-format eval sample


def _ifeval_sample() -> FilePrompts:
    return FilePrompts(SAMPLE, question_field="prompt", answer_field=None, id_field="key",
                       task="ifeval")  # fmt: skip


def test_no_ifeval_evaluation_prompt_is_in_the_generated_training_prompts() -> None:
    held_out = EvaluationPrompts([_ifeval_sample()])
    assert len(held_out) == 24
    generated = GeneratedInstructionPrompts(num_examples=3000, seed=0).load()
    assert not [q for q in generated["prompt"] if held_out.contains_one(q)]
    train = {" ".join(q.lower().split()) for q in generated["prompt"]}
    assert not train & held_out.prompts
    # the same check at load time drops nothing and warns about nothing
    with_exclude = GeneratedInstructionPrompts(num_examples=300, seed=0, exclude=[_ifeval_sample()])
    assert with_exclude.load()["prompt"] == generated["prompt"][:300]


def test_containment_catches_equal_and_embedded_prompts_only() -> None:
    held_out = EvaluationPrompts([_ifeval_sample()])
    prompt = json.loads(Path(SAMPLE).read_text().splitlines()[1])["prompt"]
    assert held_out.contains_one(prompt)
    assert held_out.contains_one("  " + prompt.upper().replace(" ", "\n  "))  # case, whitespace
    assert held_out.contains_one("List three colours.\n\n" + prompt + " Thanks.")  # embedded
    assert not held_out.contains_one(prompt[: len(prompt) // 2])  # a part is not the prompt
    assert not held_out.contains_one("Describe your favourite season.")


def test_the_generator_is_seeded_unique_and_draws_only_offline_checks() -> None:
    random.seed(1)
    a = GeneratedInstructionPrompts(num_examples=500, seed=7).load()
    random.seed(2)  # the global random state (IFEval's own draws use it) changes nothing
    b = GeneratedInstructionPrompts(num_examples=500, seed=7).load()
    assert a["question"] == b["question"] and a["kwargs"] == b["kwargs"]
    assert a["question"] != GeneratedInstructionPrompts(num_examples=500, seed=8).load()["question"]
    assert len(set(a["query_id"])) == 500 and set(a["task"]) == {"ifeval"}
    conflicts = _conflicts()
    for ids in a["instruction_id_list"]:
        assert 1 <= len(ids) <= 3 and set(ids) <= set(OFFLINE_INSTRUCTIONS)
        assert not any(j in conflicts[i] for i in ids for j in ids if i != j)
    unchecked = {"length_constraints:number_sentences", "change_case:capital_word_frequency"}
    assert not unchecked & set(OFFLINE_INSTRUCTIONS)
    # every drawn instruction is checked offline, without a fallback
    out = InstructionReward()(list(a["question"]), ["A plain answer."] * 500, list(a))
    assert out.info["fallback"].sum() == 0


def test_generated_arguments_are_the_ones_the_checker_applies() -> None:
    rows = GeneratedInstructionPrompts(
        num_examples=20, seed=0, instructions=["length_constraints:number_words"]
    ).load()
    reward = InstructionReward()
    for row in rows:
        (kwargs,) = row["kwargs"]
        n, relation = kwargs["num_words"], kwargs["relation"]
        assert f"{relation} {n} words" in row["question"]
        fits = " ".join(["word"] * (n if relation == "at least" else n - 1))
        breaks = " ".join(["word"] * (n - 1 if relation == "at least" else n))
        scores = reward([row["question"]] * 2, [fits, breaks], [row, row]).scores
        assert scores.tolist() == [1.0, 0.0]


def test_bad_generator_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="checked offline"):
        GeneratedInstructionPrompts(instructions=["length_constraints:number_sentences"])
    with pytest.raises(ValueError, match="min_instructions"):
        GeneratedInstructionPrompts(min_instructions=3, max_instructions=2)
    with pytest.raises(ValueError, match="distinct prompts"):
        GeneratedInstructionPrompts(num_examples=10_000, instructions=["detectable_format:title"],
                                    max_instructions=1).load()  # fmt: skip


def _nemotron_row(prompt: str, ids: list[str], kwargs: list[dict]) -> dict:
    """One row in the schema of nvidia/Llama-Nemotron-Post-Training-Dataset, RL split."""
    return {"input": [{"role": "user", "content": prompt}],
            "args": {"instruction_id_list": ids, "instruction_kwargs": kwargs,
                     "task": "instruction_following"},
            "category": "instruction_following",
            "system_prompt": "detailed thinking off"}  # fmt: skip


def test_the_hub_source_drops_evaluation_prompts_and_unknown_instructions(tmp_path: Path) -> None:
    eval_prompt = json.loads(Path(SAMPLE).read_text().splitlines()[0])["prompt"]
    full = {"num_words": 30, "relation": "at least", "num_bullets": None, "keywords": None}
    rows = [
        _nemotron_row("Explain tides. Answer with at least 30 words.",
                      ["length_constraints:number_words"], [full]),
        _nemotron_row(eval_prompt, ["punctuation:no_comma"], [{}]),
        _nemotron_row("Name a fruit.\n\n" + eval_prompt, ["punctuation:no_comma"], [{}]),
        _nemotron_row("Do a thing.", ["made_up:instruction"], [{}]),
    ]  # fmt: skip
    path = tmp_path / "nemotron_if.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = InstructionPrompts(str(path), name=None, split="train", exclude=[_ifeval_sample()],
                                question_template="User: <query>{question}</query>\n")  # fmt: skip
    with pytest.warns(UserWarning) as caught:
        (row,) = source.load()
    messages = " ".join(str(w.message) for w in caught)
    assert "dropped 1 rows with instructions the checker does not know" in messages
    assert "dropped 2 of 3 training prompts that contain an evaluation prompt" in messages
    assert row["prompt"] == "Explain tides. Answer with at least 30 words."
    assert row["question"] == "User: <query>Explain tides. Answer with at least 30 words.</query>\n"
    assert row["instruction_id_list"] == ["length_constraints:number_words"]
    assert row["kwargs"] == [{"num_words": 30, "relation": "at least"}]  # None values dropped
    assert InstructionReward()([""], [" ".join(["w"] * 30)], [row]).scores.tolist() == [1.0]


def test_the_hub_source_refuses_rows_it_cannot_read(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_nemotron_row("Hi.", [], [])) + "\n")
    with pytest.raises(ValueError, match="needs a non-empty instruction_id_list"):
        InstructionPrompts(str(path), name=None, split="train").load()
    with pytest.raises(ValueError, match="no column 'messages'"):
        InstructionPrompts(str(path), name=None, split="train", messages_field="messages").load()


def test_the_mgs_presets_never_train_on_their_evaluation_prompts() -> None:
    import yaml

    from lit_rlhf.cli import cli_main

    # the CPU preset, built as the CLI builds it: its IFEval rows are validation only
    cli = cli_main(["--config", "configs/ppo/multidomain_tiny.yaml"], run=False)
    data = cli.datamodule
    data.setup("fit")
    train_if = [r["question"] for r in data.train_data if r["task"] == "ifeval"]
    held_out = EvaluationPrompts([data.val_source])
    assert len(train_if) >= 8 and len(held_out) == 6
    assert "ifeval" in set(data.val_data["task"])
    assert not [q for q in train_if if held_out.contains_one(q)]
    # the GPU preset (hub data, not loaded here): IFEval is excluded from training and held out
    config = yaml.safe_load(Path("configs/ppo/multidomain_mgs_qwen2.5-7b.yaml").read_text())
    data_args = config["data"]["init_args"]
    train = data_args["train"]["init_args"]["sources"]
    val_paths = [s["init_args"]["path"] for s in data_args["val"]["init_args"]["sources"]]
    assert "google/IFEval" in val_paths
    assert not {s["init_args"].get("path") for s in train} & set(val_paths)
    (instruction,) = [s for s in train if s["class_path"].endswith(".InstructionPrompts")]
    excluded = [e["init_args"]["path"] for e in instruction["init_args"]["exclude"]]
    assert excluded == ["google/IFEval"]
