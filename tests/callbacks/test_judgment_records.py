"""JudgmentRecords: a judge's per-row validation judgments as JSON lines, in process and from the
outside (``lit-rlhf fit`` on the tiny RFT config in a subprocess, from a folder outside the
repository); the rows agree with the logged accuracy, and a module whose steps return no
judgments is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lightning.pytorch.demos.boring_classes import BoringModel

from lit_rlhf.callbacks import JudgmentRecords
from tests.helpers import quiet_trainer
from tests.modules.test_grm import data, judge

REPO = Path(__file__).parents[2]


def test_rows_of_the_last_validation_agree_with_the_logged_accuracy(tmp_path: Path) -> None:
    records = JudgmentRecords(str(tmp_path / "rows"))
    trainer = quiet_trainer(tmp_path, limit_train_batches=1, limit_val_batches=2,
                            callbacks=[records])  # fmt: skip
    trainer.fit(judge("rft"), datamodule=data())
    rows = [json.loads(line) for line in (tmp_path / "rows" / "val_epoch0.jsonl").open()]
    assert len(rows) == 4  # 2 validation batches of 2 rows
    assert {"query_id", "family", "label", "verdict", "votes", "right"} <= rows[0].keys()
    assert all(r["right"] == (r["verdict"] == r["label"]) for r in rows)
    accuracy = sum(r["right"] for r in rows) / len(rows)
    assert accuracy == pytest.approx(float(trainer.callback_metrics["val/accuracy"]))


def test_a_module_without_judgments_is_refused(tmp_path: Path) -> None:
    trainer = quiet_trainer(tmp_path, limit_train_batches=1, limit_val_batches=1,
                            callbacks=[JudgmentRecords(str(tmp_path / "rows"))])  # fmt: skip
    with pytest.raises(TypeError, match="not a dict with 'judgments'"):
        trainer.fit(BoringModel())


def test_from_the_cli_in_a_subprocess(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "configs" / "grm" / "rft_tiny.yaml").read_text())
    config["trainer"].update(default_root_dir=str(tmp_path), logger=False,
                             limit_train_batches=1, enable_checkpointing=False)  # fmt: skip
    config["trainer"]["callbacks"] = [
        {"class_path": "lit_rlhf.callbacks.JudgmentRecords",
         "init_args": {"dirpath": str(tmp_path / "records")}}]  # fmt: skip
    path = tmp_path / "rft_records.yaml"
    path.write_text(yaml.safe_dump(config))
    run = subprocess.run(
        [sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", str(path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "records" / "val_epoch0.jsonl").open()]
    assert len(rows) == 2 and all("verdict" in r for r in rows)  # limit_val_batches 1 of 2 rows
