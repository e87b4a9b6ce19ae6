"""scripts/repro/compression_matched.py: the registered matching of snapshots by development
gain, and the whole run at smoke scale (snapshots saved during training, the chosen ones read
back on the evaluation facts, cached)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import compression_matched as cm


def test_the_closest_pair_above_the_threshold_is_chosen() -> None:
    curves = {
        "planted": {"25": 0.3, "50": 0.9, "75": 1.6, "100": 2.4},
        "twin": {"25": 0.2, "50": 0.55, "75": 1.0, "100": 1.5},
    }
    assert cm.choose(curves, 0.5) == (75, 100)  # 1.6 vs 1.5: the smallest difference
    assert cm.choose(curves, 2.0) is None  # the twin never carries that much
    # below the threshold a closer pair does not count (25: 0.3 vs 0.2 is not chosen)
    assert cm.choose({"planted": {"25": 0.3}, "twin": {"25": 0.31}}, 0.5) is None


def test_ties_go_to_the_larger_gain_then_the_earlier_steps() -> None:
    curves = {"planted": {"50": 0.8, "100": 1.2}, "twin": {"50": 0.9, "100": 1.3}}
    assert cm.choose(curves, 0.5) == (100, 100)  # 0.1 apart both times: the larger gains
    same = {"planted": {"50": 1.0, "75": 1.0}, "twin": {"50": 1.0}}
    assert cm.choose(same, 0.5) == (50, 50)


def test_smoke_end_to_end_and_cached(tmp_path: Path) -> None:
    args = ["--smoke", "--root", str(tmp_path / "runs"), "--out", str(tmp_path / "m.json")]
    record = cm.main(args)
    s = cm.matched_settings(smoke=True)
    run = record["seeds"]["0"]
    steps = [str(n) for n in range(1, s["steps"] + 1)]
    for twin in ("planted", "twin"):
        assert list(run["curves"][twin]) == steps  # one development reading per snapshot
        folder = tmp_path / "runs" / "smoke" / "seed0" / twin / "matched" / "snapshots"
        assert sorted(p.name for p in folder.iterdir()) == [f"step{n}.pt" for n in steps]
        assert len(run[twin]["margins"]) == s["eval_facts"]
        assert run[twin]["dev_gain"] == run["curves"][twin][str(run[twin]["step"])]
    assert tuple(run["pair"]) == cm.choose(run["curves"], s["match_above"])
    # a snapshot read back gives the development gain measured while it trained
    evaluation = cm.fact_items(s["eval_facts"], cm.EVAL_SEED)
    dev = cm.fact_items(s["dev_facts"], cm.DEV_SEED, {i["sentence"] for i in evaluation})
    root = tmp_path / "runs" / "smoke"
    back = cm.read_snapshot(s, root / "seed0" / "twin" / "lm", folder / "step2.pt", dev,
                            tmp_path / "back")  # fmt: skip
    assert back["memory_gain"] == pytest.approx(run["curves"]["twin"]["2"], abs=1e-5)
    assert record["primary"]["verdict"].startswith("gate fails")  # tiny models carry nothing
    again = cm.main(args)
    assert json.dumps(again["seeds"], sort_keys=True) == json.dumps(record["seeds"], sort_keys=True)
    assert json.loads((tmp_path / "m.json").read_text())["seeds"] == again["seeds"]


def test_a_snapshot_of_another_network_is_refused(tmp_path: Path) -> None:
    import torch

    bad = tmp_path / "bad.pt"
    torch.save({"compressor.not_a_weight": torch.zeros(1)}, bad)
    s = cm.matched_settings(smoke=True)
    root = tmp_path / "runs"
    lm = cm.plant(s, "planted", 0, root)
    evaluation = cm.fact_items(s["eval_facts"], cm.EVAL_SEED)
    with pytest.raises(RuntimeError, match="does not match the compressor"):
        cm.read_snapshot(s, lm, bad, evaluation, tmp_path / "read")
