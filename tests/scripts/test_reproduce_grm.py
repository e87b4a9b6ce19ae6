"""scripts/reproduce.py consistrm / reflectrm: the smoke presets end to end (tiny random model:
every arm and seed, the figures, the outputs, the cache on a second call) and the judge pieces
on hand-computed cases (pools, the checkable analysis, inference figures, seeded pseudo-labels).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import reproduce  # noqa: E402
from repro import consistrm, reflectrm  # noqa: E402
from repro import judge_common as jc  # noqa: E402

from lit_rlhf.algos.judge import JudgeFormat  # noqa: E402


def test_pools_are_disjoint_and_the_judgment_parses_to_the_gold_label() -> None:
    pools = jc.make_pools({"warm": 30, "unlabelled": 30, "eval": 30}, seed=0, max_value=10)
    seen = [{p.expr for p in pairs} for pairs in pools.values()]
    assert all(len(s) == 30 for s in seen) and not (seen[0] & seen[1] or seen[1] & seen[2])
    with pytest.raises(ValueError, match="raise max_value"):
        jc.make_pools({"a": 9}, seed=0, max_value=2)  # 2 x 2 x 2 = 8 questions
    pair = jc.ArithPair("p", 17, "+", 25, 44, right_first=True)
    assert jc.pair_record(pair)["response_2"] == "17 + 25 = 44" and pair.label == -1
    assert jc.analysis(pair) == (
        "Response 1 says 42. Response 2 says 44. 17 + 25 = 42, as Response 1 says."
    )
    assert jc.analysis(pair, swapped=True).endswith("= 42, as Response 2 says.")
    assert jc.analysis(pair, value=43).endswith("= 43, as neither says.")
    fmt = JudgeFormat(jc.TAGS)
    assert fmt.verdict(jc.judgment(pair)) == -1
    assert fmt.verdict(jc.judgment(pair, swapped=True)) == 1  # the right answer is now second
    rows = jc.warm_start_rows([pair] * 2, reflection_every=2, seed=0)
    assert len(rows) == 5  # 2 pairs x 2 orders + 1 reflection row
    reflection = [r for r in rows if "Critique 1:" in r["prompt"]]
    assert len(reflection) == 1
    verdict = fmt.verdict(reflection[0]["response"], "Critique")
    good_first = reflection[0]["prompt"].index("= 42, as") < reflection[0]["prompt"].index(
        "= 44, as"
    )
    assert verdict == (-1 if good_first else 1)


def test_both_papers_share_one_warm_judge_and_too_few_new_tokens_are_refused(
    tmp_path: Path, monkeypatch
) -> None:
    consist, reflect = consistrm.PRESETS["cpu"].settings, reflectrm.PRESETS["cpu"].settings
    root = tmp_path / "reproduce"
    shared = jc.warm_dir(root / "consistrm" / "cpu", consist)
    assert shared == jc.warm_dir(root / "reflectrm" / "cpu", reflect)
    assert shared.parent == root / "judge-warm"
    assert jc.warm_dir(root / "x" / "cpu", {**consist, "sft_steps": 1}) != shared
    monkeypatch.setattr(jc, "analysis", lambda pair, **kw: "changed")  # another format
    assert jc.warm_dir(root / "consistrm" / "cpu", consist) != shared  # another warm judge
    monkeypatch.undo()
    pair = jc.ArithPair("p", 17, "+", 25, 44, right_first=True)
    rows = jc.warm_start_rows([pair], reflection_every=0, seed=0)
    settings = {"model": "builtin:tiny-llama", "max_new_tokens": 6}
    with pytest.raises(ValueError, match=r"max_new_tokens=6 is below the longest target"):
        jc.check_new_tokens(rows, settings)
    longest = jc.check_new_tokens(rows, {**settings, "max_new_tokens": 512})
    assert 20 < longest <= 512  # the judgment is ~100 characters


def test_inference_figures_on_a_hand_computed_case() -> None:
    # pair a shown twice (label -1, then +1), pair b once (label +1); 4 votes each
    judged = [
        jc.Judged("a", -1, greedy=-1, votes=(-1, -1, 1, None), reflective=-1, anchor=2),
        jc.Judged("a", 1, greedy=-1, votes=(1, 1, 1, -1), reflective=1, anchor=0),
        jc.Judged("b", 1, greedy=None, votes=(-1, 1, None, None), reflective=-1, anchor=0),
    ]
    f = jc.inference_figures(judged)
    assert f["greedy_accuracy"] == pytest.approx(1 / 3)  # right only on the first row
    assert f["greedy_consistency"] == 0.0
    # majority: -1 right, +1 right, tie (0) wrong
    assert f["majority_accuracy"] == pytest.approx(2 / 3)
    assert f["majority_consistency"] == pytest.approx(0.5)  # a right in both orders, b not
    assert f["reflective_accuracy"] == pytest.approx(2 / 3)
    assert f["anchor_accuracy"] == pytest.approx(1 / 3)  # anchors say 1 (wrong), 1 (right), -1
    # random sample: 2/4, 3/4, 1/4 -> mean 0.5; unreadable counts wrong
    assert f["random_sample_accuracy"] == pytest.approx(0.5)
    assert f["format_valid"] == pytest.approx(9 / 12)
    assert f["greedy_first_rate"] == pytest.approx(2 / 3)


def test_seeded_pseudo_label_is_the_sign_of_online_plus_memory_means() -> None:
    seeds = [(1, 1, 1, -1), (-1, -1), (1, -1), ()]
    online = [(-1, -1, -1, -1), (1, None), (1, 1), (None,)]
    # q0: 0.5 - 1 < 0 -> -1; q1: -1 + 1 = 0 -> none; q2: 0 + 1 -> +1; q3: nothing -> 0
    f = jc.seeded_pseudo_accuracy(seeds, online, [-1, 1, -1, 1])
    assert f["pseudo_label_supervised"] == pytest.approx(2 / 4)
    assert f["pseudo_label_accuracy"] == pytest.approx(1 / 2)  # q0 right, q2 wrong


def test_arm_figures_read_the_last_validation_and_the_pseudo_label_curve() -> None:
    rows = [
        {"step": "1", "ConsistencyAnswerReward/pseudo_label_accuracy": "0.5"},
        {"step": "2", "ConsistencyAnswerReward/pseudo_label_accuracy": "0.75"},
        {"step": "2", "val/accuracy": "0.6", "val/positional_consistency": "0.3"},
    ]
    f = consistrm.arm_figures(rows, ([[0.0, 0.5]], [[0.0, 0.1]]))
    assert f["accuracy"] == 0.6 and f["positional_consistency"] == 0.3
    assert f["pseudo_label_accuracy"] == pytest.approx(0.625)
    assert f["curves"]["accuracy"] == [[0.0, 0.5], [2.0, 0.6]]
    assert math.isnan(consistrm.arm_figures(rows[2:], ([], []))["pseudo_label_accuracy"])


@pytest.mark.parametrize("paper", ["consistrm", "reflectrm"])
def test_smoke_runs_every_arm_and_seed_then_reuses_the_cache(
    tmp_path: Path, monkeypatch, paper: str
) -> None:
    module = {"consistrm": consistrm, "reflectrm": reflectrm}[paper]
    judged: list[str] = []  # every pool the warm judge judges, in order
    real_judge_pool = jc.judge_pool

    def counting(model: str, pairs_path: Path, **kw: object) -> list[jc.Judged]:
        judged.append(pairs_path.stem)
        return real_judge_pool(model, pairs_path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(jc, "judge_pool", counting)
    reproduce.main([paper, "--smoke", "--force", "--out", str(tmp_path)])
    if paper == "consistrm":  # the memory's seed votes reuse the pre-check's judged rows
        assert judged == ["unlabelled", "eval"]
        assert (tmp_path / paper / "smoke" / "judged" / "unlabelled-seed0.json").exists()
    out = tmp_path / paper / "smoke"
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == set(module.PAPER.arms)
    mechanism = "pseudo_label_accuracy" if paper == "consistrm" else "anchor_accuracy"
    for arm, by_seed in results["runs"].items():
        assert set(by_seed) == {"0", "1"}, arm
        for figures in by_seed.values():
            assert math.isfinite(figures["accuracy"]), arm
            assert mechanism in figures or arm == "warm"
    precheck = results["precheck"]
    assert isinstance(precheck["go"], bool) and isinstance(precheck["reason"], str)
    # the record: settings, fingerprint, commit and, for the judges, per-row outputs (both
    # orders of the smoke's 2 held-out pairs: 4 rows) per arm and seed where they are kept
    assert results["settings"]["pools"] == module.PRESETS["smoke"].settings["pools"]
    assert len(results["commit"]) == 40 and results["fingerprint"]
    kept = consistrm.PAPER.arms if paper == "consistrm" else reflectrm.INFERENCE_ARMS
    for arm in kept:
        for figures in results["runs"][arm].values():
            rows = figures["rows"]
            assert len(rows) == 4 and {"id", "family", "verdict", "right"} <= set(rows[0])
            right = sum(r["right"] for r in rows) / len(rows)
            assert right == pytest.approx(figures["accuracy"]), arm
    # every arm has rows now (the trained ConsistRM arms' from JudgmentRecords): the primary's
    # interval resamples the rows
    assert results["summary"]["primary"]["difference"]["interval_method"] == (
        "pair-clustered bootstrap"
    )
    assert (out / "results.md").exists() and (out / f"{paper}.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        jc.warm_dir(out, module.PRESETS["smoke"].settings) / "warm-judge" / "config.json"
    ).exists()

    def fail(*args: object) -> None:
        raise AssertionError("a cached run was run again")

    monkeypatch.setattr(module.PAPER, "run_arm", fail)
    monkeypatch.setattr(module.PAPER, "precheck", fail)
    again = reproduce.main([paper, "--smoke", "--force", "--out", str(tmp_path)])
    assert again is not None and again["precheck"] == precheck
