"""The shared half of ``scripts/reproduce.py``: what a paper's comparison declares (``Paper``), the
per-(paper, arm, seed) result cache that lets a preset stop anywhere and resume, seed statistics
(mean and 95 % Student-t interval, paired arm differences), the verdict rule, and the table, JSON
and PNG every paper writes.

A paper module (``scripts/repro/<paper>.py``) defines one ``Paper`` subclass: its arms, presets,
primary metric with the expected direction, a ``precheck`` (cheap, run once per preset, decides
whether the arms are worth running) and ``run_arm`` (one arm for one seed, returning its figures).
Figures are a flat ``{name: float}`` plus optional curves ``{name: [[step, value], ...]}``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

# Two-sided 95 % Student-t critical values t_{0.975, df} for df = 1..30 (standard table values);
# above 30 the normal 1.96 is within 2 %.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

Figures = dict[str, Any]


def t975(df: int) -> float:
    """The two-sided 95 % Student-t critical value for ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t975 needs df >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Interval:
    """Mean and 95 % interval of per-seed values (``low == high == mean`` for one value)."""

    mean: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Interval:
        xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
        if not xs:
            return cls(math.nan, math.nan, math.nan, 0)
        mean = statistics.fmean(xs)
        if len(xs) == 1:
            return cls(mean, mean, mean, 1)
        half = t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
        return cls(mean, mean - half, mean + half, len(xs))

    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)

    def cell(self, fmt: str = ".3f") -> str:
        if self.n == 0:
            return "n/a"
        if self.n == 1:
            return f"{self.mean:{fmt}} (1 seed)"
        return f"{self.mean:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"

    def as_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


@dataclass(frozen=True)
class Primary:
    """The figure a paper's verdict rests on: ``metric`` of ``treatment`` minus ``baseline``,
    paired by seed; ``direction`` +1 when the paper expects the difference to be positive."""

    metric: str
    treatment: str
    baseline: str
    direction: int
    rule: str = "the 95 % interval of the paired difference (treatment - baseline) excludes 0"

    def __post_init__(self) -> None:
        if self.direction not in (1, -1):
            raise ValueError(f"Primary.direction must be +1 or -1, got {self.direction}")


def paired_difference(
    runs: dict[str, dict[int, Figures]], metric: str, treatment: str, baseline: str
) -> Interval:
    """95 % interval of ``metric`` (treatment - baseline) over the seeds both arms finished."""
    a, b = runs.get(treatment, {}), runs.get(baseline, {})
    diffs = [
        a[s][metric] - b[s][metric]
        for s in sorted(set(a) & set(b))
        if a[s].get(metric) is not None and b[s].get(metric) is not None
    ]
    return Interval.of(diffs)


def verdict(diff: Interval, direction: int, *, precheck_go: bool = True) -> str:
    """``reproduced`` when the interval excludes 0 on the expected side, ``opposite`` when it
    excludes 0 on the other, ``not shown`` otherwise; ``too few seeds`` under 2 paired seeds;
    ``not testable`` when the pre-check said no."""
    if not precheck_go:
        return "not testable (pre-check failed)"
    if diff.n < 2:
        return "too few seeds"
    if not diff.excludes_zero():
        return "not shown"
    return "reproduced" if (diff.mean > 0) == (direction > 0) else "opposite"


@dataclass
class Preset:
    """One scale of a comparison. ``settings`` are the paper's own knobs (steps, configs, sizes);
    ``budget_minutes`` is the stated wall time alone on 2 cores (cpu) or one GPU (gpu)."""

    name: str
    seeds: tuple[int, ...]
    budget_minutes: float
    settings: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        blob = json.dumps(self.settings, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:12]


class Context:
    """What a paper's ``precheck`` / ``run_arm`` get: the preset, its folder, a log function."""

    def __init__(self, paper: str, preset: Preset, out: Path) -> None:
        self.paper = paper
        self.preset = preset
        self.settings = preset.settings
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def run_dir(self, arm: str, seed: int) -> Path:
        path = self.out / arm / f"seed{seed}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def log(self, message: str) -> None:
        print(
            f"[{self.paper}/{self.preset.name} {time.strftime('%H:%M:%S')}] {message}", flush=True
        )


