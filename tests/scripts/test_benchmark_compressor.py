"""scripts/benchmark_compressor.py: the table's arithmetic on hand-made timings, the same-work
check, and a 1 round x 3 steps run of the script (a few seconds)."""

from __future__ import annotations

from tests.distributed.launch import run_python
from tests.helpers import load_script


def test_ratio_is_the_median_over_rounds_of_per_round_median_ratios() -> None:
    bench = load_script("benchmark_compressor")
    # warm-up 1 drops the 9.0 s steps; per-round medians: Lightning 1.25, 2.0, 2.5 (median 2.0);
    # bare 1.0, 2.0, 2.0 (median 2.0) -> ratios 1.25, 1.0, 1.25 -> median 1.25 (range 1.0-1.25)
    runs = {
        "Lightning": [([9.0, 1.25, 1.25], []), ([9.0, 2.0, 2.0], []), ([9.0, 2.5, 2.5], [])],
        "bare": [([9.0, 1.0, 1.0], []), ([9.0, 2.0, 2.0], []), ([9.0, 2.0, 2.0], [])],
    }
    lines = bench.table(runs, warmup=1, target=1.25)
    assert "| Lightning | 2000.00 | 1250.00-2500.00 | 1.250x (1.000-1.250) |" in lines
    assert "| bare | 2000.00 | 1000.00-2000.00 | 1.000x |" in lines
    assert lines[-1] == "PASS: Lightning / bare = 1.250 (target <= 1.25)"
    assert bench.table(runs, warmup=1, target=1.2)[-1].startswith("FAIL")


def test_same_work_flags_a_diverging_trajectory() -> None:
    bench = load_script("benchmark_compressor")
    same = {"Lightning": [([], [2.0, 1.5])], "bare": [([], [2.0, 1.5 + 1e-6])]}
    ok, line = bench.same_work(same, tolerance=1e-5)
    assert ok and "OK" in line and "over 2 steps" in line
    diverged = {"Lightning": [([], [2.0, 1.5])], "bare": [([], [2.0, 1.6])]}
    assert not bench.same_work(diverged, tolerance=1e-5)[0]


def test_script_prints_the_table_and_the_same_work_check() -> None:
    out = run_python(
        "scripts/benchmark_compressor.py", "--rounds", "1", "--steps", "3", "--warmup", "1"
    )
    assert "| arm | median step (ms) | spread over rounds (ms) | ratio vs bare |" in out
    assert "| Lightning |" in out and "| bare |" in out
    assert "PASS: Lightning / bare" in out or "FAIL: Lightning / bare" in out
    # identical seeds, weights, batches and threads: the trajectories agree (exit 0 checks it)
    assert "same work: OK: first-step loss Lightning" in out
