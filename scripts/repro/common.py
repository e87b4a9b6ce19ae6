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
import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from repro.intervals import UNDECLARED, Interval, Kind, arm_interval, difference, t975

__all__ = ["Interval", "t975"]  # re-exported: the papers and tests read them from here

Figures = dict[str, Any]


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
    runs: dict[str, dict[int, Figures]], metric: str, treatment: str, baseline: str,
    kind: Kind = UNDECLARED,
) -> Interval:  # fmt: skip
    """95 % interval of ``metric`` (treatment - baseline) over the seeds both arms finished,
    drawn as the metric's ``kind`` asks (:mod:`repro.intervals`; default: the t-interval)."""
    return difference(runs, metric, treatment, baseline, kind)


def verdict(diff: Interval, direction: int, *, precheck_go: bool = True) -> str:
    """``reproduced`` when the interval excludes 0 on the expected side (for a percentile
    bootstrap over seeds, the t-interval beside it too: ``Interval.excludes_zero``),
    ``opposite`` when it excludes 0 on the other, ``not shown`` otherwise; ``too few seeds``
    under 2 paired seeds; ``not testable`` when the pre-check said no."""
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
    ``budget_minutes`` is the stated wall time alone on 2 cores (cpu) or one GPU (gpu).
    ``forcible`` False: the rule registered no ``--force`` past a failed gate (refused)."""

    name: str
    seeds: tuple[int, ...]
    budget_minutes: float
    settings: dict[str, Any] = field(default_factory=dict)
    forcible: bool = True
    # the registered rule's seed count (fewer: "too few seeds") and positive control
    # (treatment, baseline) whose difference must exclude 0 on the positive side, else the
    # primary is "not testable"; neither is a setting, so neither changes the fingerprint
    verdict_seeds: int = 2
    control: tuple[str, str] | None = None

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
    presets: ClassVar[dict[str, Preset]]
    # scalar figures shown in the table (others still go to the JSON), with their formats
    table_metrics: tuple[str, ...] = ()
    # curve names drawn in the PNG, one panel each
    curve_keys: tuple[str, ...] = ()
    # the x axis of a curve that is not over training steps (default "step")
    curve_xlabels: ClassVar[dict[str, str]] = {}
    # each metric's kind, which picks its interval (repro.intervals); undeclared: t-interval
    metric_kinds: ClassVar[dict[str, Kind]] = {}
    # arm -> figures it does not measure (left out of its summary and differences, not scored
    # by the collapse rule as the worst value)
    not_measured: ClassVar[dict[str, tuple[str, ...]]] = {}

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


def summarize(
    paper: Paper, runs: dict[str, dict[int, Figures]], precheck: Figures,
    preset: Preset | None = None,
) -> Figures:  # fmt: skip
    """Per arm and scalar figure: the interval over seeds; the primary paired difference, its
    verdict, and paired differences of every table metric against the primary baseline; each
    interval drawn as the metric's declared kind asks (``interval_method`` says which)."""
    kinds = paper.metric_kinds
    runs = {
        arm: {s: {k: v for k, v in f.items() if k not in paper.not_measured.get(arm, ())}
              for s, f in by_seed.items()}
        for arm, by_seed in runs.items()
    }  # fmt: skip
    arms: dict[str, dict[str, Any]] = {}
    for arm, by_seed in runs.items():
        keys = sorted({k for f in by_seed.values() for k, v in f.items() if _is_scalar(v)})
        arms[arm] = {k: arm_interval(by_seed, k, kinds.get(k, UNDECLARED)).as_dict() for k in keys}
    p = paper.primary
    diff = paired_difference(
        runs, p.metric, p.treatment, p.baseline, kinds.get(p.metric, UNDECLARED)
    )
    diffs = {
        f"{arm} - {p.baseline}": {
            m: paired_difference(runs, m, arm, p.baseline, kinds.get(m, UNDECLARED)).as_dict()
            for m in paper.table_metrics
        }
        for arm in runs
        if arm != p.baseline
    }
    summary: dict[str, Any] = {
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
    if preset is not None:
        apply_registered_rule(summary, preset, runs, kinds.get(p.metric, UNDECLARED))
    return summary


def apply_registered_rule(summary: dict[str, Any], preset: Preset,
                          runs: dict[str, dict[int, Figures]], kind: Kind) -> None:  # fmt: skip
    """A preset's own rule on top of the verdict: its seed count, then its positive control
    (kept in ``summary["control"]``)."""
    primary = summary["primary"]
    control = None
    if preset.control is not None and preset.control[0] in runs:
        treatment, baseline = preset.control  # recorded whatever the verdict, read beside it
        control = paired_difference(runs, primary["metric"], treatment, baseline, kind)
        summary["control"] = {"treatment": treatment, "baseline": baseline, **control.as_dict()}
    if primary["verdict"].startswith("not testable"):
        return
    if primary["difference"].get("n", 0) < preset.verdict_seeds:
        primary["verdict"] = f"too few seeds (the rule registered {preset.verdict_seeds})"
        return
    if preset.control is None:
        return
    treatment, baseline = preset.control
    if control is None:
        primary["verdict"] = f"no verdict: the registered control {treatment} did not run"
    elif not (control.excludes_zero() and control.mean > 0):
        primary["verdict"] = (f"not testable at this scale: the control {treatment} - "
                              f"{baseline} does not exclude 0 on the positive side")  # fmt: skip


def _is_scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def results_markdown(
    paper: Paper, summary: Figures, precheck: Figures, seeds: Sequence[int]
) -> str:
    """The table (one row per arm, mean [95 % interval] over seeds per table metric), the paired
    differences against the baseline, the primary verdict and the pre-check's figures."""
    metrics = paper.table_metrics
    lines = [f"# {paper.title}", "", f"Seeds {list(seeds)}; cells: mean [95 % interval]: "
             f"t, or as the metric's kind asks ({_methods(paper)})."]  # fmt: skip
    columns = (*metrics, "seconds")  # wall time per run; each result.json has its load beside it
    lines += ["", "| arm | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for arm, figures in summary["arms"].items():
        cells = [Interval.from_dict(figures[m]).cell() if m in figures else "n/a" for m in columns]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "Paired differences against the baseline (same seeds):", ""]
    lines += ["| difference | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for name, by_metric in summary["differences"].items():
        cells = [Interval.from_dict(by_metric[m]).cell() for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    p = summary["primary"]
    sign = "> 0" if p["direction"] > 0 else "< 0"
    lines += [
        "",
        f"Primary: `{p['metric']}`, {p['treatment']} - {p['baseline']} expected {sign}; "
        f"rule: {p['rule']}. Difference {Interval.from_dict(p['difference']).cell()} "
        f"({p['difference'].get('interval_method', 't')}{_t_beside(p['difference'])}): "
        f"**{p['verdict']}**.",
        "",
        f"Pre-check: go = {precheck.get('go')} ({precheck.get('reason')}).",
    ]
    return "\n".join(lines) + "\n"


def _t_beside(d: dict[str, Any]) -> str:
    """The t-interval a bootstrap over seeds is judged beside (``Interval.excludes_zero``)."""
    if d.get("t_low") is None:
        return ""
    return f"; the verdict also needs its t-interval [{d['t_low']:.3f}, {d['t_high']:.3f}]"


def _methods(paper: Paper) -> str:
    kinds = paper.metric_kinds
    return "; ".join(f"`{m}` {k.name}" for m, k in kinds.items()) or "none declared"


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


def git_commit() -> str:
    """``git rev-parse HEAD`` of the checkout the scripts run from ("unknown" outside git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def docs_json(paper: Paper, docs: Path, preset: str = "cpu") -> Path:
    """Where a preset's ``results.json`` is copied: ``<docs>/<page stem>_<paper>.json`` for the
    cpu and gpu presets, ``<docs>/<page stem>_<paper>_<preset>.json`` for a paper's others."""
    tail = "" if preset in ("cpu", "gpu") else "_" + preset.replace("-", "_")
    return docs / f"{Path(paper.doc).stem}_{paper.name}{tail}.json"


def write_outputs(
    paper: Paper, ctx: Context, runs: dict[str, dict[int, Figures]], precheck: Figures,
    docs: Path | None = None,
) -> Figures:  # fmt: skip
    """``results.md``, ``results.json`` (every figure: pre-check, each run with its per-seed
    values and, for the judges, per-row outputs; the summary; the settings, their fingerprint and
    the git commit) and ``<paper>.png`` under the preset folder; with ``docs``, ``results.json``
    is also copied to :func:`docs_json` (the record beside the page's PNG). Returns the
    summary."""
    summary = summarize(paper, runs, precheck, ctx.preset)
    seeds = sorted({s for by_seed in runs.values() for s in by_seed})
    (ctx.out / "results.md").write_text(results_markdown(paper, summary, precheck, seeds))
    everything = {
        "paper": paper.name,
        "preset": ctx.preset.name,
        "settings": ctx.settings,
        "fingerprint": ctx.preset.fingerprint(),
        "commit": git_commit(),
        "seeds": seeds,
        "metric_kinds": {m: vars(k) for m, k in paper.metric_kinds.items()},
        "precheck": precheck,
        "runs": {arm: {str(s): f for s, f in by_seed.items()} for arm, by_seed in runs.items()},
        "summary": summary,
    }
    _write_json(ctx.out / "results.json", everything)
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ctx.out / "results.json", docs_json(paper, docs, ctx.preset.name))
    if runs:
        paper.plot(runs, ctx.out / f"{paper.name}.png")
    return summary


def choose_preset(paper: Paper, opts: Any) -> Preset:
    """``reproduce.py``'s choices checked against the paper (``opts``: its parsed arguments):
    known arms, distinct seeds, a preset the paper has (``smoke`` only by ``--smoke``), no
    ``--force`` where the preset's rule registered none; each refusal names the fix."""
    unknown = sorted(set(opts.arms or []) - set(paper.arms))
    if unknown:
        raise SystemExit(f"reproduce.py: unknown arms {unknown}; {paper.name} has {paper.arms}")
    if opts.seeds is not None and len(set(opts.seeds)) != len(opts.seeds):
        raise SystemExit(f"reproduce.py: --seeds repeats a seed: {opts.seeds}")
    if opts.preset not in paper.presets or (opts.preset == "smoke" and not opts.smoke):
        named = sorted(set(paper.presets) - {"smoke"})
        raise SystemExit(f"reproduce.py: {paper.name} has no preset {opts.preset!r}; choose "
                         f"one of {named} (or --smoke)")  # fmt: skip
    preset = paper.presets[opts.preset]
    if opts.force and not preset.forcible:
        why = "a failed gate is its verdict (see its page)"
        raise SystemExit(f"reproduce.py: {paper.name}'s preset {preset.name!r} registered its "
                         f"gate without --force: {why}")  # fmt: skip
    return preset