class Paper:
    """One paper's comparison. Subclasses set the class attributes and implement the methods."""

    name: str = ""
    title: str = ""
    doc: str = ""  # the docs page the results go to
    arms: tuple[str, ...] = ()
    primary: Primary
    presets: dict[str, Preset]
    # scalar figures shown in the table (others still go to the JSON), with their formats
    table_metrics: tuple[str, ...] = ()
    # curve names drawn in the PNG, one panel each
    curve_keys: tuple[str, ...] = ()
    # the x axis of a curve that is not over training steps (default "step")
    curve_xlabels: ClassVar[dict[str, str]] = {}

    def precheck(self, ctx: Context) -> Figures:
        """Cheap figures that decide whether the arms can show the mechanism; must hold
        ``go`` (bool) and ``reason`` (str)."""
        raise NotImplementedError

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        """Train/evaluate ``arm`` for ``seed``; return its scalar figures and ``curves``."""
        raise NotImplementedError

    def plot(self, runs: dict[str, dict[int, Figures]], path: Path) -> None:
        """The PNG: by default one panel per ``curve_keys`` (:func:`plot_curves`); a paper
        whose figures are not curves over steps draws its own."""
        if self.curve_keys:
            plot_curves(self, runs, path)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    os.replace(tmp, path)


def _read_cached(path: Path, fingerprint: str) -> Figures | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("fingerprint") != fingerprint:
        raise SystemExit(
            f"{path} was made with other settings (fingerprint {data.get('fingerprint')}, now "
            f"{fingerprint}); pass another --out or --fresh to recompute"
        )
    figures: Figures = data["figures"]
    return figures


def cached_precheck(paper: Paper, ctx: Context) -> Figures:
    """The pre-check's figures, computed once per preset folder."""
    path = ctx.out / "precheck.json"
    fingerprint = ctx.preset.fingerprint()
    found = _read_cached(path, fingerprint)
    if found is not None:
        ctx.log(f"pre-check cached in {path}")
        return found
    start = time.perf_counter()
    figures = paper.precheck(ctx)
    if "go" not in figures or "reason" not in figures:
        raise ValueError(f"{paper.name}.precheck must return 'go' and 'reason'")
    figures["seconds"] = time.perf_counter() - start
    _write_json(path, {"fingerprint": fingerprint, "figures": figures})
    return figures


