"""scripts/repro/tre_saturation.py at smoke scale: the solve phase stops once solved and leaves
the checkpoint every drift arm resumes from, each arm logs only its drift steps, the gate and
the primary follow from the recorded figures, and a second call reuses the cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import tre_saturation as ts


def test_smoke_solves_drifts_from_the_checkpoint_and_scores_the_seeds(tmp_path: Path) -> None:
    args = ["--smoke", "--pilot", "--seeds", "1", "2", "--root", str(tmp_path / "runs"),
            "--out", str(tmp_path / "sat.json")]  # fmt: skip
    record = ts.main(args)
    s = ts.settings(smoke=True)
    for seed, run in record["seeds"].items():
        solve = run["solve"]
        assert solve["solved"] and solve["steps"] == s["solved_steps"]  # stopped once solved
        assert Path(solve["checkpoint"]).exists()
        for arm in ts.ARMS:
            assert len(run["arms"][arm]["drift_rewards"]) == s["drift_steps"], (seed, arm)
    gate = record["gate"]
    assert gate["passes"] == (gate["solved"] and gate["vanilla_tied_groups"] >= 0.9)
    arms = {k: v["arms"] for k, v in record["seeds"].items() if k != "0"}  # seed 0: pilot only
    expected = [a["entropy"]["tail_drift"] - a["tre-k"]["tail_drift"] for a in arms.values()]
    assert record["primary"]["per_seed"] == expected
    assert record["primary"]["verdict"] in ("reproduced", "opposite", "not shown")
    # below the registered minimum of seeds: the differences, and no verdict
    fewer = ts.primary({k: v for k, v in record["seeds"].items() if k == "1"}, min_seeds=5)
    assert fewer == {"per_seed": expected[:1], "verdict": "none yet: 1 of 5 seeds"}
    again = ts.main(args)  # every phase and arm cached: the same figures
    assert json.dumps(again["seeds"], sort_keys=True) == json.dumps(record["seeds"], sort_keys=True)
