"""scripts/compare_grm.py without training: the fragments of ``--dry-run`` and the results table
built from hand-made metrics.csv files; scripts/eval_judge.py on a tiny judge."""

from __future__ import annotations

import csv
from pathlib import Path

import yaml

from tests.distributed.launch import run_python
from tests.helpers import load_script


def test_dry_run_writes_one_fragment_per_arm(tmp_path: Path, capsys) -> None:
    script = load_script("compare_grm")
    script.main(["--dry-run", "--out", str(tmp_path), "--seeds", "0", "1", "--steps", "5"])
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == sorted(
        f"{arm}-seed{s}.yaml" for arm in ("base", "rft", "consistrm") for s in (0, 1)
    )
    printed = capsys.readouterr().out
    assert printed.count("lit_rlhf.cli validate") == 2 and printed.count("lit_rlhf.cli fit") == 4
    consistrm = yaml.safe_load((tmp_path / "consistrm-seed1.yaml").read_text())
    model = consistrm["model"]["init_args"]
    assert (model["seed"], model["mode"]) == (1, "consistrm")
    # the base config's VerdictReward, label-free: same scores and format, mode "format"
    assert model["reward"]["init_args"]["mode"] == "format"
    assert model["reward"]["init_args"]["invalid"] == -1.0
    assert consistrm["trainer"]["limit_train_batches"] == 5
    answer = consistrm["trainer"]["callbacks"][-1]
    assert answer["class_path"] == "lit_rlhf.callbacks.ConsistencyAnswerReward"
    assert answer["init_args"] == {
        "tags": ["Result"],
        "prefix": " <Result>Response 1 is",
        "suffix": " than Response 2</Result>",
    }
    rft = yaml.safe_load((tmp_path / "rft-seed0.yaml").read_text())
    assert rft["model"]["init_args"]["mode"] == "rft"
    assert all("Consistency" not in c["class_path"] for c in rft["trainer"]["callbacks"])


def test_summary_is_the_last_validation_mean_and_spread(tmp_path: Path) -> None:
    script = load_script("compare_grm")
    paths = []
    for seed, acc in ((0, 0.5), (1, 0.7)):
        path = tmp_path / f"seed{seed}.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["step", *script.METRICS])
            writer.writeheader()
            writer.writerow(
                {
                    "step": 0,
                    "val/accuracy": 0.1,
                    "val/positional_consistency": 0.0,
                    "val/format_valid": 1.0,
                }
            )
            writer.writerow(
                {
                    "step": 9,
                    "val/accuracy": acc,
                    "val/positional_consistency": 0.5,
                    "val/format_valid": 1.0,
                }
            )
        paths.append(path)
    table = script.summarise({"rft": paths})
    # last validation of each seed: mean (0.5 + 0.7) / 2 = 0.6, sample std 0.141
    assert "| rft | 0.600 ± 0.141 | 0.500 ± 0.000 | 1.000 ± 0.000 |" in table


def test_eval_judge_prints_the_metrics_table(tmp_path: Path) -> None:
    out = run_python(
        "scripts/eval_judge.py",
        "--model",
        "builtin:tiny-llama",
        "--synthetic",
        "4",
        "--template",
        "consistrm-v1-short",
        "--max-new-tokens",
        "8",
        "--json",
        str(tmp_path / "m.json"),
    )
    for name in ("accuracy", "positional_consistency", "format_valid", "tie_rate"):
        assert f"| {name} |" in out
    assert (tmp_path / "m.json").exists()
