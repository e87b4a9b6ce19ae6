"""ReflectRM (arXiv 2604.07506) at CPU scale: on a warm judge that is above chance but not
saturated and still position-biased, does two-stage reflective inference beat the majority of
the same 8 samples, and does confidence pick the better analysis?

The judge and its warm start are ConsistRM's (:mod:`repro.judge_common`; the warm start mixes
in analysis-preference rows, one per two pairs, so the judge can compare two analyses). Per
seed, ONE set of 8 sampled judgments per held-out row gives majority-of-8 and reflective-of-8
(the seed draws the samples and the reflection order); greedy is one judgment. The arms
``greedy`` / ``majority`` / ``reflective`` read their accuracy from that one set (cached per
seed), so their paired differences compare inference rules, not sample draws. The mechanism
figure: the anchor's accuracy (the most confident sample, by the mean log-prob of its lowest
10 % tokens) against a random sample's (the mean accuracy over the 8).

The unified training arm (``mode: reflectrm`` against RFT from the same warm start) is left
out of the CPU preset: the pre-check's inference alone takes its budget (docs/grm.md).

The PNG has three panels, each with its own figures: accuracy and positional consistency per
inference rule, and a random sample's accuracy against the anchor's; per seed a point, and
the mean with its 95 % t-interval. Redraw it from a runner's ``results.json`` or from a JSON of
figure rows (``docs/history/grm_reflectrm.json``, made from the tables now in docs/history/grm.md):

    python scripts/repro/reflectrm.py --replot docs/history/grm_reflectrm.json   # -> its .png
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/
from repro import judge_common as jc
from repro.common import Context, Figures, Interval, Paper, Preset, Primary
from repro.consistrm import _settings
from repro.intervals import Kind, bounded, judge_rows
from repro.judge_records import RULES, row_outputs

INFERENCE_ARMS = ("greedy", "majority", "reflective")


PRESETS: dict[str, Preset] = {
    "cpu": Preset("cpu", (0, 1, 2), 60, _settings()),
    "gpu": Preset("gpu", (0, 1, 2), 60 * 24, {
        "config": "configs/grm/reflectrm_qwen3-4b.yaml",
        "trainer": "configs/trainer/deepspeed_zero3.yaml",
        "rft": "configs/grm/rft_qwen3-8b.yaml"}),
    "smoke": Preset("smoke", (0, 1), 1, _settings(
        model="builtin:tiny-llama", sft_config="configs/sft/tiny.yaml", in_process=True,
        pools={"warm": 4, "unlabelled": 0, "eval": 2}, sft_steps=1, sft_lr=1e-3,
        samples=2, max_new_tokens=6, full_judgments=False)),
}  # fmt: skip


class ReflectRM(Paper):
    name = "reflectrm"
    title = "ReflectRM: reflective vs majority inference of a warm judge (arXiv 2604.07506)"
    doc = "docs/grm.md"
    arms = INFERENCE_ARMS
    primary = Primary("accuracy", "reflective", "majority", +1)
    presets = PRESETS
    # the primary: per-row outcomes on the fixed held-out rows (pair-clustered bootstrap pooled
    # over seeds); the other rates are bounded in [0, 1] (percentile bootstrap over seeds)
    metric_kinds: ClassVar[dict[str, Kind]] = {
        "accuracy": judge_rows("rows"),
        **{m: bounded(0.0, 1.0) for m in ("positional_consistency", "anchor_accuracy",
                                          "random_sample_accuracy")},
    }  # fmt: skip
    table_metrics = ("accuracy", "positional_consistency", "anchor_accuracy",
                     "random_sample_accuracy")  # fmt: skip
    # no curves over steps: the PNG is drawn by ``plot`` (below) from the scalar figures

    def precheck(self, ctx: Context) -> Figures:
        """The warm judge (cached), then its greedy / majority / reflective figures on the
        held-out pairs for seed 0; go when it is above chance, not saturated (greedy accuracy
        in (0.55, 0.95)) and positionally inconsistent (consistency below accuracy)."""
        if ctx.preset.name == "gpu":
            return {"go": True, "reason": "the authors' recipe (Qwen3-4B)"}
        s = ctx.settings
        pools = jc.make_pools(s["pools"], seed=0, max_value=s["max_value"])
        jc.write_pairs(pools["eval"], ctx.out / "pools" / "eval.jsonl")
        _, sft_seconds = jc.warm_start(ctx.out, pools["warm"], s, log=ctx.log)
        figures: Figures = {**self._inference(ctx, 0), "sft_seconds": sft_seconds}
        acc, cons = figures["greedy_accuracy"], figures["greedy_consistency"]
        figures["go"] = ctx.preset.name == "smoke" or (0.55 < acc < 0.95 and cons < acc)
        figures["reason"] = (
            f"warm judge greedy accuracy {acc:.3f}, positional consistency {cons:.3f}, "
            f"says response 1 {figures['greedy_first_rate']:.2f} of the time"
        )
        return figures

    def _inference(self, ctx: Context, seed: int) -> Figures:
        """Every inference figure of the warm judge for ``seed`` (one set of samples), cached
        in ``<out>/inference-seed<k>.json`` so the three arms share it."""
        path = ctx.out / f"inference-seed{seed}.json"
        if path.exists():
            cached: Figures = json.loads(path.read_text())
            return cached
        s = ctx.settings
        judged = jc.judge_pool(
            jc.warm_judge(ctx.out, s), ctx.out / "pools" / "eval.jsonl", samples=s["samples"],
            seed=seed, max_new_tokens=s["max_new_tokens"], batch_size=s["eval_batch_size"],
        )  # fmt: skip
        figures: Figures = dict(jc.inference_figures(judged))
        # the per-row outputs (issue 40 item 5): what each rule said on each row, and the anchor
        figures["rows"] = {rule: row_outputs(judged, rule) for rule in (*RULES, "anchor")}
        path.write_text(json.dumps(figures, indent=1))
        return figures

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        if ctx.preset.name == "gpu":
            raise SystemExit("the gpu preset runs the authors' recipe: see docs/grm.md")
        figures = self._inference(ctx, seed)
        keep: dict[str, Any] = {
            k: v for k, v in figures.items() if not k.startswith(arm) and k != "rows"
        }
        rows = figures.get("rows", {})  # absent in an inference cache made before rows were kept
        extra = {"rows": rows[arm], "anchor_rows": rows["anchor"]} if rows else {}
        return {
            **keep,
            **extra,
            "accuracy": figures[f"{arm}_accuracy"],
            "positional_consistency": figures[f"{arm}_consistency"],
        }

    def plot(self, runs: dict[str, dict[int, Figures]], path: Path) -> None:
        plot_rows(figure_rows(runs), path)


PAPER = ReflectRM()

# ------------------------------------------------------------------ the figure
PANELS = {
    "accuracy": "accuracy per inference rule",
    "positional_consistency": "positional consistency per inference rule",
    "mechanism": "accuracy: a random sample's vs the anchor's",
}
RULE_LABELS = {"greedy": "greedy", "majority": "majority-of-8", "reflective": "reflective-of-8"}


def figure_rows(runs: dict[str, dict[int, Figures]]) -> list[dict[str, Any]]:
    """The PNG's points from the runner's runs (seeds as ints or, from ``results.json``, as
    strings): one row per (panel, label) with the per-seed values, their mean and 95 %
    t-interval. The anchor and a random sample come from the seed's one set of samples, so any
    arm's figures give them."""
    rows: list[dict[str, Any]] = []

    def add(panel: str, label: str, seeds: dict[str, float]) -> None:
        if seeds:
            iv = Interval.of(list(seeds.values()))
            rows.append({"panel": panel, "label": label, "seeds": seeds,
                         "mean": iv.mean, "low": iv.low, "high": iv.high})  # fmt: skip

    for arm, label in RULE_LABELS.items():
        seeded = sorted(runs.get(arm, {}).items())
        for metric in ("accuracy", "positional_consistency"):
            add(metric, label, {str(s): f[metric] for s, f in seeded if metric in f})
    mechanism = {"random_sample_accuracy": "a random sample", "anchor_accuracy": "anchor"}
    for key, label in mechanism.items():
        seeds: dict[str, float] = {}
        for by_seed in runs.values():
            for s, f in by_seed.items():
                if key in f:
                    seeds.setdefault(str(s), f[key])
        add("mechanism", label, dict(sorted(seeds.items())))
    return rows


