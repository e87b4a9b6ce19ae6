"""Cost of modular gradient surgery, measured side by side in one run: MGS vs mixed RL.

Three-domain PPO (math, chat, instruction following; the offline samples, 1/3 each, GRPO) on
the tiny and mid CPU models. Per step: the whole training step (generation, scoring, update)
and its update phase alone (the ``OptimizerStep`` calls, which MGS changes: one backward per
domain, the surgery, the combined gradient). Arms alternate within each round, each run in a
fresh process, so the peak resident memory (ru_maxrss) of a run is its own; MGS's extra memory
is one float32 gradient copy per domain (3 x 4 bytes per trainable parameter).

    python scripts/benchmark_mgs.py [--models builtin:tiny-llama builtin:mid-llama]
        [--rounds 3 --steps 5 --warmup 1] [--granularity module]

Target (issue [7/9]): an MGS step under 1.3x the mixed step.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parents[1] / "lit_rlhf" / "data" / "samples"


def mixture(num_examples: int) -> Any:
    from lit_rlhf.data import FilePrompts, MixturePrompts

    return MixturePrompts(
        sources=[
            FilePrompts(path=str(SAMPLES / "math_prompts.jsonl"), id_field="id", task="math"),
            FilePrompts(
                path=str(SAMPLES / "chat_prompts.jsonl"),
                answer_field=None,
                id_field="id",
                task="chat",
            ),
            FilePrompts(
                path=str(SAMPLES / "ifeval_prompts.jsonl"),
                question_field="prompt",
                answer_field=None,
                id_field="key",
                task="ifeval",
            ),
        ],
        weights=[1, 1, 1],
        num_examples=num_examples,
        seed=0,
    )


def run_arm(model: str, arm: str, steps: int, granularity: str) -> dict[str, Any]:
    """One training run in this process: per-step total and update-phase seconds, peak RSS."""
    import lightning as L

    import lit_rlhf.training.optimization as optimization
    from lit_rlhf.callbacks import ModularGradientSurgery
    from lit_rlhf.data import PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import InstructionReward, MathReward, RewardByTask, ScalarRMReward
    from lit_rlhf.rollout import HFGenerationEngine

    update_seconds: list[float] = []
    original = optimization.OptimizerStep.__call__

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        update_seconds.append(time.perf_counter() - start)
        return out

    optimization.OptimizerStep.__call__ = timed  # type: ignore[method-assign]

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.total: list[float] = []
            self.update: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.start, self.mark = time.perf_counter(), len(update_seconds)

        def on_train_batch_end(self, *args: Any) -> None:
            self.total.append(time.perf_counter() - self.start)
            self.update.append(sum(update_seconds[self.mark :]))

    L.seed_everything(0, verbose=False)
    data = PromptDataModule(tokenizer=model, batch_size=6, train=mixture(6 * steps))
    reward = RewardByTask(rewards={
        "math": MathReward(), "ifeval": InstructionReward(),
        "chat": ScalarRMReward(model="builtin:tiny-llama", center=True, device="cpu"),
    })  # fmt: skip
    module = PPOModule(reward=reward, model=model, tokenizer=data.tokenizer,
                       engine=HFGenerationEngine(max_new_tokens=24), advantage="grpo",
                       samples_per_prompt=4, micro_batch_size=8, lr=1e-4)  # fmt: skip
    timer = StepTimer()
    callbacks: list[Any] = [timer]
    if arm == "MGS":
        callbacks.append(ModularGradientSurgery(granularity=granularity, seed=0))  # type: ignore[arg-type]
    L.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False,
              callbacks=callbacks).fit(module, datamodule=data)  # fmt: skip
    params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"total": timer.total, "update": timer.update, "peak_mib": peak_mib, "params": params}


def spawn(model: str, arm: str, opts: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", model, arm, "--steps", str(opts.steps),
               "--granularity", opts.granularity]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{model} {arm} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def table(model: str, runs: dict[str, list[dict[str, Any]]], warmup: int) -> list[str]:
    """Medians over rounds of each run's median step; ratios per round, then their median."""

    def med(run: dict[str, Any], key: str) -> float:
        return statistics.median(run[key][warmup:])

    lines = [f"### {model} ({runs['mixed'][0]['params'] / 1e6:.1f}M trainable parameters)", "",
             "| arm | step (median) | update phase | peak RSS | step vs mixed | update vs mixed |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for arm, arm_runs in runs.items():
        pairs = list(zip(arm_runs, runs["mixed"], strict=True))
        step_ratio = [med(r, "total") / med(m, "total") for r, m in pairs]
        upd_ratio = [med(r, "update") / med(m, "update") for r, m in pairs]
        lines.append(
            f"| {arm} | {statistics.median(med(r, 'total') for r in arm_runs) * 1e3:.0f} ms | "
            f"{statistics.median(med(r, 'update') for r in arm_runs) * 1e3:.0f} ms | "
            f"{statistics.median(r['peak_mib'] for r in arm_runs):.0f} MiB | "
            f"{statistics.median(step_ratio):.3f}x ({min(step_ratio):.2f}-{max(step_ratio):.2f}) | "
            f"{statistics.median(upd_ratio):.3f}x ({min(upd_ratio):.2f}-{max(upd_ratio):.2f}) |"
        )
    extra = 3 * 4 * runs["mixed"][0]["params"] / 2**20
    lines += ["", f"Expected MGS extra memory (3 float32 gradient copies): {extra:.0f} MiB.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["builtin:tiny-llama", "builtin:mid-llama"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--granularity", default="module")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ARM"))
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(run_arm(*opts.child, opts.steps, opts.granularity)))
        return
    if opts.warmup >= opts.steps:
        parser.error(f"--warmup ({opts.warmup}) must be below --steps ({opts.steps})")
    print(f"MGS ({opts.granularity}) vs mixed RL: {opts.rounds} rounds x {opts.steps} steps, "
          f"first {opts.warmup} dropped, arms alternating, one process per run\n")  # fmt: skip
    for model in opts.models:
        runs: dict[str, list[dict[str, Any]]] = {"mixed": [], "MGS": []}
        for _ in range(opts.rounds):
            for arm in runs:
                runs[arm].append(spawn(model, arm, opts))
        print("\n".join(table(model, runs, opts.warmup)), flush=True)


if __name__ == "__main__":
    main()
