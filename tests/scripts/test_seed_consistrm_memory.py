"""scripts/data/seed_consistrm_memory.py: the starting judge's votes per training query become the
memory seed ConsistencyAnswerReward reads (the ConsistRM authors: 8 votes per query)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from lit_rlhf.callbacks import ConsistencyAnswerReward
from lit_rlhf.callbacks.consistency import read_memory
from lit_rlhf.data import SyntheticPairs
from tests.helpers import load_script

HEAD = "<Criterion>c</Criterion><Analysis>a</Analysis>"
R1 = HEAD + "<Result>Response 1 is better than Response 2</Result>"
R2 = HEAD + "<Result>Response 2 is better than Response 1</Result>"
CONFIG = Path("configs/grm/consistrm_tiny.yaml")


def test_memory_rows_keep_the_readable_votes_in_order():
    script = load_script("data/seed_consistrm_memory")
    rows = script.memory_rows(
        ["a", "b", "a", "c"], [[1, None, -1, 1], [None, None], [-1, -1], [-1, 1, 1]]
    )
    # "a" keeps its first votes; "b" had none readable: an empty seed (an empty memory)
    assert rows == [
        {"query_id": "a", "labels": [1, -1, 1]},
        {"query_id": "b", "labels": []},
        {"query_id": "c", "labels": [-1, 1, 1]},
    ]
    stats = script.seed_stats(rows, [[1, None, -1, 1], [None, None], [-1, 1, 1]], [1, -1, -1])
    # 6 of 9 votes readable; b empty; sums a: +1, b: 0 (tied), c: +1 -> majorities +1, 0, +1;
    # against gold +1, -1, -1: a right, c wrong (b, tied, not counted) -> 1 / 2
    assert stats["readable_fraction"] == pytest.approx(6 / 9)
    assert stats["empty_seed_fraction"] == pytest.approx(1 / 3)
    assert stats["tied_seed_fraction"] == pytest.approx(1 / 3)
    assert stats["seed_majority_accuracy"] == pytest.approx(0.5)


class ScriptedJudge:
    """An engine that writes, for every prompt, the sample texts R2, R2, <malformed>, R1 in turn."""

    temperature = 1.0
    texts = (R2, R2, "<Result>Response 2 is", R1)

    def generate(self, model, ids, mask, tokenizer, *, greedy, log_probs):
        assert not greedy  # sampled votes
        texts = [self.texts[i % len(self.texts)] for i in range(ids.shape[0])]
        encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(e) for e in encoded)
        pad = tokenizer.pad_token_id
        response = torch.tensor([e + [pad] * (width - len(e)) for e in encoded])
        return SimpleNamespace(response_ids=response)


def test_the_seed_holds_each_training_query_s_votes_and_the_fragment_points_to_it(tmp_path):
    script = load_script("data/seed_consistrm_memory")
    out, fragment = tmp_path / "seed.jsonl", tmp_path / "seed.yaml"
    argv = ["--config", str(CONFIG), "--out", str(out), "--fragment-out", str(fragment),
            "--samples", "4", "--num-examples", "3", "--batch-size", "2"]  # fmt: skip
    assert script.main(argv, engine=ScriptedJudge()) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # the config's training source (seed 0, its template): the query ids training will see
    train = yaml.safe_load(CONFIG.read_text())["data"]["init_args"]["train"]["init_args"]
    expected = SyntheticPairs(**{**train, "num_examples": 3}).load()["query_id"]
    assert [r["query_id"] for r in rows] == list(expected)
    # votes R2, R2, malformed, R1 -> labels +1, +1, -1 for every query
    assert all(r["labels"] == [1, 1, -1] for r in rows)
    # the fragment keeps the config's callbacks, ConsistencyAnswerReward seeded from the file
    callbacks = yaml.safe_load(fragment.read_text())["trainer"]["callbacks"]
    assert [c["class_path"] for c in callbacks] == [
        "lit_rlhf.callbacks.ConsistencyAnswerReward",
        "lit_rlhf.callbacks.CritiqueConsistencyReward",
        "lit_rlhf.callbacks.PeriodicCheckpoint",
    ]
    assert callbacks[0]["init_args"]["initial_memory"] == str(out)
    # and the callback reads it
    ConsistencyAnswerReward(initial_memory=str(out))
    assert read_memory(str(out), cap=20) == {r["query_id"]: [1, 1, -1] for r in rows}


def test_the_tiny_judge_end_to_end_and_a_config_without_the_callback_is_refused(tmp_path):
    script = load_script("data/seed_consistrm_memory")
    out = tmp_path / "seed.jsonl"
    argv = ["--config", str(CONFIG), "--out", str(out), "--samples", "2", "--num-examples", "2",
            "--max-new-tokens", "4"]  # fmt: skip
    assert script.main(argv) == 0  # the random tiny judge: real sampling, votes unreadable
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(r["labels"] == [] for r in rows)
    with pytest.raises(ValueError, match=r"no lit_rlhf\.callbacks\.ConsistencyAnswerReward"):
        script.main(["--config", "configs/grm/rft_tiny.yaml", "--out", str(out),
                     "--fragment-out", str(tmp_path / "f.yaml")])  # fmt: skip


def test_the_votes_are_read_in_the_config_s_judge_format():
    script = load_script("data/seed_consistrm_memory")
    config = yaml.safe_load(Path("configs/grm/rft_smollm2.yaml").read_text())
    fmt = script.judge_format(config["model"]["init_args"])
    assert (fmt.tags, fmt.subject) == (("Result",), "Response")
    assert (fmt.prefix, fmt.suffix) == (" <Result>Response 1 is", " than Response 2</Result>")
