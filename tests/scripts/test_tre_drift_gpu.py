"""scripts/repro/tre_drift_gpu.py, the TRE GPU window, at smoke scale on the CPU: the policy is
fine-tuned inside the command, the pilot picks a step size, every seed and arm is recorded, and
--rescore recomputes the registered primary from the record alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from repro import tre_drift as td  # noqa: E402
from repro import tre_drift_gpu as gpu  # noqa: E402


def test_the_smoke_window_trains_the_policy_and_records_every_seed(tmp_path: Path) -> None:
    out = tmp_path / "drift.json"
    record = gpu.main(["--regime", "smoke", "--work", str(tmp_path / "work"), "--out", str(out)])
    assert json.loads(out.read_text())["seeds"].keys() == {"1", "2"}
    assert (tmp_path / "work" / "lm" / "config.json").exists()  # the policy trained here
    assert record["lm_training"]["steps"] == 2 and record["lm_training"]["last_loss"] > 0
    assert record["pilot"]["lr"] in gpu.REGIMES["smoke"]["lrs"]
    assert all(set(r) == {"entropy", "tre-k"} for r in record["seeds"].values())
    assert record["primary"] == json.loads(json.dumps(td.primary(record["seeds"])))
    # --rescore: the primary from the record alone (the GPU image may lack scipy)
    saved = json.loads(out.read_text())
    saved["primary"] = {"missing": "scipy"}
    out.write_text(json.dumps(saved))
    gpu.main(["--rescore", str(out)])
    assert json.loads(out.read_text())["primary"] == record["primary"]


def test_the_window_refuses_an_unknown_paper_with_its_usage() -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_paper.sh"), "dpo"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "usage" in done.stderr
    assert "tre|reflectrm|mgs|consistrm|compression" in done.stderr
    assert "usage" in subprocess.run(["bash", str(ROOT / "scripts" / "gpu_paper.sh")],
                                     capture_output=True, text=True, timeout=60).stderr  # fmt: skip
