"""Cost of modular gradient surgery against mixed RL: step time, update phase and peak memory of
three-domain PPO, arms alternating, each run in a fresh process (target: MGS step < 1.3x mixed).

    python -m scripts.bench mgs [--models builtin:tiny-llama builtin:mid-llama]
        [--rounds 3 --steps 5 --warmup 1] [--granularity module]

Workload and figures: docs/multidomain.md, "Overhead".
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from scripts.bench.runner import (
    SAMPLES,
    Report,
    StepTimer,
    Timed,
    fit,
    int_args,
    peak_rss_mib,
    ratio,
    spawn,
)

SMOKE = {"models": ["builtin:tiny-llama"], "rounds": 1, "steps": 2, "warmup": 1}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["builtin:tiny-llama", "builtin:mid-llama"])
    int_args(parser, rounds=3, steps=5, warmup=1)
    parser.add_argument("--granularity", default="module")
    parser.add_argument("--model", help=argparse.SUPPRESS)  # a child's


def mixture(num_examples: int) -> Any:
    from lit_rlhf.data import FilePrompts, MixturePrompts

    def source(name: str, task: str, **kwargs: Any) -> FilePrompts:
        return FilePrompts(path=str(SAMPLES / f"{name}_prompts.jsonl"), task=task, **kwargs)

    sources = [source("math", "math", id_field="id"),
               source("chat", "chat", answer_field=None, id_field="id"),
               source("ifeval", "ifeval", question_field="prompt", answer_field=None,
                      id_field="key")]  # fmt: skip
    return MixturePrompts(sources=sources, weights=[1, 1, 1], num_examples=num_examples, seed=0)


def child(opts: argparse.Namespace) -> dict[str, Any]:
    """One arm's training run: per-step total and update-phase seconds, peak RSS."""
    import lightning as L

    import lit_rlhf.training.optimization as optimization
    from lit_rlhf.callbacks import ModularGradientSurgery
    from lit_rlhf.data import PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import InstructionReward, MathReward, RewardByTask, ScalarRMReward
    from lit_rlhf.rollout import HFGenerationEngine

    update = Timed(optimization.OptimizerStep.__call__)
    optimization.OptimizerStep.__call__ = lambda self, *a, **k: update(self, *a, **k)  # type: ignore[method-assign]
    L.seed_everything(0, verbose=False)
    data = PromptDataModule(tokenizer=opts.model, batch_size=6, train=mixture(6 * opts.steps))
    reward = RewardByTask(rewards={
        "math": MathReward(), "ifeval": InstructionReward(),
        "chat": ScalarRMReward(model="builtin:tiny-llama", center=True, device="cpu"),
    })  # fmt: skip
    module = PPOModule(reward=reward, model=opts.model, tokenizer=data.tokenizer,
                       engine=HFGenerationEngine(max_new_tokens=24),
                       advantage={"estimator": "grpo"}, rollout={"samples_per_prompt": 4},
                       optim={"micro_batch_size": 8, "lr": 1e-4})  # fmt: skip
    timer = StepTimer({"update": lambda: update.seconds})
    surgery = ModularGradientSurgery(granularity=opts.granularity, seed=0)  # type: ignore[arg-type]
    fit(module, [timer, surgery] if opts.child == "MGS" else [timer], data)
    params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return {"total": timer.column("step"), "update": timer.column("update"),
            "peak_mib": peak_rss_mib(), "params": params}  # fmt: skip


def table(model: str, runs: dict[str, list[dict[str, Any]]], warmup: int) -> list[str]:
    """Medians over rounds of each run's median step; ratios per round, then their median."""

    def med(arm: str, key: str) -> list[float]:
        return [statistics.median(run[key][warmup:]) for run in runs[arm]]

    params = runs["mixed"][0]["params"]
    lines = [f"### {model} ({params / 1e6:.1f}M trainable parameters)", "",
             "| arm | step (median) | update phase | peak RSS | step vs mixed | update vs mixed |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for arm, arm_runs in runs.items():
        lines.append(
            f"| {arm} | {statistics.median(med(arm, 'total')) * 1e3:.0f} ms | "
            f"{statistics.median(med(arm, 'update')) * 1e3:.0f} ms | "
            f"{statistics.median(r['peak_mib'] for r in arm_runs):.0f} MiB | "
            f"{ratio(med(arm, 'total'), med('mixed', 'total'))} | "
            f"{ratio(med(arm, 'update'), med('mixed', 'update'))} |"
        )
    extra = 3 * 4 * params / 2**20
    return [*lines, "", f"Expected MGS extra memory (3 float32 gradient copies): {extra:.0f} MiB."]


def run(opts: argparse.Namespace, report: Report) -> None:
    if opts.warmup >= opts.steps:
        raise SystemExit(f"--warmup ({opts.warmup}) must be below --steps ({opts.steps})")
    report.say(f"MGS ({opts.granularity}) vs mixed RL: {opts.rounds} rounds x {opts.steps} "
               f"steps, first {opts.warmup} dropped, arms alternating, one process per run",
               "")  # fmt: skip
    flags = ["--steps", opts.steps, "--granularity", opts.granularity, "--threads", opts.threads]
    for model in opts.models:
        runs: dict[str, list[dict[str, Any]]] = {"mixed": [], "MGS": []}
        for _ in range(opts.rounds):
            for arm in runs:
                runs[arm].append(spawn("mgs", [*flags, "--model", model, "--child", arm]))
        report.say(*table(model, runs, opts.warmup), "")
        report.data[model] = runs
