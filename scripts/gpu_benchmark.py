"""PPO step throughput on one GPU with a randomly initialised 0.5B-class Qwen2 (no downloads).

Prints generation and training tokens/s and the model FLOPs utilisation (MFU) against the bf16
matmul rate measured on the same device in the same run.

    python scripts/gpu_benchmark.py [--steps 5] [--batch 16] [--prompt-len 128] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lit_rlhf.algos import clipped_policy_loss, masked_mean, token_log_probs

# Qwen2.5-0.5B's shape (random weights).
QWEN05 = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def matmul_tflops(device: torch.device, n: int = 8192, reps: int = 20) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    opts = parser.parse_args()
    device = torch.device("cuda")
    peak = matmul_tflops(device)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN05)).to(device, torch.bfloat16)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    gen_times, train_times = [], []
    for step in range(opts.steps + 1):
        prompts = torch.randint(0, 150000, (opts.batch, opts.prompt_len), device=device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            seq = model.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=True,
                max_new_tokens=opts.new_tokens,
                min_new_tokens=opts.new_tokens,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.train()
        response = seq[:, opts.prompt_len :]
        logits = model(seq, logits_to_keep=response.shape[1] + 1).logits[:, :-1]
        log_probs = token_log_probs(logits, response)
        mask = torch.ones_like(response, dtype=torch.bool)
        adv = torch.randn(response.shape[0], 1, device=device).expand_as(log_probs)
        loss, _ = clipped_policy_loss(log_probs, log_probs.detach(), adv, mask)
        masked_mean(loss, mask).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if step > 0:  # the first step warms up kernels and the allocator
            gen_times.append(t1 - t0)
            train_times.append(t2 - t1)
    gen, train = statistics.median(gen_times), statistics.median(train_times)
    new_tokens = opts.batch * opts.new_tokens
    all_tokens = opts.batch * (opts.prompt_len + opts.new_tokens)
    # 2 N FLOPs per token forward, 6 N forward + backward (attention FLOPs left out)
    gen_mfu = 2 * n_params * (new_tokens + opts.batch * opts.prompt_len) / gen / 1e12 / peak
    train_mfu = 6 * n_params * all_tokens / train / 1e12 / peak
    print(f"| device | {torch.cuda.get_device_name()} | bf16 matmul {peak:.0f} TFLOP/s |")
    print(f"| model | random Qwen2 0.5B-class, {n_params / 1e6:.0f}M params, bf16 | |")
    gen_rate, train_rate = new_tokens / gen, all_tokens / train
    print(f"| generation | {gen_rate:,.0f} new tokens/s ({gen:.2f} s/step) | MFU {gen_mfu:.1%} |")
    print(f"| training | {train_rate:,.0f} tokens/s ({train:.2f} s/step) | MFU {train_mfu:.1%} |")
    print(f"| peak memory | {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB | |")


if __name__ == "__main__":
    main()
