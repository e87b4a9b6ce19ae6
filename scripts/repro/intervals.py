"""The intervals of ``scripts/reproduce.py``, each matched to the kind of metric it is drawn on
(issue 40, item 4). A paper declares the kind of each metric it cares about
(``Paper.metric_kinds``); an undeclared metric keeps the Student-t interval.

- ``bounded(lo, hi)``: a rate, an accuracy or a mass. Per arm, a percentile bootstrap over the
  seeds (``scipy.stats.bootstrap``): its ends are means of resampled seeds, so it never leaves
  ``[lo, hi]``. A paired difference gets a percentile bootstrap too (within ``[lo - hi, hi - lo]``),
  but with few seeds a percentile interval is too short: its ends are the extreme seeds, so three
  seeds of one sign exclude 0, which a symmetric null gives 1 time in 4. So the verdict on it
  also asks the t-interval of the same differences to exclude 0 (kept in the dict as ``t_low`` /
  ``t_high``).
- ``count(n_key)``: successes out of ``n`` (the figure ``n_key``) per seed; per arm, the exact
  (Clopper-Pearson) interval of the pooled count (``scipy.stats.binomtest``). Differences as for
  ``bounded(0, 1)``.
- ``unbounded()``: the t-interval (``scipy.stats.t``); so is ``UNDECLARED``, the kind of a metric
  no paper declared, which (the rule before kinds) leaves a NaN seed out.
- ``judge_rows(rows_key)``: a judge's per-row outcomes; the paired difference is a pair-clustered
  bootstrap pooled over seeds (:func:`clustered_difference`): the seeds never resample the fixed
  pool of rows, so the rows are what is resampled.

The registered rule for collapsed runs (:func:`apply_collapse_rule`): a seed whose value is not
finite, or whose figures say ``collapsed: true``, counts as the metric's worst value (``worst``,
by default the low end of its range); it is never dropped. A metric with no finite worst
(unbounded) makes the interval undefined (NaN) instead.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

RESAMPLES = 9999  # bootstrap resamples; a fixed generator seed makes every interval repeatable
BOOTSTRAP_SEED = 0


def t975(df: int) -> float:
    """The two-sided 95 % Student-t critical value for ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t975 needs df >= 1, got {df}")
    return float(stats.t.ppf(0.975, df))


@dataclass(frozen=True)
class Interval:
    """Mean and 95 % interval (``low == high == mean`` for one value); ``method`` names how it
    was drawn; ``t_low`` / ``t_high``: the t-interval of the same values, where the verdict
    needs it beside a bootstrap over seeds."""

    mean: float
    low: float
    high: float
    n: int
    method: str = "t"
    t_low: float | None = None
    t_high: float | None = None

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Interval:
        xs = _finite(values)
        if not xs:
            return cls(math.nan, math.nan, math.nan, 0)
        mean = statistics.fmean(xs)
        if len(xs) == 1:
            return cls(mean, mean, mean, 1)
        half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        return cls(mean, mean - half, mean + half, len(xs))

    def excludes_zero(self) -> bool:
        if self.n < 2 or not (self.low > 0 or self.high < 0):
            return False
        if self.t_low is None or self.t_high is None:
            return True
        return self.t_low > 0 or self.t_high < 0

    def cell(self, fmt: str = ".3f") -> str:
        if self.n == 0:
            return "n/a"
        if self.n == 1:
            return f"{self.mean:{fmt}} (1 seed)"
        return f"{self.mean:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mean": self.mean, "low": self.low, "high": self.high,
                               "n": self.n, "interval_method": self.method}  # fmt: skip
        if self.t_low is not None:
            out.update(t_low=self.t_low, t_high=self.t_high)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Interval:
        return cls(d["mean"], d["low"], d["high"], d["n"], d.get("interval_method", "t"),
                   d.get("t_low"), d.get("t_high"))  # fmt: skip


def _finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


@dataclass(frozen=True)
class Kind:
    """What a metric is: ``bounded`` (in ``[lo, hi]``), ``count`` (out of the figure
    ``n_key``), ``unbounded`` or ``judge_rows`` (per-row outcomes in the figure ``rows_key``);
    ``worst``: the value a collapsed seed counts as (None: no finite worst)."""

    name: str
    lo: float = -math.inf
    hi: float = math.inf
    worst: float | None = None
    n_key: str = ""
    rows_key: str = ""


def bounded(lo: float, hi: float, *, worst: float | None = None) -> Kind:
    return Kind("bounded", lo, hi, lo if worst is None else worst)


def count(n_key: str, *, worst: float = 0.0) -> Kind:
    return Kind("count", 0.0, 1.0, worst, n_key=n_key)


def judge_rows(rows_key: str = "rows", *, worst: float = 0.0) -> Kind:
    return Kind("judge_rows", 0.0, 1.0, worst, rows_key=rows_key)


