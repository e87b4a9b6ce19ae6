"""Measure the vLLM engine's weight push after a real optimizer step: the former per-parameter
push (``push_bucket_bytes=0``) against the bucketed one, side by side in one run.

    python -m lit_rlhf.measure.push [--model builtin:mid-llama] [--pushes N]
        [--bucket-bytes B] [--snapshot-device none|cpu] [--out x.json]

Runs in the vLLM venv (``.venv-vllm``; ``VLLM_ENABLE_V1_MULTIPROCESSING=0``). One in-process
:class:`~lit_rlhf.rollout.VLLMGenerationEngine` (float32, ``enforce_eager``, a 64 MiB KV cache)
serves a float32 policy (on the GPU when there is one) trained with AdamW on a fixed batch's
language-model loss, so every weight moves at every step. Each round makes one step and one
timed push per path, the order alternating between rounds (``--pushes`` rounds after one
untimed warm-up round). Before a reference push the engine's copy is brought up to the weights
of before the step (untimed), as after the former push of the step before; the reference keeps
that copy where the former default did (``--snapshot-device none``: next to each parameter).
The policy is fully trained, so the bucketed path pushes every weight without a copy.

Prints (and with ``--out`` writes) a JSON: per push the seconds (around ``sync_weights``,
accelerator synchronised), tensors, bytes and reload calls, each path's median, the ratio of
the medians (reference / bucketed: above 1, the bucketed push is faster), and the largest gap
between vLLM's greedy log-probs and the policy's after the last push.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

PROMPTS = ["hello there", "Using the numbers [1, 2]", "The quick brown fox", "What is 15 + 27?"]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lit_rlhf.measure.push", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--model", default="builtin:mid-llama", help="folder, hub id, builtin:")
    parser.add_argument("--pushes", type=int, default=5, help="timed pushes per path")
    parser.add_argument("--bucket-bytes", type=int, default=512 << 20, help="bucketed path's")
    parser.add_argument("--snapshot-device", default="none", help="the reference's copy")
    parser.add_argument("--out", help="also write the JSON here")
    opts = parser.parse_args(argv)
    if opts.pushes < 1 or opts.bucket_bytes < 1:
        parser.error("--pushes and --bucket-bytes must be >= 1")
    return opts


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_push(engine: Any, policy: Any, bucket_bytes: int, device: torch.device) -> dict:
    engine.push_bucket_bytes = bucket_bytes
    _sync(device)
    start = time.perf_counter()
    engine.sync_weights(policy)
    _sync(device)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "tensors": engine.last_sync_tensors,
        "bytes": engine.last_sync_bytes,
        "calls": engine.last_sync_buckets,
    }


def _served_gap(engine: Any, policy: Any, tokenizer: Any, batch: Any) -> float:
    """Largest |vLLM greedy log-prob - the policy's| over the response tokens."""
    from lit_rlhf.models import forward_response

    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    ids = torch.cat([batch.input_ids, out.response_ids], dim=1)
    mask = torch.cat([batch.attention_mask.bool(), out.response_mask], dim=1)
    with torch.no_grad():
        ref = forward_response(policy, ids, mask, out.response_ids, temperature=1.0).log_probs
    return float((out.log_probs - ref)[out.response_mask].abs().max())


def run(opts: argparse.Namespace) -> dict[str, Any]:
    from lit_rlhf.models import load_causal_lm, load_tokenizer, resolve
    from lit_rlhf.models.lora import served_parameters
    from lit_rlhf.rollout import VLLMGenerationEngine

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    path = resolve(opts.model)
    tokenizer = load_tokenizer(path)
    policy: Any = load_causal_lm(path)
    policy.to(device)
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True).to(device)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    snapshot_device = None if opts.snapshot_device == "none" else opts.snapshot_device
    engine = VLLMGenerationEngine(
        max_new_tokens=8, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20,
        max_model_len=256, snapshot_device=snapshot_device, push_bucket_bytes=opts.bucket_bytes,
    )  # fmt: skip
    paths = {"reference": 0, "bucketed": opts.bucket_bytes}
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    try:
        engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
        for round_ in range(opts.pushes + 1):  # round 0: warm-up, not recorded
            order = list(paths) if round_ % 2 == 0 else list(paths)[::-1]
            for name in order:
                if name == "reference":  # its copy: the weights before this step (untimed)
                    engine.snapshot.update(served_parameters(policy))
                loss = policy(**batch, labels=labels).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                push = _timed_push(engine, policy, paths[name], device)
                if round_ > 0:
                    runs[name].append(push)
        gap = _served_gap(engine, policy, tokenizer, batch)
    finally:
        engine.close()
    medians = {n: statistics.median(r["seconds"] for r in runs[n]) for n in runs}
    return {
        "model": opts.model,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "parameters": sum(p.numel() for p in policy.parameters()),
        "pushes_per_path": opts.pushes,
        "bucket_bytes": opts.bucket_bytes,
        "reference_snapshot_device": opts.snapshot_device,
        "runs": runs,
        "median_s": medians,
        "ratio_reference_over_bucketed": medians["reference"] / medians["bucketed"],
        "max_served_log_prob_gap": gap,
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process, before vLLM
    record = run(opts)
    text = json.dumps(record, indent=1)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
