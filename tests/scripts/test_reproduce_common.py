"""scripts/repro/common.py and scripts/reproduce.py without training: intervals and verdicts on
hand-computed values, the per-(arm, seed) cache and resume, the settings fingerprint, the outputs,
and the CLI's listing and refusals, with a fake paper whose arms return fixed figures."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from repro import common  # noqa: E402
from repro.common import Interval, Preset, Primary  # noqa: E402


def test_interval_matches_a_hand_computed_t_interval() -> None:
    # values 1, 2, 3: mean 2, sample std 1, half width t_{0.975,2} * 1 / sqrt(3) = 4.303 / 1.732
    iv = Interval.of([1.0, 2.0, 3.0])
    assert iv.mean == 2.0 and iv.n == 3 and iv.as_dict()["interval_method"] == "t"
    assert iv.high - iv.mean == pytest.approx(4.303 / math.sqrt(3), abs=1e-3)
    assert iv.low == pytest.approx(2.0 - 4.303 / math.sqrt(3), abs=1e-3)
    assert iv.cell(".2f") == "2.00 [-0.48, 4.48]"


def test_interval_of_one_value_and_of_none() -> None:
    assert Interval.of([0.5]).cell() == "0.500 (1 seed)"
    assert Interval.of([None, float("nan")]).n == 0  # type: ignore[list-item]
    assert Interval.of([]).cell() == "n/a"


def test_t975_matches_the_table_values() -> None:
    # scipy.stats.t against the printed table (3 decimals); 1.984 at df 100, not the normal 1.96
    for df, table in ((1, 12.706), (2, 4.303), (30, 2.042), (100, 1.984)):
        assert common.t975(df) == pytest.approx(table, abs=5e-4)
    with pytest.raises(ValueError, match="df >= 1"):
        common.t975(0)


def test_verdict_follows_the_interval_and_direction() -> None:
    up = Interval.of([0.1, 0.12, 0.11])
    mixed = Interval.of([0.1, -0.1, 0.05])
    assert common.verdict(up, +1) == "reproduced"
    assert common.verdict(up, -1) == "opposite"
    assert common.verdict(mixed, +1) == "not shown"
    assert common.verdict(Interval.of([0.3]), +1) == "too few seeds"
    assert common.verdict(up, +1, precheck_go=False).startswith("not testable")


def test_paired_difference_pairs_by_seed_and_skips_unpaired() -> None:
    runs = {
        "a": {0: {"m": 1.0}, 1: {"m": 3.0}, 2: {"m": 10.0}},
        "b": {0: {"m": 0.5}, 1: {"m": 2.0}},
    }
    diff = common.paired_difference(runs, "m", "a", "b")
    assert diff.n == 2 and diff.mean == pytest.approx(0.75)


def test_primary_direction_is_checked() -> None:
    with pytest.raises(ValueError, match="direction"):
        Primary("m", "a", "b", 0)


class FakePaper(common.Paper):
    name = "fake"
    title = "Fake comparison"
    arms = ("base", "treat")
    primary = Primary("score", "treat", "base", +1)
    table_metrics = ("score",)
    curve_keys = ("loss",)

    def __init__(self, go: bool = True) -> None:
        self.presets = {
            "smoke": Preset("smoke", (0, 1, 2), 1, {"steps": 2}),
            "cpu": Preset("cpu", (0, 1, 2), 60, {"steps": 50}),
            "gpu": Preset("gpu", (0, 1, 2), 600, {"steps": 500}),
        }
        self.go = go
        self.calls: list[tuple[str, int]] = []

    def precheck(self, ctx: common.Context) -> dict[str, Any]:
        return {"go": self.go, "reason": "fixed", "base_rate": 0.2}

    def run_arm(self, ctx: common.Context, arm: str, seed: int) -> dict[str, Any]:
        self.calls.append((arm, seed))
        score = seed + (1.5 if arm == "treat" else 0.0)
        return {"score": score, "curves": {"loss": [[0, 1.0 + seed], [1, 0.5]]}}


@pytest.fixture
def reproduce(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FakePaper]:
    import reproduce as module

    paper = FakePaper()
    monkeypatch.setattr(module, "load_paper", lambda name: paper)
    return module, paper


def test_runner_writes_outputs_and_resumes_from_the_cache(reproduce, tmp_path: Path) -> None:
    module, paper = reproduce
    result = module.main(["tre", "--smoke", "--out", str(tmp_path)])
    folder = tmp_path / "fake" / "smoke"
    assert paper.calls == [("base", 0), ("base", 1), ("base", 2), ("treat", 0), ("treat", 1),
                           ("treat", 2)]  # fmt: skip
    primary = result["summary"]["primary"]
    # treat - base = 1.5 on every seed: zero spread, interval [1.5, 1.5] excludes 0
    assert primary["difference"]["mean"] == pytest.approx(1.5)
    assert primary["verdict"] == "reproduced"
    data = json.loads((folder / "results.json").read_text())
    assert set(data["runs"]) == {"base", "treat"} and set(data["runs"]["treat"]) == {"0", "1", "2"}
    assert data["precheck"]["base_rate"] == 0.2
    assert (folder / "fake.png").stat().st_size > 0
    assert "**reproduced**" in (folder / "results.md").read_text()
    # a second call (a resumed preset) reads every run from its result.json
    paper.calls.clear()
    module.main(["tre", "--smoke", "--out", str(tmp_path)])
    assert paper.calls == []
    # losing one result file reruns that run only
    (folder / "treat" / "seed1" / "result.json").unlink()
    module.main(["tre", "--smoke", "--out", str(tmp_path)])
    assert paper.calls == [("treat", 1)]


def test_results_json_is_the_record_and_is_copied_to_docs_off_smoke(
    reproduce, tmp_path: Path
) -> None:
    module, paper = reproduce
    docs = tmp_path / "docs"
    module.main(["tre", "--smoke", "--out", str(tmp_path / "runs"), "--docs", str(docs)])
    assert not docs.exists()  # a smoke run writes nowhere in docs, whatever --docs says
    paper.doc = "docs/fakepage.md"
    module.main(["tre", "--preset", "cpu", "--out", str(tmp_path / "runs"), "--docs", str(docs)])
    record = json.loads((docs / "fakepage_fake.json").read_text())
    folder = tmp_path / "runs" / "fake" / "cpu"
    assert record == json.loads((folder / "results.json").read_text())
    assert record["settings"] == {"steps": 50} and record["preset"] == "cpu"
    assert record["fingerprint"] == paper.presets["cpu"].fingerprint()
    assert len(record["commit"]) == 40 and record["seeds"] == [0, 1, 2]
    # the per-seed values of every arm, and the primary interval's method
    assert {s: f["score"] for s, f in record["runs"]["treat"].items()} == {
        "0": 1.5, "1": 2.5, "2": 3.5}  # fmt: skip
    assert record["summary"]["primary"]["difference"]["interval_method"] == "t"


def test_cache_made_with_other_settings_is_refused(reproduce, tmp_path: Path) -> None:
    module, paper = reproduce
    module.main(["tre", "--smoke", "--out", str(tmp_path), "--arms", "base"])
    paper.presets["smoke"].settings["steps"] = 3
    with pytest.raises(SystemExit, match="other settings"):
        module.main(["tre", "--smoke", "--out", str(tmp_path), "--arms", "base"])
    paper.calls.clear()
    module.main(["tre", "--smoke", "--out", str(tmp_path), "--arms", "base", "--fresh"])
    assert len(paper.calls) == 3


def test_failed_precheck_stops_before_the_arms(reproduce, tmp_path: Path) -> None:
    module, paper = reproduce
    paper.go = False
    result = module.main(["tre", "--smoke", "--out", str(tmp_path)])
    assert paper.calls == [] and result["precheck"]["go"] is False
    assert "not testable" in (tmp_path / "fake" / "smoke" / "results.md").read_text()


def test_cli_refusals_and_listing(reproduce, tmp_path: Path, capsys) -> None:
    module, _ = reproduce
    with pytest.raises(SystemExit, match="unknown arms"):
        module.main(["tre", "--smoke", "--out", str(tmp_path), "--arms", "nope"])
    with pytest.raises(SystemExit, match="repeats a seed"):
        module.main(["tre", "--smoke", "--out", str(tmp_path), "--seeds", "1", "1"])
    with pytest.raises(SystemExit):
        module.main(["--help"])
    listing = capsys.readouterr().out
    assert all(name in listing for name in ("tre", "mgs", "consistrm", "reflectrm", "compression"))
    module.main(["tre", "--preset", "gpu", "--print-settings"])
    assert json.loads(capsys.readouterr().out)["steps"] == 500