def unbounded(*, worst: float | None = None) -> Kind:
    return Kind("unbounded", worst=worst)


# a metric no paper declared: the t-interval over the seeds that have a finite value (the rule
# before kinds; a NaN there often means "not measured for this arm", e.g. rft's pseudo-labels)
UNDECLARED = Kind("undeclared")


def apply_collapse_rule(
    values: Sequence[float | None], kind: Kind, collapsed: Sequence[bool] | None = None
) -> list[float]:
    """The registered rule: a seed whose value is NaN / inf or that is flagged ``collapsed``
    counts as ``kind.worst`` (NaN when the kind has none); a seed is never dropped. ``None``
    (the metric was not measured for this arm) stays out."""
    flags = list(collapsed) if collapsed is not None else [False] * len(values)
    out = []
    for value, flag in zip(values, flags, strict=True):
        if value is None:
            continue
        bad = flag or not math.isfinite(float(value))
        out.append((math.nan if kind.worst is None else kind.worst) if bad else float(value))
    return out


def bootstrap_interval(values: Sequence[float], lo: float, hi: float) -> Interval:
    """Mean and percentile-bootstrap 95 % interval of ``values`` (seeds), clipped to
    ``[lo, hi]`` (a guard only: a percentile interval of means stays within the data)."""
    xs = np.asarray(values, dtype=float)
    if xs.size == 0 or not np.isfinite(xs).all():
        return Interval(math.nan, math.nan, math.nan, int(xs.size), "percentile bootstrap")
    mean = float(xs.mean())
    if xs.size == 1 or np.ptp(xs) == 0:
        return Interval(mean, mean, mean, int(xs.size), "percentile bootstrap")
    res = stats.bootstrap((xs,), np.mean, n_resamples=RESAMPLES, method="percentile",
                          rng=np.random.default_rng(BOOTSTRAP_SEED))  # fmt: skip
    low, high = res.confidence_interval
    return Interval(mean, max(lo, float(low)), min(hi, float(high)), int(xs.size),
                    "percentile bootstrap")  # fmt: skip


def binomial_interval(successes: int, trials: int) -> Interval:
    """The rate ``successes / trials`` and its exact (Clopper-Pearson) 95 % interval."""
    if trials <= 0:
        return Interval(math.nan, math.nan, math.nan, 0, "exact binomial")
    ci = stats.binomtest(successes, trials).proportion_ci(confidence_level=0.95, method="exact")
    return Interval(successes / trials, float(ci.low), float(ci.high), trials, "exact binomial")


def seed_difference(diffs: Sequence[float], kind: Kind) -> Interval:
    """The interval of per-seed paired differences of a metric of ``kind``: the t-interval for
    an unbounded (or undeclared) metric, else a percentile bootstrap with the t-interval beside
    it; undefined (NaN) when a difference is (a collapsed seed of a metric with no worst)."""
    if any(math.isnan(d) for d in diffs):
        return Interval(math.nan, math.nan, math.nan, len(diffs), "undefined (collapsed seed)")
    if kind.name in ("unbounded", "undeclared"):
        return Interval.of(diffs)
    width = kind.hi - kind.lo
    boot = bootstrap_interval(diffs, -width, width)
    t = Interval.of(diffs)
    return Interval(boot.mean, boot.low, boot.high, boot.n, boot.method, t.low, t.high)


RowOutcomes = Mapping[Any, Mapping[str, float]]  # seed -> row id -> outcome (1.0 right)


