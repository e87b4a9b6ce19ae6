"""lit-rlhf against TRL's GRPOTrainer on the identical GRPO workload, side by side in one run.

Workload (both frameworks, same process, same threads, same weights):
- random-init LlamaForCausalLM in fp32 with tied embeddings and a locally trained 2048-token
  byte-level BPE: "tiny" = ``builtin:small-llama`` (hidden 256, 4 layers, 4 heads, intermediate
  512), "mid" = ``builtin:mid-llama`` (hidden 512, 8 layers, 8 heads, intermediate 1024);
- 256 plain-text Countdown-style prompts; each optimizer step = 8 prompts x 4 samples, up to 64
  new tokens, temperature 1.0, top-p 1.0, AdamW (lr 1e-6), ratio clip 0.2, group-normalised
  advantages, one update per rollout, KL coefficient beta in {0, 0.04} (k3, in the loss);
- reward: the fraction of digits in the completion (lit_rlhf.rewards.DigitFractionReward);
- TRL with bf16 and gradient checkpointing off (its defaults are on) and ``use_cpu``.

Each run takes ``--warmup`` + ``--steps`` optimizer steps; the table gives the median step time
over the last ``--steps`` (spread = min-max), the time inside generation, and the step time as a
multiple of the compute-only limit: the matmul FLOPs of generation (prefill + decode, with
attention over the growing context), of the training forward + backward (3x a forward) and of the
reference forward when beta > 0, divided by the fp32 GEMM rate measured at the start.

    make benchmark                      # builds .venv-bench (TRL + vLLM + lit-rlhf), runs all
    .venv-bench/bin/python scripts/benchmark.py --sizes tiny --betas 0 --steps 3 --warmup 1

lit-rlhf is timed with the vLLM engine (compiled, colocated, weights pushed after every step);
``--engines vllm decode hf`` adds its own decode loop over the Hugging Face model
(``DecodeLoopEngine``, compiled) and transformers' ``generate``. Each run is a fresh process;
``--repeats`` runs per framework alternate in order (A B, B A, ...).

``--sweep`` instead times every (response length, group size) point of ``--sweep-lengths``
(32 64 128 256 new tokens) x ``--sweep-groups`` (2 4 8 16 samples per prompt) for one size and
beta, printing per point and framework the step time, its multiple of the compute limit and the
peak memory (CUDA: ``max_memory_allocated``; CPU: peak RSS of the run's process). A subset:

    .venv-bench/bin/python scripts/benchmark.py --sweep --sizes tiny --betas 0 \
        --sweep-lengths 64 256 --sweep-groups 4 16 --steps 3 --warmup 1 --repeats 1

``--micro-batch-tokens N`` runs lit-rlhf's update packed (``micro_batch_tokens: N``: token-budget
micro-batches of whole groups, padding-free, chunked log-probs) instead of one padded
micro-batch of the whole rollout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

SIZES = {"tiny": "builtin:small-llama", "mid": "builtin:mid-llama"}
PROMPTS, PROMPTS_PER_STEP, SAMPLES, NEW_TOKENS, LR = 256, 8, 4, 64, 1e-6
MICRO_BATCH_TOKENS: int | None = None  # --micro-batch-tokens: lit-rlhf's packed update
MAX_STALENESS = 0  # --max-staleness: one-step-off training (scripts/bench_overlap.py)
OVERLAP_KEYS = ("time/generate_s", "time/update_s", "time/wait_s", "rollout/overlap")
QUESTION = "Use the numbers {numbers} to make {target}."  # 13-16 tokens


def prompt_source() -> Any:
    from lit_rlhf.data import CountdownPrompts

    return CountdownPrompts(num_examples=PROMPTS, seed=0, question_template=QUESTION)


def gemm_rate(size: int = 1024, repeats: int = 10) -> float:
    """Best fp32 FLOP/s of a square matmul on the configured threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(3):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def forward_flops(config: Any, tokens: int, context: int, lm_head_tokens: int) -> float:
    """Matmul FLOPs of one forward over ``tokens`` positions that each attend to ``context``
    keys on average, with the LM head applied at ``lm_head_tokens`` positions."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    kv = h * config.num_key_value_heads // config.num_attention_heads
    per_layer = h * (h + 2 * kv) + h * h + 3 * h * inter  # qkv, o, gate/up/down
    attention = 4 * h * context  # QK^T and AV per token per layer
    return (
        tokens * layers * (2 * per_layer + attention) + lm_head_tokens * 2 * h * config.vocab_size
    )


def step_flops(config: Any, prompt_len: float, response_len: float, beta: float) -> float:
    """Compute-only FLOPs of one optimizer step of the workload (B = 8 x 4 sequences)."""
    b, p, r = PROMPTS_PER_STEP * SAMPLES, prompt_len, response_len
    prefill = forward_flops(config, int(b * p), int(p / 2), b)
    decode = forward_flops(config, int(b * r), int(p + r / 2), int(b * r))
    full = forward_flops(config, int(b * (p + r)), int((p + r) / 2), int(b * r))
    return prefill + decode + full * (3 + (1 if beta > 0 else 0))


class _Timed:
    """Wraps a callable and accumulates the seconds spent in it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def make_engine(kind: str) -> Any:
    from lit_rlhf.rollout import DecodeLoopEngine, HFGenerationEngine, VLLMGenerationEngine

    sampling = dict(max_new_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0)
    if kind == "vllm":
        # compiled (not enforce_eager): ~30 s of start-up, inside the first warm-up step
        return VLLMGenerationEngine(
            **sampling, kv_cache_memory_bytes=256 << 20, max_model_len=NEW_TOKENS + 64
        )
    if kind in ("decode", "decode_eager"):
        return DecodeLoopEngine(**sampling, cache="static", compile=kind == "decode")
    return HFGenerationEngine(**sampling)


