"""scripts/compare_exploration.py without training: the fragments of ``--dry-run`` and the
results table and curves built from hand-made metrics.csv files."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType

import yaml

from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "compare_exploration.py"
BASE = SCRIPT.parents[1] / "configs" / "ppo" / "countdown_smollm2.yaml"


def _load() -> ModuleType:
    return load_script("compare_exploration")


def test_dry_run_writes_one_fragment_per_method_with_the_authors_defaults(
    tmp_path: Path, capsys
) -> None:
    script = _load()
    script.main(["--dry-run", "--out", str(tmp_path), "--config", str(BASE)])
    expected = {
        "vanilla": None,
        "entropy": ("EntropyBonus", {"alpha": 0.001}),
        "forking": ("ForkingTokens", {"top_fraction": 0.2}),
        "klcov": ("KLCov", {"top_fraction": 0.002, "coef": 1.0, "replace_clip": False}),
        "tre-k": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topk", "k": 2}),
        "tre-p": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topp", "p": 0.99}),
    }
    assert sorted(p.name for p in tmp_path.glob("*.yaml")) == sorted(
        f"{m}-seed0.yaml" for m in expected
    )
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 6 and all("lit_rlhf.cli fit --config" in line for line in printed)
    for method, callback in expected.items():
        fragment = yaml.safe_load((tmp_path / f"{method}-seed0.yaml").read_text())
        callbacks = fragment["trainer"]["callbacks"]
        # the base config's MetricsPlot stays first; the method's callback (if any) follows
        assert callbacks[0]["class_path"] == "lit_rlhf.callbacks.MetricsPlot"
        if callback is None:
            assert len(callbacks) == 1
        else:
            name, init_args = callback
            assert callbacks[1:] == [
                {"class_path": f"lit_rlhf.callbacks.{name}", "init_args": init_args}
            ]
        logger = fragment["trainer"]["logger"]["init_args"]
        assert logger == {"save_dir": str(tmp_path), "name": method, "version": "seed0"}
        assert fragment["seed_everything"] == 0 and fragment["data"]["init_args"]["seed"] == 0
        assert fragment["trainer"]["limit_train_batches"] == 12  # the cpu preset's steps
        assert fragment["trainer"]["enable_progress_bar"] is False
    assert not any(p.is_dir() for p in tmp_path.iterdir())  # nothing ran


def _write_metrics(
    path: Path, reward: list[float], entropy: list[float], val: float, tre: float | None = None
) -> None:
    """A CSVLogger-like file: one row per rollout step, then the validation row. ``tre`` adds
    TRE's diagnostics: TRE entropy ``tre`` at every step but the last (``tre / 2``), |A_t| = 2."""
    path.parent.mkdir(parents=True)
    keys = ["step", "rollout/step", "reward/mean", "ppo/entropy", "val/pass@1"]
    keys += ["TrustRegionEntropy/tre_entropy", "TrustRegionEntropy/region_size"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for i, (r, h) in enumerate(zip(reward, entropy, strict=True)):
            row = {"step": i, "rollout/step": i + 1, "reward/mean": r, "ppo/entropy": h}
            if tre is not None:
                row["TrustRegionEntropy/tre_entropy"] = tre if i < len(reward) - 1 else tre / 2
                row["TrustRegionEntropy/region_size"] = 2
            writer.writerow(row)
        writer.writerow({"step": len(reward) - 1, "val/pass@1": val})


def test_results_table_and_curves_from_hand_made_metrics(tmp_path: Path) -> None:
    script = _load()
    # vanilla, seed 0: rewards 0, .1, .2, .3, .4 -> last 3 mean (.2+.3+.4)/3 = .3
    _write_metrics(tmp_path / "vanilla/seed0/metrics.csv", [0, 0.1, 0.2, 0.3, 0.4], [1] * 5, 0.25)
    # vanilla, seed 1: last 3 rewards .5 each -> .5; over seeds mean .4, sample std
    # sqrt(((.3-.4)^2 + (.5-.4)^2) / 1) = .1414; entropy run means 1 and 2 -> 1.5 ± .7071;
    # val pass@1 .25 and .75 -> .5 ± .3536
    _write_metrics(tmp_path / "vanilla/seed1/metrics.csv", [0.5] * 5, [2] * 5, 0.75)
    # tre-k, seed 0: entropy 4, 3, 2, 1, 0 -> run mean 2, last 3 mean 1; TRE entropy
    # 10, 10, 10, 10, 5 -> run mean 45 / 5 = 9; seed 1 failed
    _write_metrics(tmp_path / "tre-k/seed0/metrics.csv", [1] * 5, [4, 3, 2, 1, 0], 1.0, tre=10)
    _write_metrics(tmp_path / "tre-k/seed1/metrics.csv", [9] * 5, [9] * 5, 9.0)  # stale
    seconds = {"vanilla": [100.0, 120.0], "tre-k": [90.0, None]}
    table = script.write_results(tmp_path, ["vanilla", "tre-k"], [0, 1], seconds, "# header")

    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert rows[0] == [
        "| vanilla",
        "0.400 ± 0.141",  # train reward
        "n/a",  # reward/correct not logged
        "0.500 ± 0.354",  # val pass@1
        "1.500 ± 0.707",  # entropy, run mean
        "1.500 ± 0.707",  # entropy, last 3
        "n/a",  # TRE entropy
        "n/a",  # |A_t|
        "110 ± 14 |",  # wall time: mean 110, std sqrt(2 * 10^2 / 1) = 14.1
    ]
    assert rows[1] == [
        "| tre-k (1 failed)",
        "1.000",
        "n/a",
        "1.000",
        "2.000",
        "1.000",
        "9.000",
        "2.000",
        "90 |",
    ]
    results = (tmp_path / "results.md").read_text()
    assert results == f"# header\n\n{table}\n\n![curves](curves.png)\n"
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mean_curve_averages_runs_per_rollout_step() -> None:
    script = _load()
    a = [{"rollout/step": "1", "x": "1"}, {"rollout/step": "2", "x": "3"}]
    b = [{"rollout/step": "1", "x": "3"}, {"rollout/step": "", "x": "7"}]  # row 2: no step
    assert script.mean_curve([a, b], "x") == ([1, 2], [2.0, 3.0])