def clustered_difference(
    treatment: RowOutcomes, baseline: RowOutcomes, clusters: Mapping[str, str] | None = None
) -> Interval:
    """Treatment minus baseline, the mean over rows and the seeds both arms have, with a
    percentile-bootstrap 95 % interval that resamples clusters of rows (``clusters``: row id ->
    cluster, e.g. the pair a row shows in one order; default: each row its own cluster) with
    replacement, the same resampled rows for every seed and both arms. ``n``: the seeds. With
    two or more seeds the t-interval of the per-seed differences (each the mean over the rows)
    goes beside it (``t_low`` / ``t_high``): a verdict needs both to exclude 0."""
    seeds = sorted(set(treatment) & set(baseline), key=str)
    rows = sorted(set.intersection(*(set(treatment[s]) & set(baseline[s]) for s in seeds))
                  if seeds else set())  # fmt: skip
    method = "pair-clustered bootstrap"
    if not rows:
        return Interval(math.nan, math.nan, math.nan, 0, method)
    diff = np.array([[treatment[s][r] - baseline[s][r] for r in rows] for s in seeds], float)
    by_cluster: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_cluster.setdefault((clusters or {}).get(r, r), []).append(i)
    totals = np.array([diff[:, idx].sum() for idx in by_cluster.values()])
    sizes = np.array([diff.shape[0] * len(idx) for idx in by_cluster.values()], float)
    mean = float(totals.sum() / sizes.sum())
    if len(totals) < 2 or np.ptp(totals / sizes) == 0:
        return Interval(mean, mean, mean, len(seeds), method)  # every row the same difference

    def ratio(t: np.ndarray, s: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.asarray(t.sum(axis=axis) / s.sum(axis=axis))

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    res = stats.bootstrap((totals, sizes), ratio, paired=True, n_resamples=RESAMPLES,
                          method="percentile", rng=rng)  # fmt: skip
    low, high = res.confidence_interval
    t = Interval.of([float(d) for d in diff.mean(axis=1)]) if len(seeds) >= 2 else None
    return Interval(mean, float(low), float(high), len(seeds), method,
                    None if t is None else t.low, None if t is None else t.high)  # fmt: skip


# ------------------------------------------------------------------ per arm, per difference
Figures = Mapping[str, Any]


def _values(by_seed: Sequence[Figures], metric: str, kind: Kind) -> list[float]:
    return apply_collapse_rule([f.get(metric) for f in by_seed], kind,
                               [bool(f.get("collapsed")) for f in by_seed])  # fmt: skip


def row_outcomes(by_seed: Mapping[Any, Figures], rows_key: str) -> tuple[dict, dict[str, str]]:
    """Seed -> row id -> 1.0 / 0.0 (right or not) from each seed's ``rows_key`` list, and row
    id -> its cluster (``family``, the pair); seeds without rows are left out."""
    outcomes: dict[Any, dict[str, float]] = {}
    clusters: dict[str, str] = {}
    for seed, figures in by_seed.items():
        rows = figures.get(rows_key)
        if not rows:
            continue
        outcomes[seed] = {str(r["id"]): float(bool(r["right"])) for r in rows}
        clusters.update({str(r["id"]): str(r.get("family", r["id"])) for r in rows})
    return outcomes, clusters


def arm_interval(by_seed: Mapping[Any, Figures], metric: str, kind: Kind) -> Interval:
    """The interval of one arm's ``metric`` over its seeds, drawn as ``kind`` asks."""
    figures = list(by_seed.values())
    if kind.name == "judge_rows":
        outcomes, clusters = row_outcomes(by_seed, kind.rows_key)
        if outcomes and len(outcomes) == len(figures):
            zeros = {s: dict.fromkeys(rows, 0.0) for s, rows in outcomes.items()}
            return clustered_difference(outcomes, zeros, clusters)
        kind = bounded(kind.lo, kind.hi, worst=kind.worst)
    if kind.name == "undeclared":
        return Interval.of([f.get(metric) for f in figures])
    values = _values(figures, metric, kind)
    if kind.name == "unbounded":
        return seed_difference(values, kind)  # the t-interval of the values themselves
    if kind.name == "count" and any(kind.n_key not in f for f in figures):
        kind = bounded(kind.lo, kind.hi, worst=kind.worst)  # a cache made before n was kept
    if kind.name == "count":
        trials = [int(f[kind.n_key]) for f in figures if f.get(metric) is not None]
        wins = sum(round(v * n) for v, n in zip(values, trials, strict=True))
        return binomial_interval(wins, sum(trials))
    return bootstrap_interval(values, kind.lo, kind.hi)


def difference(
    runs: Mapping[str, Mapping[Any, Figures]], metric: str, treatment: str, baseline: str,
    kind: Kind,
) -> Interval:  # fmt: skip
    """``metric`` of treatment minus baseline over the seeds both arms have: for per-row judge
    outcomes on every seed the pair-clustered bootstrap, else the per-seed paired differences
    (collapse rule applied to each arm) with the interval of :func:`seed_difference`."""
    a, b = runs.get(treatment, {}), runs.get(baseline, {})
    seeds = sorted(set(a) & set(b), key=str)
    if kind.name == "judge_rows":
        rows_a, clusters = row_outcomes({s: a[s] for s in seeds}, kind.rows_key)
        rows_b, _ = row_outcomes({s: b[s] for s in seeds}, kind.rows_key)
        if seeds and len(rows_a) == len(rows_b) == len(seeds):
            return clustered_difference(rows_a, rows_b, clusters)
        kind = bounded(kind.lo, kind.hi, worst=kind.worst)
    seeds = [s for s in seeds if a[s].get(metric) is not None and b[s].get(metric) is not None]
    if kind.name == "undeclared":
        return Interval.of([a[s][metric] - b[s][metric] for s in seeds])
    xs = _values([a[s] for s in seeds], metric, kind)
    ys = _values([b[s] for s in seeds], metric, kind)
    return seed_difference([x - y for x, y in zip(xs, ys, strict=True)], kind)
