"""Cost of the exploration terms, measured side by side in one run.

1. PPO step time on the tiny CPU setting (configs/ppo/countdown_tre_tiny.yaml's model and task)
   with no bonus, the global entropy bonus, TRE-K and TRE-P: methods interleaved over rounds,
   median per-step wall time after warm-up, ratio to vanilla.
2. Peak memory (and time) of one entropy forward + backward on bf16 logits of shape
   (4, 2048, 151936) (Qwen2.5's padded vocabulary): full-vocabulary entropy unchunked vs chunked,
   TRE-K and TRE-P. Each variant runs in a fresh process; memory is that process's peak RSS
   above the logits and their gradient.

    python scripts/benchmark_exploration.py [--rounds 3 --steps 6] [--shape 4 2048 151936]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

METHODS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "vanilla": None,
    "entropy bonus": ("EntropyBonus", {"alpha": 0.001}),
    "TRE-K": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topk", "k": 2}),
    "TRE-P": ("TrustRegionEntropy", {"alpha": 0.001, "mode": "topp", "p": 0.99}),
}


def step_times(rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    import lightning as L

    import lit_rlhf.callbacks as cbs
    from lit_rlhf.data import CountdownPrompts, PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import CountdownReward
    from lit_rlhf.rollout import HFGenerationEngine

    class StepTimer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, *args: Any) -> None:
            self.times.append(time.perf_counter() - self.start)

    results: dict[str, list[float]] = {name: [] for name in METHODS}
    for r in range(rounds):
        for name, spec in METHODS.items():
            L.seed_everything(r, verbose=False)
            data = PromptDataModule(
                tokenizer="builtin:tiny-llama",
                batch_size=4,
                train=CountdownPrompts(num_examples=4 * steps, seed=r, num_numbers=3, max_value=20),
            )
            module = PPOModule(
                reward=CountdownReward(format_reward=0.1),
                model="builtin:tiny-llama",
                tokenizer=data.tokenizer,
                engine=HFGenerationEngine(max_new_tokens=24),
                samples_per_prompt=4,
                micro_batch_size=8,
                lr=1e-3,
            )
            timer = StepTimer()
            callbacks: list[Any] = [timer]
            if spec is not None:
                callbacks.append(getattr(cbs, spec[0])(**spec[1]))
            L.Trainer(
                accelerator="cpu",
                max_epochs=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=callbacks,
            ).fit(module, datamodule=data)
            results[name].extend(timer.times[warmup:])
    return results


def memory_child(variant: str, shape: list[int], chunk: int) -> dict[str, float]:
    import torch

    from lit_rlhf.algos import entropy_from_logits, trust_region_entropy

    torch.manual_seed(0)
    logits = (torch.randn(*shape) * 3).to(torch.bfloat16).requires_grad_(True)
    logits.grad = torch.zeros_like(logits)  # allocate the gradient up front: not counted
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if variant == "entropy, unchunked":
        h = entropy_from_logits(logits, chunk_size=None)
    elif variant == "entropy, chunked":
        h = entropy_from_logits(logits, chunk_size=chunk)
    elif variant == "TRE-K, chunked":
        h, _ = trust_region_entropy(logits, mode="topk", k=2, chunk_size=chunk)
    else:
        h, _ = trust_region_entropy(logits, mode="topp", p=0.99, chunk_size=chunk)
    h.float().mean().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (peak - base) / 1024, "seconds": seconds}


def memory_table(shape: list[int], chunk: int) -> list[str]:
    logits_mib = 2 * shape[0] * shape[1] * shape[2] / 2**20
    lines = [
        f"Entropy forward+backward on bf16 logits {tuple(shape)} ({logits_mib:.0f} MiB; its "
        f"gradient is allocated beforehand and not counted), chunk {chunk} positions:",
        "",
        "| variant | extra peak memory | time |",
        "|---|---|---|",
    ]
    for variant in ("entropy, unchunked", "entropy, chunked", "TRE-K, chunked", "TRE-P, chunked"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--shape",
                *map(str, shape),
                "--chunk",
                str(chunk),
            ],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            lines.append(f"| {variant} | failed: {out.stderr.strip().splitlines()[-1]} | |")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        lines.append(f"| {variant} | {r['peak_mib']:.0f} MiB | {r['seconds']:.2f} s |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--shape", type=int, nargs=3, default=[4, 2048, 151936])
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(memory_child(opts.child, opts.shape, opts.chunk)))
        return
    times = step_times(opts.rounds, opts.steps, opts.warmup)
    base = statistics.median(times["vanilla"])
    lines = [
        f"PPO step time, tiny CPU setting ({opts.rounds} rounds x {opts.steps} steps, "
        f"first {opts.warmup} of each dropped):",
        "",
        "| method | median step | spread (min-max) | vs vanilla |",
        "|---|---|---|---|",
    ]
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append(
            f"| {name} | {med * 1000:.1f} ms | {min(ts) * 1000:.1f}-{max(ts) * 1000:.1f} ms | "
            f"{med / base:.3f}x |"
        )
    if not opts.skip_memory:
        lines += ["", *memory_table(opts.shape, opts.chunk)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
