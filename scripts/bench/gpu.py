"""PPO step throughput on one GPU with a randomly initialised 0.5B-class Qwen2 (no downloads):
generation and training tokens/s and the model FLOPs utilisation (MFU) against the bf16 matmul
rate the runner measures on the same device at the start of the run (needs CUDA).

    python -m scripts.bench gpu [--steps 5] [--batch 16] [--prompt-len 128] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from scripts.bench.runner import Report, int_args

# Qwen2.5-0.5B's shape (random weights).
QWEN05 = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
              num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
              tie_word_embeddings=True)  # fmt: skip
SMOKE = {"steps": 1, "batch": 2, "prompt_len": 8, "new_tokens": 8}


def add_args(parser: argparse.ArgumentParser) -> None:
    int_args(parser, steps=5, batch=16, prompt_len=128, new_tokens=256)


def step(model: Any, opt: torch.optim.Optimizer, opts: argparse.Namespace) -> tuple[float, float]:
    """One generation + one clipped-policy-loss update: their seconds."""
    from lit_rlhf.algos import clipped_policy_loss, masked_mean, token_log_probs

    prompts = torch.randint(0, 150000, (opts.batch, opts.prompt_len), device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.eval()
    with torch.no_grad():
        seq = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                             max_new_tokens=opts.new_tokens, min_new_tokens=opts.new_tokens,
                             pad_token_id=0)  # fmt: skip
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    model.train()
    response = seq[:, opts.prompt_len :]
    logits = model(seq, logits_to_keep=response.shape[1] + 1).logits[:, :-1]
    log_probs = token_log_probs(logits, response)
    mask = torch.ones_like(response, dtype=torch.bool)
    adv = torch.randn(response.shape[0], 1, device="cuda").expand_as(log_probs)
    loss, _ = clipped_policy_loss(log_probs, log_probs.detach(), adv, mask)
    masked_mean(loss, mask).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return t1 - t0, time.perf_counter() - t1


def run(opts: argparse.Namespace, report: Report) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if not torch.cuda.is_available():
        raise SystemExit("scripts.bench gpu needs a CUDA GPU")
    peak = report.machine["gemm_start"]["bf16"] / 1e12  # measured on this GPU
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN05)).to("cuda", torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    times = [step(model, opt, opts) for _ in range(opts.steps + 1)][1:]  # the first warms up
    gen, train = (statistics.median(t[i] for t in times) for i in (0, 1))
    new_tokens, prompt_tokens = opts.batch * opts.new_tokens, opts.batch * opts.prompt_len
    # 2 N FLOPs per token forward, 6 N forward + backward (attention FLOPs left out)
    gen_mfu = 2 * n_params * (new_tokens + prompt_tokens) / gen / 1e12 / peak
    train_mfu = 6 * n_params * (new_tokens + prompt_tokens) / train / 1e12 / peak
    gen_rate, train_rate = new_tokens / gen, (new_tokens + prompt_tokens) / train
    report.table(["", "", ""], [
        ("device", torch.cuda.get_device_name(), f"bf16 matmul {peak:.0f} TFLOP/s"),
        ("model", f"random Qwen2 0.5B-class, {n_params / 1e6:.0f}M params, bf16", ""),
        ("generation", f"{gen_rate:,.0f} new tokens/s ({gen:.2f} s/step)", f"MFU {gen_mfu:.1%}"),
        ("training", f"{train_rate:,.0f} tokens/s ({train:.2f} s/step)", f"MFU {train_mfu:.1%}"),
        ("peak memory", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", ""),
    ])  # fmt: skip
    report.data = {"gen_s": gen, "train_s": train, "gen_mfu": gen_mfu, "train_mfu": train_mfu}
