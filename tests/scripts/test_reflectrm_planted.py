"""The ReflectRM planted-analysis experiment (scripts/repro/reflectrm_planted.py): its pools
stay clear of every pool the comparisons read, the planted analyses check the values they
claim, and the smoke run writes a record whose figures follow from its rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import judge_common as jc
from repro import reflectrm_planted as rp
from repro.consistrm import PRESETS

from lit_rlhf.algos.judge import JudgeFormat, judge_verdict


def test_pools_are_new_questions_and_the_reserved_pool_is_apart() -> None:
    settings = PRESETS["cpu"].settings
    pools = rp.planted_pools(settings)
    used = jc.make_pools(settings["pools"], seed=0, max_value=settings["max_value"])
    key = lambda p: (p.a, p.op, p.b)  # noqa: E731
    taken = {key(p) for pool in used.values() for p in pool}
    dev, reserved = ({key(p) for p in pools[k]} for k in ("dev", "primary"))
    assert len(dev) == 96 and len(reserved) == 192
    assert not dev & taken and not reserved & taken and not dev & reserved


def test_each_pair_is_asked_in_both_orders_with_the_planted_wrong_value() -> None:
    pair = jc.ArithPair("x", 17, "+", 25, 44, right_first=False)  # response 1 says 44
    fmt = JudgeFormat(jc.TAGS)
    (row, (a1, a2), right_first), (_, (b1, b2), second) = rp.questions(pair, fmt)
    assert right_first and not second and (a1, a2) == (b2, b1)
    assert "17 + 25 = 42, as Response 2 says" in a1 and "17 + 25 = 44, as Response 1 says" in a2
    assert row["response_1"] == "17 + 25 = 44" and row["response_2"] == "17 + 25 = 42"
    # the planted judgment's verdict follows its wrong analysis
    assert judge_verdict(jc.planted_judgment(pair), tags=jc.TAGS) == -1
    assert judge_verdict(jc.judgment(pair), tags=jc.TAGS) == 1


def test_smoke_writes_every_prompt_and_figures_that_follow_from_them(tmp_path: Path) -> None:
    out = tmp_path / "planted.json"
    record = rp.main(["--smoke", "--root", str(tmp_path / "runs"), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    rows, figures = record["rows"], record["figures"]
    assert len(rows) == 2 * figures["pairs"] == figures["prompts"] == 8
    for r in rows:
        assert r["correct"] == (r["verdict"] == (-1 if r["right_first"] else 1))
    assert figures["reflection_accuracy"]["mean"] == sum(r["correct"] for r in rows) / len(rows)
    assert figures["unreadable"] == sum(r["verdict"] is None for r in rows) / len(rows)
    accuracy = figures["reflection_accuracy"]
    assert figures["gate"]["passes"] == (accuracy["mean"] >= rp.GATE and accuracy["low"] > 0.5)
