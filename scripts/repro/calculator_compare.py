"""Calculator vs no tool: does the calculator example learn on CPU with the embedded SmolLM2, and
how does it compare with the same training without the tool?

    python scripts/repro/calculator_compare.py --task arithmetic --seeds 0 1   # both arms, 2 seeds
    python scripts/repro/calculator_compare.py --task countdown --seeds 0 1
    python scripts/repro/calculator_compare.py --seeds 0 --steps 2 --out /tmp/smoke   # smoke

Tasks (``--task``): ``arithmetic`` (two-digit products, ``configs/ppo/arithmetic_*_smollm2.yaml``,
``MathReward`` on ``\\boxed{}``: the calculator computes what the model cannot) and ``countdown``
(two numbers, + or -, ``configs/ppo/countdown_*_smollm2.yaml``: the calculator can check a sum,
the answer is an expression). Arms (the same tasks, seeds, batches, samples per prompt and
learning rate): ``calculator`` is the task's calculator config (up to 2 turns of 24 tokens, the
calculator answers ``<tool>calculator: EXPR</tool>``) started from its supervised warm start
(``configs/sft/<task>_calculator_smollm2.yaml``: 42 steps on demonstrations of which half call
the calculator, written by ``scripts/data/calculator_demos.py``); ``no_tool`` is the task's no-tool
config (single-turn, the question without the tool sentence, one turn of 48 tokens) started from
the same warm start on the same tasks answered at once. ``--arms`` adds the cold arms, PPO from
the embedded model itself: ``calculator_cold``, ``calculator_turn48_cold`` (48-token turns),
``no_tool_cold`` and ``no_tool_masked_cold`` (responses cut at the budget left out of the loss).
Per run: the training curves of reward, answer accuracy (``reward/correct``), format and tool-call
rate (``env/tool_calls``, calculator arms only), and each one's start (the mean of the first two
rollouts), first- and last-quarter means, and the rise (last quarter - start). Results, cached
per (arm, seed), go to ``<out>/<task>_steps<N>/`` (``results.md``, ``results.json``,
``calculator_compare.png``; the curve figures are recomputed from each run's ``metrics.csv`` on
every report); ``--docs`` copies the PNG and JSON to ``<docs>/agents_calculator_<task>.{png,json}``.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/
from repro.common import Context, Figures, Paper, Preset, Primary, cached_run, write_outputs
from repro.runs import read_rows, run_fragment, steps_and_values
from repro.tre_runs import run_cli

# task -> role -> (PPO config, SFT warm-start config)
TASKS = {
    "countdown": {
        "calculator": ("configs/ppo/countdown_calculator_smollm2.yaml",
                       "configs/sft/countdown_calculator_smollm2.yaml"),
        "no_tool": ("configs/ppo/countdown_notool_smollm2.yaml",
                    "configs/sft/countdown_notool_smollm2.yaml"),
    },
    "arithmetic": {
        "calculator": ("configs/ppo/arithmetic_calculator_smollm2.yaml",
                       "configs/sft/arithmetic_calculator_smollm2.yaml"),
        "no_tool": ("configs/ppo/arithmetic_notool_smollm2.yaml",
                    "configs/sft/arithmetic_notool_smollm2.yaml"),
    },
}  # fmt: skip
# arm -> (role, warm start: run the role's SFT stage first, model.init_args overrides).
# The warm-started arms start PPO from SFT on their own demonstrations (scripts/data/
# calculator_demos.py: the same held-apart tasks, half with the calculator or all without). The
# *_cold arms start from the embedded model itself. no_tool_masked leaves responses cut at the
# token budget out of the loss (DAPO's overlong filter), as the calculator arm does with cut
# episodes (env.budget_penalty: null). calculator_turn48 lets an agent turn run to 48 tokens.
ARMS: dict[str, tuple[str, bool, dict[str, Any]]] = {
    "calculator": ("calculator", True, {}),
    "no_tool": ("no_tool", True, {}),
    "calculator_cold": ("calculator", False, {}),
    "calculator_turn48_cold": ("calculator", False, {"engine": {"init_args": {"max_new_tokens": 48}}}),  # noqa: E501
    "no_tool_cold": ("no_tool", False, {}),
    "no_tool_masked_cold": ("no_tool", False, {"rollout": {"overlong_filter": True}}),
}  # fmt: skip
# figure name -> logged key or keys (the first one logged; per rollout step); env/* is logged by
# the calculator arms only
CURVES: dict[str, str | tuple[str, ...]] = {
    "reward": "reward/mean",
    "correct": "reward/correct",
    "format_ok": ("reward/format_ok", "reward/has_boxed"),  # Countdown's, MathReward's
    "tool_calls": "env/tool_calls",
    "cut": "env/cut",
    "truncated": "rollout/truncated",  # share of agent turns that hit a token budget
    "length": "rollout/response_length",
}
RISES = ("reward", "correct", "tool_calls")  # the figures whose start and quarters are tabled
PRECHECK = {
    "go": True,
    "reason": "none: every arm starts from the embedded model (the warm-started arms after SFT "
    "on their own demonstrations of the same tasks)",
}


def quarter_figures(values: list[float]) -> dict[str, float]:
    """``start``: the mean of the first two values (the first two rollouts: what the run starts
    from, before RL has moved much); ``first_q`` / ``last_q``: the means of the first and last
    quarter (at least one value each); ``rise``: ``last_q - start``. NaN for no values. E.g. 8
    values: the first 2 and the last 2."""
    if not values:
        return {"start": math.nan, "first_q": math.nan, "last_q": math.nan, "rise": math.nan}
    n = max(1, len(values) // 4)
    start = statistics.fmean(values[:2])
    first, last = statistics.fmean(values[:n]), statistics.fmean(values[-n:])
    return {"start": start, "first_q": first, "last_q": last, "rise": last - start}


def curve_figures(metrics_csv: Path) -> Figures:
    """The curves of :data:`CURVES` from a CSVLogger file, with quarter figures per curve."""
    rows = read_rows(metrics_csv)
    figures: Figures = {"curves": {}}
    for name, keys in CURVES.items():
        options = (keys,) if isinstance(keys, str) else keys
        points = next((p for p in (steps_and_values(rows, k) for k in options) if p), [])
        figures["curves"][name] = [[s, v] for s, v in points]
        quarters = quarter_figures([v for _, v in points])
        figures.update({f"{name}_{q}": v for q, v in quarters.items()})
    return figures


def arm_fragment(out: Path, arm: str, seed: int, steps: int) -> dict[str, Any]:
    """One seeded PPO run of ``steps`` rollouts, logged to ``out/arm/seed<k>/metrics.csv``; no
    checkpoints, no validation (the figures are the training curves). A warm-started arm starts
    from ``out/arm/seed<k>/sft/hf`` (:func:`sft_fragment`)."""
    _, warm, overrides = ARMS[arm]
    fragment = run_fragment(out, arm, seed, [], seed_model=True)
    fragment["model"]["init_args"].update(overrides)
    if warm:
        fragment["model"]["init_args"]["model"] = str(out / arm / f"seed{seed}" / "sft" / "hf")
    fragment["trainer"].update(
        {"limit_train_batches": steps, "limit_val_batches": 0, "enable_checkpointing": False,
         "enable_model_summary": False, "default_root_dir": str(out / arm / f"seed{seed}")}
    )  # fmt: skip
    return fragment


def sft_fragment(out: Path, arm: str, seed: int) -> dict[str, Any]:
    """The warm start of a warm-started arm: its SFT config with ``seed``, logged to
    ``out/arm/seed<k>/sft/metrics.csv``, exported to ``out/arm/seed<k>/sft/hf``."""
    root = out / arm / f"seed{seed}" / "sft"
    fragment = run_fragment(out / arm / f"seed{seed}", "sft", 0, [])
    fragment["seed_everything"] = seed
    fragment["data"]["init_args"]["seed"] = seed
    fragment["trainer"]["logger"]["init_args"]["version"] = ""
    fragment["trainer"].update({"enable_checkpointing": False, "enable_model_summary": False,
                                "default_root_dir": str(root)})  # fmt: skip
    fragment["model"] = {"init_args": {"export_dir": str(root / "hf")}}
    return fragment


def per_seed_markdown(runs: dict[str, dict[int, Figures]]) -> str:
    """One row per (arm, seed): each curve's start (first two rollouts) and last-quarter mean,
    ``start -> last``."""
    names = (*RISES, "format_ok", "truncated")
    lines = [
        "| arm | seed | " + " | ".join(names) + " | seconds |",
        "|---" * (len(names) + 3) + "|",
    ]
    for arm, by_seed in runs.items():
        for seed, f in sorted(by_seed.items()):
            first = {n: f.get(f"{n}_start", math.nan) for n in names}
            last = {n: f.get(f"{n}_last_q", math.nan) for n in names}
            cells = [
                "n/a" if math.isnan(first[n]) else f"{first[n]:.3f} -> {last[n]:.3f}" for n in names
            ]
            lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + f" | {f['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


class CalculatorCompare(Paper):
    name = "calculator_compare"
    title = "Calculator vs no tool: SmolLM2-135M, CPU"
    doc = "docs/agents.md"
    arms = tuple(ARMS)
    primary = Primary("correct_last_q", treatment="calculator", baseline="no_tool", direction=1)
    table_metrics = tuple(
        f"{name}_{q}" for name in RISES for q in ("start", "first_q", "last_q", "rise")
    )
    curve_keys = ("reward", "correct", "tool_calls", "format_ok")
    curve_xlabels = dict.fromkeys(curve_keys, "rollout step")

    def __init__(self, steps: int, task: str = "countdown") -> None:
        self.title = f"Calculator vs no tool: SmolLM2-135M, {task}, CPU"
        settings = {"steps": steps, "task": task}
        # one preset per instance (steps and task vary): an instance attribute on purpose
        self.presets = {"cpu": Preset(f"{task}_steps{steps}", (0,), 0.0, settings)}  # type: ignore[misc]

    def precheck(self, ctx: Context) -> Figures:
        return dict(PRECHECK)

    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        root = ctx.run_dir(arm, seed)
        role, warm, _ = ARMS[arm]
        config, sft_config = TASKS[ctx.settings["task"]][role]
        figures: Figures = {}
        if warm:
            sft = run_cli("fit", [sft_config], sft_fragment(ctx.out, arm, seed),
                          root / "sft_fragment.yaml")  # fmt: skip
            figures["sft_val_loss"] = sft.get("val/loss", math.nan)
        fragment = arm_fragment(ctx.out, arm, seed, ctx.settings["steps"])
        run_cli("fit", [config], fragment, root / "fragment.yaml")
        return {**curve_figures(root / "metrics.csv"), **figures}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--task", choices=list(TASKS), default="arithmetic")
    parser.add_argument("--steps", type=int, default=48, help="rollout steps per run (max 48)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["calculator", "no_tool"])
    parser.add_argument("--out", type=Path, default=Path("runs/calculator_compare"))
    parser.add_argument("--docs", type=Path, help="copy the PNG and JSON here (e.g. docs)")
    parser.add_argument(
        "--finished-only", action="store_true", help="report the finished runs, start none"
    )
    opts = parser.parse_args(argv)
    if not 1 <= opts.steps <= 48:  # 192 training tasks / 4 prompts per rollout
        parser.error(f"--steps must be in [1, 48], got {opts.steps}")
    return opts


def main(argv: Sequence[str] | None = None) -> Figures:
    opts = parse_args(argv)
    paper = CalculatorCompare(opts.steps, opts.task)
    preset = paper.presets["cpu"]
    ctx = Context(paper.name, preset, opts.out / preset.name)
    runs: dict[str, dict[int, Figures]] = {arm: {} for arm in opts.arms}
    for seed in opts.seeds:  # seed by seed: a run stopped early still has paired arms
        for arm in opts.arms:
            if opts.finished_only and not (ctx.out / arm / f"seed{seed}" / "result.json").exists():
                continue
            figures = cached_run(paper, ctx, arm, seed)
            runs[arm][seed] = {**figures, **curve_figures(ctx.run_dir(arm, seed) / "metrics.csv")}
    summary = write_outputs(paper, ctx, runs, dict(PRECHECK))
    with (ctx.out / "results.md").open("a") as f:
        f.write("\nPer seed, start (first two rollouts) -> last-quarter mean of each curve:\n\n")
        f.write(per_seed_markdown(runs))
    print((ctx.out / "results.md").read_text())
    if opts.docs is not None:
        stem = f"agents_calculator_{opts.task}"
        shutil.copy(ctx.out / f"{paper.name}.png", opts.docs / f"{stem}.png")
        shutil.copy(ctx.out / "results.json", opts.docs / f"{stem}.json")
    return summary


if __name__ == "__main__":
    main()