def plot_rows(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """One panel per ``PANELS`` entry that has rows, each drawing only its own rows: per label
    a point per seed (where ``seeds`` has it) and the mean with its 95 % interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in PANELS if any(r["panel"] == p for r in rows)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4.2 * max(len(panels), 1), 3.6))
    axes = list(axes) if len(panels) > 1 else [axes]
    all_seeds = sorted({s for r in rows for s in r.get("seeds", {})}, key=int)
    markers = "osD^v<>"
    for ax, panel in zip(axes, panels, strict=False):
        mine = [r for r in rows if r["panel"] == panel]
        labelled: set[str] = set()
        for x, row in enumerate(mine):
            below, above = max(row["mean"] - row["low"], 0), max(row["high"] - row["mean"], 0)
            ax.errorbar([x], [row["mean"]], yerr=[[below], [above]], color="black", marker="_",
                        markersize=22, capsize=6, linewidth=1.2,
                        label="mean, 95 % t-interval" if x == 0 else None)  # fmt: skip
            for i, seed in enumerate(all_seeds):
                if seed not in row.get("seeds", {}):
                    continue
                offset = (i - (len(all_seeds) - 1) / 2) * 0.1
                ax.scatter([x + offset], [row["seeds"][seed]], color=f"C{i}", s=22, zorder=3,
                           marker=markers[i % len(markers)],
                           label=None if seed in labelled else f"seed {seed}")  # fmt: skip
                labelled.add(seed)
        ax.set_xticks(range(len(mine)), [r["label"] for r in mine], fontsize=8)
        ax.set_xlim(-0.6, len(mine) - 0.4)
        ax.set_title(PANELS[panel], fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    # one legend for every panel (the same marks mean the same thing in each), below them
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
                   fontsize=8, frameon=False)  # fmt: skip
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="redraw the ReflectRM figure")
    parser.add_argument(
        "--replot", type=Path, required=True,
        help="a runner's results.json, or a JSON with the figure's rows",
    )  # fmt: skip
    parser.add_argument("--png", type=Path, help="default: the JSON's path with .png")
    opts = parser.parse_args(argv)
    data = json.loads(opts.replot.read_text())
    rows = figure_rows(data["runs"]) if "runs" in data else data["rows"]
    png = opts.png or opts.replot.with_suffix(".png")
    plot_rows(rows, png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
