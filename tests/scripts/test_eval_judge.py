"""scripts/eval_judge.py on the judge benchmarks: the benchmark specs, the wiring from judged
rows to scores (a stand-in trainer with known verdicts), and an end-to-end run of the tiny judge
on every offline benchmark sample."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.launch import run_python
from tests.helpers import load_script

SAMPLES = "lit_rlhf/data/samples"
SPECS = [
    f"rewardbench={SAMPLES}/rewardbench_synthetic.jsonl",
    f"rm_bench={SAMPLES}/rm_bench_synthetic.jsonl",
    f"rmb={SAMPLES}/rmb_pairwise_synthetic.jsonl,{SAMPLES}/rmb_bon_synthetic.jsonl",
    f"judgebench={SAMPLES}/judgebench_synthetic.jsonl",
    f"ppe_preference={SAMPLES}/ppe_preference_synthetic.jsonl",
]


def test_benchmark_specs_name_hub_ids_local_files_and_splits() -> None:
    script = load_script("eval_judge")
    name, bench, paths = script.parse_benchmark("judgebench@claude")
    assert (name, bench.split, paths) == ("judgebench", "claude", ["ScalerLab/JudgeBench"])
    name, bench, paths = script.parse_benchmark("rm_bench")
    assert (bench.schema, bench.split, paths) == ("rm_bench", "train", ["THU-KEG/RM-Bench"])
    assert script.parse_benchmark("rmb=a.json,b.json")[2] == ["a.json", "b.json"]
    with pytest.raises(SystemExit, match=r"RMB has no hub copy\. Fix: rmb=PATH"):
        script.parse_benchmark("rmb")
    with pytest.raises(SystemExit, match=r"unknown benchmark 'rm-bench'\. Fix: one of"):
        script.parse_benchmark("rm-bench")


class KnownVerdicts:
    """Stands in for the trainer's predict: the gold verdict on rows in their first order, the
    wrong one on swapped rows; ``skip`` rows get no prediction (as a prompt too long to judge)."""

    def __init__(self, skip: str) -> None:
        self.skip = skip

    def predict(self, module: Any, datamodule: Any) -> list[list[dict[str, Any]]]:
        datamodule.setup("predict")
        out = []
        for batch in datamodule.predict_dataloader():
            out.append(
                [
                    {"query_id": row["query_id"], "votes": [v, None], "verdict": v}
                    for row in batch["row"]
                    if row["query_id"] != self.skip
                    for v in [-row["label"] if row["swapped"] else row["label"]]
                ]
            )
        return out


def _opts(**changes: Any) -> argparse.Namespace:
    opts = argparse.Namespace(
        synthetic=None,
        template="consistrm-v1-short",
        seed=0,
        limit=None,
        skip_malformed=False,
        batch_size=4,
        max_prompt_length=2048,
        chat_template_kwargs=None,
        question_suffix="",
    )
    vars(opts).update(changes)
    return opts


def judge_sample(script: Any, spec: str, skip: str = "") -> dict[str, Any]:
    opts = _opts()
    _, bench, paths = script.parse_benchmark(spec)
    rows = script.load_pairs(opts, bench, paths)
    trainer = KnownVerdicts(skip)
    return script.report(bench, script.evaluate(trainer, None, "builtin:tiny-llama", rows, opts))


class SeenPrompts(KnownVerdicts):
    """Records the data module and the first rendered prompt the judge would see."""

    def predict(self, module: Any, datamodule: Any) -> list[list[dict[str, Any]]]:
        self.data = datamodule
        out = super().predict(module, datamodule)
        batch = next(iter(datamodule.predict_dataloader()))
        self.prompt = datamodule.tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True)
        return out


def test_the_thinking_switches_reach_the_judge_prompts() -> None:
    script = load_script("eval_judge")
    argv = ["--model", "m", "--synthetic", "4", "--question-suffix", " /no_think"]
    parsed = script.parse_args([*argv, "--chat-template-kwargs", '{"enable_thinking": false}'])
    assert parsed.chat_template_kwargs == {"enable_thinking": False}
    for bad in ("{enable_thinking: false}", "[1]"):
        with pytest.raises(SystemExit):
            script.parse_args([*argv, "--chat-template-kwargs", bad])
    _, bench, paths = script.parse_benchmark(SPECS[3])
    opts = _opts(chat_template_kwargs=parsed.chat_template_kwargs, question_suffix=" /no_think")
    rows = script.load_pairs(opts, bench, paths)
    seen = SeenPrompts("")
    script.evaluate(seen, None, "builtin:tiny-llama", rows, opts)
    assert seen.data.chat_template_kwargs == {"enable_thinking": False}
    assert seen.prompt.rstrip().endswith("/no_think"), seen.prompt[-200:]
    plain = SeenPrompts("")
    script.evaluate(plain, None, "builtin:tiny-llama", rows, _opts())
    assert "/no_think" not in plain.prompt and not plain.data.chat_template_kwargs


def test_scores_come_from_the_judged_rows_in_both_orders() -> None:
    script = load_script("eval_judge")
    rm_bench = judge_sample(script, SPECS[1], skip="chat-1/c0r0")
    # every comparison right in its first order only; chat-1/c0r0 unjudged (wrong in both)
    assert (rm_bench["rows"], rm_bench["rows_judged"]) == (54, 53)
    assert rm_bench["accuracy"] == pytest.approx(26 / 54)
    assert rm_bench["positional_consistency"] == 0.0
    # chat's normal cell c0r0 scores 0 instead of 0.5: normal (0 + 0.5 + 0.5) / 3
    assert rm_bench["scores"]["chat"] == pytest.approx((0.5 + 1 / 3 + 0.5) / 3)
    assert rm_bench["scores"]["math"] == pytest.approx(0.5)
    assert rm_bench["format_valid"] == pytest.approx(0.5)  # one vote of two parsed
    assert rm_bench["tie_rate"] == pytest.approx(1 / 54)
    judgebench = judge_sample(script, SPECS[3])
    assert judgebench["score"] == 0.0  # each pair right once, wrong once: two-game sum 0
    assert judgebench["accuracy"] == pytest.approx(0.5)
    rmb = judge_sample(script, SPECS[2])
    assert rmb["rows"] == 2 * (2 + 5)  # 2 pairwise rows, 3 + 2 Best-of-N comparisons
    assert rmb["scores"]["helpfulness-bon"] == pytest.approx(0.5)


def test_the_tiny_judge_on_every_benchmark_sample_end_to_end(tmp_path: Path) -> None:
    out = run_python(
        "scripts/eval_judge.py",
        "--model",
        "builtin:tiny-llama",
        "--template",
        "consistrm-v1-short",
        "--max-new-tokens",
        "8",
        "--limit",
        "2",
        "--benchmarks",
        *SPECS,
        "--json",
        str(tmp_path / "judge.json"),
        "--markdown",
        str(tmp_path / "judge.md"),
    )
    assert "| metric | RewardBench | RM-Bench | RMB | JudgeBench | PPE-Preference |" in out
    for name in ("score", "accuracy", "positional_consistency", "format_valid", "tie_rate"):
        assert f"| {name} |" in out
    # --limit 2 pairs, each in both orders; benchmark rows stay whole (RM-Bench: 9 comparisons,
    # the first RMB Best-of-N row: 3)
    assert "| rows_judged | 4/4 | 18/18 | 10/10 | 4/4 | 4/4 |" in out
    tables = (tmp_path / "judge.md").read_text()
    assert "| RM-Bench | hard |" in tables and "| JudgeBench | knowledge |" in tables
    assert tables.strip() in out
    report = json.loads((tmp_path / "judge.json").read_text())
    assert set(report["averages"]) == {"ConsistRM", "ReflectRM", "mean"}
    scores = [report["benchmarks"][name]["score"] for name in ("rewardbench", "rm_bench", "rmb")]
    scores.append(report["benchmarks"]["ppe_preference"]["score"])
    assert report["averages"]["ReflectRM"] == pytest.approx(sum(scores) / 4)
    assert set(report["benchmarks"]["rmb"]["scores"]) == {
        "helpfulness-pairwise",
        "harmlessness-pairwise",
        "helpfulness-bon",
    }
