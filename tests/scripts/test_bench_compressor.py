"""scripts/bench/compressor.py: the table's arithmetic on hand-made timings and the same-work
check (its --smoke run: tests/scripts/test_bench_smoke.py)."""

from __future__ import annotations

from scripts.bench import compressor as bench


def test_ratio_is_the_median_over_rounds_of_per_round_median_ratios() -> None:
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
    same = {"Lightning": [([], [2.0, 1.5])], "bare": [([], [2.0, 1.5 + 1e-6])]}
    ok, line = bench.same_work(same, tolerance=1e-5)
    assert ok and "OK" in line and "over 2 steps" in line
    diverged = {"Lightning": [([], [2.0, 1.5])], "bare": [([], [2.0, 1.6])]}
    assert not bench.same_work(diverged, tolerance=1e-5)[0]
