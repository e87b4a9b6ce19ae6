"""TRE mechanism experiment, bonus-only drift (docs/exploration.md, "Mechanism: bonus-only
drift"; the rule is registered there): on fixed SmolLM2 rollouts with no reward, each bonus is
ascended until the full-vocabulary entropy of the rollout's positions has risen by the same
amount, and the gain is split into the part inside each position's initial top-2 set (the
trust region) and the part outside it. Does the plain entropy bonus put its gain in the tail and
TRE-K inside the region, although both move shared parameters?

    python scripts/repro/tre_drift.py                      # seeds 1-5, SmolLM2, ~15 min alone
    python scripts/repro/tre_drift.py --smoke              # tiny random model, plumbing only

Writes ``--out`` (default docs/exploration_drift.json): per seed and arm, the steps taken, the
entropy gain reached and its region / tail split, the masses outside the initial top-2 set and
the initial 0.99 nucleus, with the settings and the commit.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from lit_rlhf.algos.entropy import entropy_from_logits  # noqa: E402
from lit_rlhf.algos.trust_region import trust_region_entropy  # noqa: E402
from lit_rlhf.data import CountdownPrompts  # noqa: E402
from lit_rlhf.models import load_causal_lm, load_tokenizer  # noqa: E402

QUESTION = (
    "Combine the three numbers with +, using each exactly once, to reach the target. Write only "
    "the expression and close the tag. Example: numbers 3, 4, 5 and target 12 give <answer>3 + 4 "
    "+ 5</answer>. Now: numbers {numbers} and target {target}."
)  # the TRE comparison's pre-check difficulty "3 numbers 1-10, +" (scripts/repro/tre.py)


ARMS = ("entropy", "tre-k")


def rollouts(model: Any, tokenizer: Any, prompts: int, new_tokens: int, seed: int) -> dict:
    """``prompts`` Countdown prompts (data seed ``seed``) with one sampled response each."""
    rows = CountdownPrompts(
        num_examples=prompts, seed=seed, num_numbers=3, max_value=10, max_target=30,
        operators="+", question_template=QUESTION,
    ).load()  # fmt: skip
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
        )
        for r in rows
    ]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left").to(model.device)
    torch.manual_seed(seed)
    out = model.generate(
        **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    width = enc["input_ids"].shape[1]
    mask = torch.cat([enc["attention_mask"], torch.ones_like(out[:, width:])], dim=1)
    return {"ids": out, "mask": mask, "start": width}


def response_logits(model: Any, batch: dict) -> Tensor:
    """[positions, V] float32 logits predicting each response token."""
    logits = model(input_ids=batch["ids"], attention_mask=batch["mask"]).logits
    return logits[:, batch["start"] - 1 : -1].reshape(-1, logits.shape[-1]).float()


@torch.no_grad()
def split(logits: Tensor, region: Tensor, nucleus: Tensor) -> dict[str, float]:
    """Mean over positions: full entropy, its parts inside / outside ``region`` (bool [N, V]),
    and the masses outside ``region`` and outside ``nucleus``."""
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    terms = -p * log_p
    return {
        "entropy": float(terms.sum(-1).mean()),
        "entropy_region": float((terms * region).sum(-1).mean()),
        "entropy_tail": float((terms * ~region).sum(-1).mean()),
        "mass_outside_top2": float((p * ~region).sum(-1).mean()),
        "mass_outside_nucleus": float((p * ~nucleus).sum(-1).mean()),
    }


def initial_sets(logits: Tensor, k: int, p: float) -> tuple[Tensor, Tensor]:
    """Per position, the initial top-``k`` set and the smallest set of mass >= ``p``."""
    order = logits.argsort(dim=-1, descending=True)
    region = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, order[:, :k], True)
    probs = torch.softmax(logits, dim=-1).gather(-1, order)
    keep = (probs.cumsum(-1) - probs) < p  # the token that crosses p is kept
    nucleus = torch.zeros_like(region).scatter_(-1, order, keep)
    return region, nucleus


def bonus(arm: str, logits: Tensor) -> Tensor:
    if arm == "entropy":
        return entropy_from_logits(logits).mean()
    return trust_region_entropy(logits, mode="topk", k=2)[0].mean()


def drift(model: Any, batch: dict, arm: str, opts: argparse.Namespace) -> dict[str, Any]:
    """Ascend ``arm``'s bonus until the full entropy has risen by ``opts.gain`` (or the step
    budget ends); the figures at that step, against the initial sets."""
    policy = copy.deepcopy(model).train()
    with torch.no_grad():
        start_logits = response_logits(policy, batch)
    region, nucleus = initial_sets(start_logits, 2, 0.99)
    before = split(start_logits, region, nucleus)
    optimizer = torch.optim.SGD(policy.parameters(), lr=opts.lr[arm])
    after, steps = before, 0
    while steps < opts.max_steps and after["entropy"] - before["entropy"] < opts.gain:
        loss = -bonus(arm, response_logits(policy, batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        with torch.no_grad():
            after = split(response_logits(policy, batch), region, nucleus)
    gain = after["entropy"] - before["entropy"]
    deltas = {f"delta_{k}": after[k] - before[k] for k in before}
    share = deltas["delta_entropy_tail"] / gain if gain > 0 else math.nan
    return {"steps": steps, "reached": gain >= opts.gain, "tail_share_of_gain": share,
            "before": before, **deltas}  # fmt: skip


def primary(results: dict[str, Any]) -> dict[str, Any]:
    """The registered primary: per seed, the far-tail mass gained per nat of entropy gained,
    entropy bonus minus TRE-K; the mean with its percentile-bootstrap and t intervals and the
    verdict (docs/exploration.md)."""
    from scipy import stats  # here: the GPU window's image may lack scipy (tre_drift_gpu.py)

    per_seed = [
        r["entropy"]["delta_mass_outside_nucleus"] / r["entropy"]["delta_entropy"]
        - r["tre-k"]["delta_mass_outside_nucleus"] / r["tre-k"]["delta_entropy"]
        for r in results.values()
    ]
    d = np.array(per_seed)
    if len(d) < 2:
        return {"per_seed": per_seed}
    boot = stats.bootstrap((d,), np.mean, method="percentile", n_resamples=10_000,
                           random_state=np.random.default_rng(0)).confidence_interval  # fmt: skip
    t = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    lo, hi = float(boot.low), float(boot.high)
    verdict = "reproduced" if lo > 0 else "opposite" if hi < 0 else "not shown"
    return {"per_seed": per_seed, "mean": float(d.mean()), "bootstrap_95": [lo, hi],
            "t_95": [float(t[0]), float(t[1])], "verdict": verdict}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--smoke", action="store_true", help="tiny random model, 1 seed")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "exploration_drift.json")
    opts = parser.parse_args(argv)
    model_name = "builtin:tiny-llama" if opts.smoke else "builtin:smollm2-135m-instruct"
    opts.prompts, opts.new_tokens = (4, 4) if opts.smoke else (8, 16)
    opts.gain, opts.max_steps = (0.05, 5) if opts.smoke else (0.3, 40)
    # step size from the pilot on seed 0 (docs/history/exploration.md): 2e-4 reached the gain in
    # 5 steps
    opts.lr = {"entropy": 0.05, "tre-k": 0.05} if opts.smoke else {"entropy": 1e-4, "tre-k": 1e-4}
    seeds = opts.seeds[:1] if opts.smoke else opts.seeds
    torch.manual_seed(0)
    tokenizer = load_tokenizer(model_name)
    model = load_causal_lm(model_name, dtype="float32").eval()
    results: dict[str, Any] = {}
    for seed in seeds:
        t0 = time.monotonic()
        batch = rollouts(model, tokenizer, opts.prompts, opts.new_tokens, seed)
        results[str(seed)] = {arm: drift(model, batch, arm, opts) for arm in ARMS}
        seconds = time.monotonic() - t0
        for arm, r in results[str(seed)].items():
            print(f"seed {seed} {arm}: {r['steps']} steps, gain {r['delta_entropy']:.3f}, "
                  f"tail share {r['tail_share_of_gain']:.3f}, far tail "
                  f"{r['delta_mass_outside_nucleus']:+.4f} ({seconds:.0f} s)")  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    settings = {k: v for k, v in vars(opts).items() if k != "out"}
    record = {"model": model_name, "settings": settings, "commit": commit.stdout.strip(),
              "seeds": results, "primary": primary(results)}  # fmt: skip
    print("primary:", json.dumps(record["primary"]))
    if not opts.smoke:
        opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
        print(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