def run_lit_rlhf(model: str, beta: float, total_steps: int, engine_kind: str) -> dict[str, Any]:
    import lightning as L

    from lit_rlhf.data import PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import DigitFractionReward

    engine = make_engine(engine_kind)
    timed = _Timed(engine.generate)
    engine.generate = timed
    times: list[float] = []
    gen_times: list[float] = []
    lengths: list[float] = []
    overlap: dict[str, list[float]] = {key: [] for key in OVERLAP_KEYS}

    class Timer(L.Callback):
        def on_train_batch_start(self, *args: Any) -> None:
            self.start, self.gen = time.perf_counter(), timed.seconds

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            times.append(time.perf_counter() - self.start)
            gen_times.append(timed.seconds - self.gen)
            logged = trainer.callback_metrics
            lengths.append(float(logged.get("rollout/response_length", float("nan"))))
            for key, values in overlap.items():  # one-step-off only
                values.append(float(logged.get(key, float("nan"))))

    L.seed_everything(0, verbose=False)
    data = PromptDataModule(
        tokenizer=model,
        train=prompt_source(),
        batch_size=PROMPTS_PER_STEP,
        use_chat_template=False,
    )
    module = PPOModule(
        reward=DigitFractionReward(),
        model=model,
        tokenizer=data.tokenizer,
        engine=engine,
        samples_per_prompt=SAMPLES,
        advantage="grpo",
        micro_batch_size=PROMPTS_PER_STEP * SAMPLES,
        micro_batch_tokens=MICRO_BATCH_TOKENS,  # None: padded micro-batches of the whole rollout
        clip_low=0.2,
        clip_high=0.2,
        kl_coef=beta,
        kl_estimator="k3",
        lr=LR,
        max_grad_norm=1.0,
        max_staleness=MAX_STALENESS,
    )
    L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=total_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[Timer()],
    ).fit(module, datamodule=data)
    return {"times": times, "gen": gen_times, "lengths": lengths, "overlap": overlap}


