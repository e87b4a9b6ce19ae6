"""Where the time of a ConsistRM judge-training step goes: generation, critique embedding, the rest.

    python -m scripts.bench grm                              # SmolLM2-135M + MiniLM, 8 steps
    python -m scripts.bench grm --model builtin:tiny-llama --embedder builtin:tiny-llama

Workload and figures: docs/grm.md, "Step-time breakdown (ConsistRM)".
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from scripts.bench.runner import Report, StepTimer, Timed, fit, int_args

SMOKE = {"model": "builtin:tiny-llama", "embedder": "builtin:tiny-llama", "pairs": 2,
         "samples": 2, "new_tokens": 8, "steps": 1, "warmup": 1}  # fmt: skip
EMBED = "CritiqueConsistencyReward/embed_seconds"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--embedder", default="builtin:all-minilm-l6-v2")
    int_args(parser, pairs=8, samples=4, new_tokens=64, steps=8, warmup=2)
    parser.add_argument("--precision", default="auto", help="auto (fits this CPU), 32-true, ...")


def trainer_precision(precision: str) -> Any:
    """The CPU trainer's precision: ``auto`` resolved for this CPU (bf16 autocast is several
    times slower than float32 where the CPU has no native bf16), an explicit value as given."""
    from lit_rlhf.training import resolve_precision

    return resolve_precision(precision, "cpu")  # type: ignore[arg-type]


def run(opts: argparse.Namespace, report: Report) -> None:
    from lit_rlhf.callbacks import ConsistencyAnswerReward, CritiqueConsistencyReward
    from lit_rlhf.data import PromptDataModule, SyntheticPairs
    from lit_rlhf.modules import GenerativeRewardModule
    from lit_rlhf.rollout import HFGenerationEngine

    engine = HFGenerationEngine(max_new_tokens=opts.new_tokens)
    engine.generate = timed = Timed(engine.generate)  # type: ignore[method-assign]
    module = GenerativeRewardModule(mode="consistrm", model=opts.model, engine=engine,
                                    optim={"lr": 1e-5, "micro_batch_size": 16},
                                    rollout={"samples_per_prompt": opts.samples})  # fmt: skip
    pairs = SyntheticPairs(num_examples=opts.pairs * (opts.steps + opts.warmup), seed=0)
    data = PromptDataModule(tokenizer=opts.model, train=pairs, batch_size=opts.pairs,
                            max_prompt_length=1024)  # fmt: skip
    timer = StepTimer({"generation": lambda: timed.seconds},
                      {"embedding": lambda t, _: t.callback_metrics[EMBED]})  # fmt: skip
    answer = ConsistencyAnswerReward(unseeded=True)  # timing only: no seeded memory
    callbacks = [answer, CritiqueConsistencyReward(opts.embedder), timer]
    fit(module, callbacks, data, precision=trainer_precision(opts.precision))
    med = {k: statistics.median(timer.column(k, opts.warmup)) for k in timer.rows[0]}
    report.data = {"medians": med, "rows": timer.rows}
    report.say(f"{opts.model}, {opts.pairs} pairs x {opts.samples} rollouts, up to "
               f"{opts.new_tokens} new tokens, embedder {opts.embedder}; medians of "
               f"{len(timer.rows) - opts.warmup} steps", "")  # fmt: skip
    rest = med["step"] - med["generation"] - med["embedding"]
    parts = {"generation": med["generation"], "critique embedding": med["embedding"],
             "scoring + GRPO update": rest}  # fmt: skip
    rows = [(name, f"{v:.3f}", f"{v / med['step']:.1%}") for name, v in parts.items()]
    report.table(["part", "seconds", "share of the step"],
                 [*rows, ("whole step", f"{med['step']:.3f}", "100%")])  # fmt: skip
