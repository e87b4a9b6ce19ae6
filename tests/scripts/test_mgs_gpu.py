"""scripts/repro/mgs_gpu.py, the MGS GPU window: its SFT data leaves the measured arithmetic out
(so the measured groups are guessed, not memorised), and at smoke scale on the CPU the window
trains its policy inside the command (once: a rerun reuses it), gates it, measures batches with
chat encoded by that policy, and rewrites the record after each batch; a spent budget
starts none."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from repro import mgs_gpu as mg
from repro import mgs_measure as mm


def test_the_sft_rows_leave_every_measured_expression_out_and_teach_the_rest() -> None:
    s = mg.REGIMES["gpu"]
    data = mm.pools(s, "builtin:tiny-llama")  # the pools do not depend on the tokenizer's model
    measured = {r["expression"] for part in data.values() for r in part["arithmetic"]}
    assert len(measured) == s["primary_pool"] + s["dev_pool"]
    rows = mg.sft_rows({**s, "model": "builtin:tiny-llama"}, data)
    arithmetic = [r for r in rows if r["response"].startswith("\\boxed{")]
    taught = {r["prompt"] for r in arithmetic}
    assert not taught & {mm.TEMPLATE.format(expression=e) for e in measured}
    assert len(taught) == 800 - len(measured)  # every other question of operands 1-20
    assert len(arithmetic) == len(taught) * s["arithmetic_copies"]
    assert "\\boxed{-6}" in {r["response"] for r in arithmetic if "7 - 13" in r["prompt"]}
    assert len(rows) - len(arithmetic) == 24 * s["chat_copies"]


def test_the_smoke_window_trains_gates_and_measures_batch_after_batch(tmp_path: Path) -> None:
    out, work = tmp_path / "m.json", str(tmp_path / "w")
    spent = mg.main(["--regime", "smoke", "--work", work, "--out", str(out), "--budget-s", "0"])
    assert spent["batches"] == [] and spent["verdict"] == "no batch ran"  # a spent budget
    assert spent["sft"]["seconds"] > 0 and json.loads(out.read_text())["gate"]["passes"]
    record = mg.main(["--regime", "smoke", "--work", work, "--out", str(out)])
    assert record["sft"]["seconds"] == 0.0  # the policy trained above is reused
    saved = json.loads(out.read_text())
    assert saved["verdict"] == record["verdict"] and saved["commit"]
    assert saved["settings"]["embedder"].endswith("sft-policy")
    assert saved["gate"]["passes"]  # the smoke's threshold is 0
    assert len(saved["batches"]) == mg.REGIMES["smoke"]["batches"]
    assert saved["primary"]["batches"] + saved["primary"]["left_out"] == len(saved["batches"])
    assert set(saved["batches"][0]["live"]) == set(mm.DOMAINS)
