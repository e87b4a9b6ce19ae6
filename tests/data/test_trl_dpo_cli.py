"""As a user coming from TRL would: DPO through the CLI, in a subprocess, from a folder outside
the repository holding a JSONL of TRL's conversational preference rows; no schema or column
setting, only the shipped config and the file's path (docs/data.md)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dpo_trains_on_trl_rows_from_the_working_folder(tmp_path: Path) -> None:
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "chosen": [{"role": "assistant", "content": f"It is {i + 1}."}],
            "rejected": [{"role": "assistant", "content": f"It is {i + 3}."}],
        }
        for i in range(16)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = [
        "fit", "--config", str(REPO / "configs" / "dpo" / "tiny.yaml"),
        "--data.init_args.train=lit_rlhf.data.PreferencePairs",
        "--data.init_args.train.init_args.path=rows.jsonl",
        "--data.init_args.val=null",
        "--trainer.max_steps=2",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "lit_rlhf.cli", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (metrics,) = (tmp_path / "runs" / "dpo_tiny").glob("version_*/metrics.csv")
    with metrics.open() as handle:
        losses = [row["train/loss"] for row in csv.DictReader(handle) if row.get("train/loss")]
    assert len(losses) == 2  # 16 pairs, 8 per batch
    assert (tmp_path / "runs" / "dpo_tiny" / "hf" / "model.safetensors").is_file()