def run_trl(model: str, beta: float, total_steps: int) -> dict[str, Any]:
    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_rlhf.models import load_tokenizer
    from lit_rlhf.models.builtin import resolve_builtin
    from lit_rlhf.rewards import DigitFractionReward

    folder = resolve_builtin(model)
    tokenizer = load_tokenizer(model)
    questions = list(prompt_source().load()["question"])
    dataset = datasets.Dataset.from_dict({"prompt": questions})
    score = DigitFractionReward()

    def digit_fraction(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [float(s) for s in score(prompts, completions, [{}] * len(completions)).scores]

    times: list[float] = []
    gen_times: list[float] = []

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES,
            gradient_accumulation_steps=1,
            num_generations=SAMPLES,
            max_completion_length=NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            learning_rate=LR,
            lr_scheduler_type="constant",
            beta=beta,
            epsilon=0.2,
            num_iterations=1,
            loss_type="dapo",
            max_grad_norm=1.0,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            use_cpu=True,
            max_steps=total_steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=0,
            model_init_kwargs={"dtype": torch.float32},
        )
        trainer = GRPOTrainer(
            model=folder,
            reward_funcs=[digit_fraction],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        timed = _Timed(trainer.model.generate)
        trainer.model.generate = timed  # type: ignore[method-assign]

        class Timer(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
                self.start, self.gen = time.perf_counter(), timed.seconds

            def on_step_end(self, *args: Any, **kwargs: Any) -> None:
                times.append(time.perf_counter() - self.start)
                gen_times.append(timed.seconds - self.gen)

        trainer.add_callback(Timer())
        trainer.train()
        lengths = [
            float(entry["completions/mean_length"])
            for entry in trainer.state.log_history
            if "completions/mean_length" in entry
        ]
    return {"times": times, "gen": gen_times, "lengths": lengths}


def prompt_lengths(model: str) -> list[int]:
    from lit_rlhf.models import load_tokenizer

    tokenizer = load_tokenizer(model)
    return [len(ids) for ids in tokenizer(list(prompt_source().load()["question"])).input_ids]


def summarise(name: str, result: dict[str, Any], limit: float) -> dict[str, Any]:
    """Median/min/max step, median generation time, mean length and step / compute limit of
    the timed steps (warm-ups already dropped by :func:`measure`)."""
    times, gen = result["times"], result["gen"]
    if not times:
        raise RuntimeError(f"{name}: no timed steps; raise --steps")
    median = statistics.median(times)
    return {
        "name": name,
        "median": median,
        "min": min(times),
        "max": max(times),
        "gen": statistics.median(gen),
        "length": statistics.fmean(result["lengths"] or [float("nan")]),
        "x_limit": median / limit,
    }


LABELS = {
    "vllm": "lit-rlhf, vLLM engine",
    "decode": "lit-rlhf, decode loop",
    "hf": "lit-rlhf, HF generate",
    "trl": "TRL GRPOTrainer",
}


def child(opts: argparse.Namespace) -> None:
    """One run in this (fresh) process; prints its result as the last line of JSON."""
    torch.set_num_threads(opts.threads)
    model = SIZES[opts.size]
    total = opts.warmup + opts.steps
    global NEW_TOKENS, SAMPLES, MICRO_BATCH_TOKENS, MAX_STALENESS
    NEW_TOKENS, SAMPLES = opts.new_tokens, opts.samples
    MICRO_BATCH_TOKENS, MAX_STALENESS = opts.micro_batch_tokens, opts.max_staleness
    if opts.child == "trl":
        result = run_trl(model, opts.beta, total)
    else:
        result = run_lit_rlhf(model, opts.beta, total, opts.child)
    if torch.cuda.is_available():
        result["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("\n" + json.dumps(result))


def spawn(kind: str, size: str, beta: float, opts: argparse.Namespace) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", kind, "--size", size, "--beta", str(beta)]
    args += ["--steps", str(opts.steps), "--warmup", str(opts.warmup)]
    args += ["--threads", str(opts.threads)]
    args += ["--new-tokens", str(NEW_TOKENS), "--samples", str(SAMPLES)]
    if opts.micro_batch_tokens is not None:
        args += ["--micro-batch-tokens", str(opts.micro_batch_tokens)]
    args += ["--max-staleness", str(getattr(opts, "max_staleness", 0))]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{LABELS[kind]} ({size}, beta {beta}) failed:\n{tail}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(
    kinds: list[str], size: str, beta: float, opts: argparse.Namespace, *, peak: bool = False
) -> dict[str, dict[str, list[float]]]:
    """Timed steps (warm-ups dropped) of each kind, pooled over ``opts.repeats`` runs in
    alternating order (A B C, C B A, ...) so that slow drifts of the machine hit every kind;
    with ``peak`` also each run's peak memory (``peak_mb``)."""
    keys = ["times", "gen", "lengths"] + (["peak_mb"] if peak else [])
    pooled: dict[str, dict[str, list[float]]] = {kind: {k: [] for k in keys} for kind in kinds}
    for r in range(opts.repeats):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            result = spawn(kind, size, beta, opts)
            for key, values in pooled[kind].items():
                if key == "peak_mb":
                    values.append(result.get("peak_mb", float("nan")))
                else:
                    values.extend(result[key][opts.warmup :])
    return pooled


def sweep(opts: argparse.Namespace, rate: float) -> None:
    """Step time, x compute limit and peak memory per (response length, group size) point."""
    global NEW_TOKENS, SAMPLES
    from lit_rlhf.models import load_causal_lm

    size, beta = opts.sizes[0], opts.betas[0]
    lengths = prompt_lengths(SIZES[size])
    config = load_causal_lm(SIZES[size]).config
    print(
        "| size | beta | new tokens | group | framework | step | x compute limit | peak MiB |\n"
        "|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for new_tokens in opts.sweep_lengths:
        for group in opts.sweep_groups:
            NEW_TOKENS, SAMPLES = new_tokens, group
            results = measure([*opts.engines, "trl"], size, beta, opts, peak=True)
            for kind, result in results.items():
                length = statistics.fmean(result["lengths"] or [NEW_TOKENS])
                flops = step_flops(config, statistics.fmean(lengths), length, beta)
                s = summarise(LABELS[kind], result, flops / rate)
                print(
                    f"| {size} | {beta:g} | {new_tokens} | {group} | {LABELS[kind]} | "
                    f"{s['median']:.3f} s | {s['x_limit']:.2f}x | "
                    f"{max(result['peak_mb']):.0f} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--betas", nargs="+", type=float, default=[0.0, 0.04])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs per framework, alternating")
    parser.add_argument(
        "--engines",
        nargs="+",
        choices=["vllm", "decode", "hf"],
        default=["vllm"],
        help="lit-rlhf generation engines to time (hf = transformers generate)",
    )
    parser.add_argument("--child", choices=list(LABELS), help=argparse.SUPPRESS)
    parser.add_argument("--size", choices=list(SIZES), help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help=argparse.SUPPRESS)
    parser.add_argument("--samples", type=int, default=SAMPLES, help=argparse.SUPPRESS)
    parser.add_argument(
        "--sweep", action="store_true", help="time the (length x group size) grid instead"
    )
    parser.add_argument("--sweep-lengths", nargs="+", type=int, default=[32, 64, 128, 256])
    parser.add_argument("--sweep-groups", nargs="+", type=int, default=[2, 4, 8, 16])
    parser.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="lit-rlhf's update packed in micro-batches of this many tokens (default: padded)",
    )
    parser.add_argument("--max-staleness", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if opts.child:
        child(opts)
        return
    torch.set_num_threads(opts.threads)
    rate = gemm_rate()
    if opts.sweep:
        print(
            f"fp32 GEMM rate: {rate / 1e9:.0f} GFLOP/s; sweep of {opts.sizes[0]}, beta "
            f"{opts.betas[0]:g}, {opts.steps} timed steps after {opts.warmup} warm-up"
        )
        sweep(opts, rate)
        return
    lines = [
        f"fp32 GEMM rate (best 1024^3 matmul, {opts.threads} threads): {rate / 1e9:.0f} GFLOP/s. "
        f"Each run is a fresh process; {opts.steps} timed optimizer steps after {opts.warmup} "
        f"warm-up, {opts.repeats} runs per framework in alternating order, medians (min-max) "
        "over all timed steps.",
        "",
        "| size | beta | framework | step | in generation | completions/s | mean length | "
        "x compute limit | vs TRL |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    from lit_rlhf.models import load_causal_lm

    for size in opts.sizes:
        model = SIZES[size]
        lengths = prompt_lengths(model)
        config = load_causal_lm(model).config
        for beta in opts.betas:
            results = measure([*opts.engines, "trl"], size, beta, opts)
            trl_median = statistics.median(results["trl"]["times"])
            for kind, result in results.items():
                length = statistics.fmean(result["lengths"] or [NEW_TOKENS])
                flops = step_flops(config, statistics.fmean(lengths), length, beta)
                s = summarise(LABELS[kind], result, flops / rate)
                line = (
                    f"| {size} | {beta:g} | {LABELS[kind]} | {s['median']:.3f} s "
                    f"({s['min']:.3f}-{s['max']:.3f}) | {s['gen']:.3f} s | "
                    f"{PROMPTS_PER_STEP * SAMPLES / s['median']:.1f} | {s['length']:.1f} | "
                    f"{s['x_limit']:.2f}x | {trl_median / s['median']:.2f}x |"
                )
                lines.append(line)
                print(line, flush=True)
    rate_after = gemm_rate()
    lines += [
        "",
        f"fp32 GEMM rate at the end: {rate_after / 1e9:.0f} GFLOP/s (the 'x compute limit' "
        "column used the rate at the start; if they differ much, the machine's speed changed "
        "during the run and that column is off by the same factor).",
        f"Prompts: {min(lengths)}-{max(lengths)} tokens. 'vs TRL' = TRL's median step time / "
        "this row's (throughput ratio).",
    ]
    print("\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