def cached_run(paper: Paper, ctx: Context, arm: str, seed: int) -> Figures:
    """One (arm, seed): read from ``<out>/<arm>/seed<k>/result.json`` when finished before,
    else run it and write the file (atomically, so a stopped run leaves no half result)."""
    path = ctx.run_dir(arm, seed) / "result.json"
    fingerprint = ctx.preset.fingerprint()
    found = _read_cached(path, fingerprint)
    if found is not None:
        return found
    ctx.log(f"arm {arm}, seed {seed}")
    load_before, start = os.getloadavg()[0], time.perf_counter()
    figures = paper.run_arm(ctx, arm, seed)
    figures["seconds"] = time.perf_counter() - start
    # a wall time means something only with the machine's load beside it (1-minute averages)
    figures["load"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    _write_json(path, {"fingerprint": fingerprint, "figures": figures})
    ctx.log(f"arm {arm}, seed {seed}: done in {figures['seconds']:.0f} s")
    return figures


def summarize(paper: Paper, runs: dict[str, dict[int, Figures]], precheck: Figures) -> Figures:
    """Per arm and scalar figure: the interval over seeds; the primary paired difference, its
    verdict, and paired differences of every table metric against the primary baseline."""
    arms: dict[str, dict[str, Any]] = {}
    for arm, by_seed in runs.items():
        keys = sorted({k for f in by_seed.values() for k, v in f.items() if _is_scalar(v)})
        arms[arm] = {k: Interval.of([f.get(k) for f in by_seed.values()]).as_dict() for k in keys}
    p = paper.primary
    diff = paired_difference(runs, p.metric, p.treatment, p.baseline)
    diffs = {
        f"{arm} - {p.baseline}": {
            m: paired_difference(runs, m, arm, p.baseline).as_dict() for m in paper.table_metrics
        }
        for arm in runs
        if arm != p.baseline
    }
    return {
        "arms": arms,
        "primary": {
            "metric": p.metric,
            "treatment": p.treatment,
            "baseline": p.baseline,
            "direction": p.direction,
            "rule": p.rule,
            "difference": diff.as_dict(),
            "verdict": verdict(diff, p.direction, precheck_go=bool(precheck.get("go", True))),
        },
        "differences": diffs,
    }


def _is_scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _interval(d: dict[str, Any]) -> Interval:
    return Interval(d["mean"], d["low"], d["high"], d["n"])


def results_markdown(
    paper: Paper, summary: Figures, precheck: Figures, seeds: Sequence[int]
) -> str:
    """The table (one row per arm, mean [95 % interval] over seeds per table metric), the paired
    differences against the baseline, the primary verdict and the pre-check's figures."""
    metrics = paper.table_metrics
    lines = [f"# {paper.title}", "", f"Seeds {list(seeds)}; cells: mean [95 % t-interval]."]
    columns = (*metrics, "seconds")  # wall time per run; each result.json has its load beside it
    lines += ["", "| arm | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for arm, figures in summary["arms"].items():
        cells = [_interval(figures[m]).cell() if m in figures else "n/a" for m in columns]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences against the baseline (same seeds):", ""]
    lines += ["| difference | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, by_metric in summary["differences"].items():
        cells = [_interval(by_metric[m]).cell() for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    p = summary["primary"]
    sign = "> 0" if p["direction"] > 0 else "< 0"
    lines += [
        "",
        f"Primary: `{p['metric']}`, {p['treatment']} - {p['baseline']} expected {sign}; "
        f"rule: {p['rule']}. Difference {_interval(p['difference']).cell()}: "
        f"**{p['verdict']}**.",
        "",
        f"Pre-check: go = {precheck.get('go')} ({precheck.get('reason')}).",
    ]
    return "\n".join(lines) + "\n"


def plot_curves(paper: Paper, runs: dict[str, dict[int, Figures]], path: Path) -> None:
    """One panel per ``paper.curve_keys``: per arm the mean over seeds at each step, with the
    per-step min..max over seeds shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = paper.curve_keys
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(4.5 * max(len(keys), 1), 3.4))
    axes = list(axes) if len(keys) > 1 else [axes]
    for ax, key in zip(axes, keys, strict=False):
        for colour, (arm, by_seed) in enumerate(runs.items()):
            by_step: dict[float, list[float]] = {}
            for figures in by_seed.values():
                for step, value in figures.get("curves", {}).get(key, []):
                    by_step.setdefault(step, []).append(value)
            if not by_step:
                continue
            steps = sorted(by_step)
            mean = [statistics.fmean(by_step[s]) for s in steps]
            ax.plot(steps, mean, color=f"C{colour}", label=arm, marker=".")
            lo = [min(by_step[s]) for s in steps]
            hi = [max(by_step[s]) for s in steps]
            ax.fill_between(steps, lo, hi, color=f"C{colour}", alpha=0.15)
        ax.set_title(key, fontsize=9)
        low, high = ax.get_ylim()
        if high - low < 1e-3:  # a flat curve reads as flat, not as float rounding zoomed in
            ax.set_ylim((low + high) / 2 - 0.05, (low + high) / 2 + 0.05)
        ax.set_xlabel(paper.curve_xlabels.get(key, "step"))
        ax.grid(alpha=0.3)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(
    paper: Paper, ctx: Context, runs: dict[str, dict[int, Figures]], precheck: Figures
) -> Figures:
    """``results.md``, ``results.json`` (every figure: pre-check, each run, the summary) and
    ``<paper>.png`` under the preset folder; returns the summary."""
    summary = summarize(paper, runs, precheck)
    seeds = sorted({s for by_seed in runs.values() for s in by_seed})
    (ctx.out / "results.md").write_text(results_markdown(paper, summary, precheck, seeds))
    everything = {
        "paper": paper.name,
        "preset": ctx.preset.name,
        "settings": ctx.settings,
        "precheck": precheck,
        "runs": {arm: {str(s): f for s, f in by_seed.items()} for arm, by_seed in runs.items()},
        "summary": summary,
    }
    _write_json(ctx.out / "results.json", everything)
    if runs:
        paper.plot(runs, ctx.out / f"{paper.name}.png")
    return summary
