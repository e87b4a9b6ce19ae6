"""Compression, carry first: the size-fidelity comparison in the regime where our compressors
carry their context (docs/compressor.md, "Carry first"; the rule is registered there before
the first run).

    python scripts/repro/compression_sizes.py            # seeds 0-4, cached, resumable
    python scripts/repro/compression_sizes.py --smoke    # tiny random models, plumbing only

Per seed and size, SmolLM2 cut to 4 / 10 / 30 layers trains as a compressor (LoRA, 4 memory
tokens, 400 steps) against the frozen SmolLM2 decoder on one-sentence counterfactual facts,
validated on 96 development facts every 50 steps (weights saved at each). Gates: every size
carries at its final step (development gain > 0.5 nats per token), and the smallest and largest
have a pair of snapshots matched by development gain whose evaluation gains are within 0.2.
Primary: at that pair, the overwrite margin per evaluation fact (the decoder's log p(prior value)
- log p(context value) at the value slot, reading the fact's memory), largest minus smallest;
the final weights' difference is reported beside it. Writes ``--out`` (default
docs/compressor_sizes.json).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))

from repro.common import git_commit  # noqa: E402
from repro.compression_matched import (  # noqa: E402
    DEV_SEED,
    choose,
    matched_settings,
    read_snapshot,
    train_curve,
)
from repro.compression_planted import EVAL_SEED, TRAIN_SEED, cut_model, fact_items  # noqa: E402
from repro.intervals import Interval  # noqa: E402

SIZES = {"small": 4, "mid": 10, "large": 30}
CARRY = 0.5  # nats per token: the gate's memory gain
EQUAL = 0.2  # nats per token: the matched pair's largest evaluation gain difference
RESAMPLES = 10_000


def size_settings(smoke: bool) -> dict[str, Any]:
    """The planted checks' compressor settings, validated every 50 steps, three sizes."""
    s = matched_settings(smoke)
    for key in ("plant_sentences", "plant_steps", "plant_lr", "plant_batch"):
        s.pop(key)
    s.update(every=50, sizes=dict(SIZES), match_above=CARRY, seeds=[0, 1, 2, 3, 4])
    if smoke:  # tiny random models carry nothing: match any pair, to run the reading too
        s.update(every=1, sizes={"small": 1, "large": 2}, match_above=-math.inf, seeds=[0])
    return s


def cut(s: dict[str, Any], layers: int, out: Path) -> Path:
    """SmolLM2 cut to ``layers`` layers, saved once as a folder with its tokenizer."""
    return cut_model(s, out, layers, f"cut{layers}")


Items = list[dict[str, Any]]


def read(s: dict[str, Any], size: str, seed: int, step: int, out: Path,
         evaluation: Items) -> dict[str, Any]:  # fmt: skip
    """The size's weights saved at ``step``, read on the evaluation facts (cached)."""
    folder = out / f"seed{seed}" / size
    path = folder / f"read{step}.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    lm = cut(s, s["sizes"][size], out)
    figures = read_snapshot(s, lm, folder / "snapshots" / f"step{step}.pt", evaluation, folder)
    path.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def seed_figures(s: dict[str, Any], seed: int, sizes: list[str], out: Path, evaluation: Items,
                 dev: Items) -> dict[str, Any]:  # fmt: skip
    """Per size, the development curve and the final weights' reading; for the smallest and
    largest size, the pair of snapshots matched by development gain and its reading."""
    avoid = {i["sentence"] for i in evaluation}
    order = [*sizes[:1], *sizes[-1:], *sizes[1:-1]] if len(sizes) > 1 else sizes
    trained = {
        z: train_curve(s, cut(s, s["sizes"][z], out), TRAIN_SEED + seed, avoid, dev,
                       out / f"seed{seed}" / z)
        for z in order  # the primary's two sizes first
    }  # fmt: skip
    curves = {z: trained[z] for z in sizes}
    final = {z: read(s, z, seed, int(max(c, key=int)), out, evaluation) for z, c in curves.items()}
    figures: dict[str, Any] = {"curves": curves, "final": final}
    if len(sizes) >= 2:
        small, large = sizes[0], sizes[-1]
        pair = choose({"planted": curves[large], "twin": curves[small]}, s["match_above"])
        figures["pair"] = None if pair is None else {large: pair[0], small: pair[1]}
        if pair is not None:
            steps = {large: pair[0], small: pair[1]}
            figures["matched"] = {z: read(s, z, seed, n, out, evaluation) for z, n in steps.items()}
    return figures


def two_way_bootstrap(diffs: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean of ``diffs`` [seeds, facts], seeds and facts each
    resampled with replacement (the facts are the same for every seed: a crossed design)."""
    rng = np.random.default_rng(seed)
    n_seeds, n_facts = diffs.shape
    means = np.empty(RESAMPLES)
    for r in range(RESAMPLES):
        rows = rng.integers(0, n_seeds, n_seeds)
        cols = rng.integers(0, n_facts, n_facts)
        means[r] = diffs[np.ix_(rows, cols)].mean()
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def compare(diffs: np.ndarray) -> dict[str, Any]:
    """``diffs`` [seeds, facts]: the mean, the t-interval over the per-seed means (the seed is
    the unit that varies most) and the two-way bootstrap; the reading asks both to agree."""
    per_seed = [float(d.mean()) for d in diffs]
    t_int = Interval.of(per_seed)
    low, high = two_way_bootstrap(diffs)
    above = low > 0 and t_int.excludes_zero() and t_int.low > 0  # one seed: never
    below = high < 0 and t_int.excludes_zero() and t_int.high < 0
    return {"mean": float(diffs.mean()), "per_seed": per_seed, "t_95": [t_int.low, t_int.high],
            "bootstrap_95": [low, high],
            "reads": "shown" if above else "opposite" if below else "not shown"}  # fmt: skip


def verdict(
    seeds: dict[str, dict[str, Any]], sizes: list[str], scale: str = "CPU scale"
) -> dict[str, Any]:
    """The gates (every size carries on the development facts at its final step; a matched pair
    of the smallest and largest, equal within 0.2 on the evaluation facts), then the primary:
    largest - smallest overwrite margin per fact at the matched pair."""
    small, large = sizes[0], sizes[-1]
    carry = {k: {z: f["curves"][z][max(f["curves"][z], key=int)] for z in sizes}
             for k, f in seeds.items()}  # fmt: skip
    gains = {k: None if f.get("pair") is None else
             [f["matched"][large]["memory_gain"], f["matched"][small]["memory_gain"]]
             for k, f in seeds.items()}  # fmt: skip
    passes = all(g > CARRY for by_size in carry.values() for g in by_size.values()) and all(
        g is not None and min(g) > CARRY and abs(g[0] - g[1]) <= EQUAL for g in gains.values()
    )
    out: dict[str, Any] = {"gate_dev_gain": carry, "matched_eval_gain": gains, "passes": passes}

    def diffs(key: str) -> np.ndarray:
        return np.array([np.subtract(f[key][large]["margins"], f[key][small]["margins"])
                         for f in seeds.values()])  # fmt: skip

    out["final"] = compare(diffs("final"))  # secondary: each size after its 400 steps
    if all(g is not None for g in gains.values()):
        out.update(compare(diffs("matched")))
    reads = out.get("reads", "no matched pair")
    out["verdict"] = reads if passes else f"not testable at {scale} (read: {reads})"
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", help="these seeds only (no verdict)")
    parser.add_argument("--sizes", nargs="+", help="these sizes only (no verdict)")
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "reproduce" / "sizes")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compressor_sizes.json")
    opts = parser.parse_args(argv)
    s = size_settings(opts.smoke)
    registered, all_sizes = list(s["seeds"]), list(s["sizes"])
    s["seeds"] = list(opts.seeds or registered)
    sizes = [z for z in all_sizes if not opts.sizes or z in opts.sizes]
    out = opts.root / ("smoke" if opts.smoke else "cpu")
    evaluation = fact_items(s["eval_facts"], EVAL_SEED)
    dev = fact_items(s["dev_facts"], DEV_SEED, {i["sentence"] for i in evaluation})
    seeds: dict[str, dict[str, Any]] = {}
    record: dict[str, Any] = {"settings": s, "carry_gate": CARRY, "commit": git_commit()}
    record.update(evaluation=[i["sentence"] for i in evaluation], seeds=seeds)
    for seed in s["seeds"]:
        seeds[str(seed)] = seed_figures(s, seed, sizes, out, evaluation, dev)
        gains = {z: round(f["memory_gain"], 3) for z, f in seeds[str(seed)]["final"].items()}
        print(f"seed {seed}: final evaluation memory gain {gains}", flush=True)
        if len(sizes) >= 2:
            record["primary"] = verdict(seeds, sizes)
        missing = [n for n in registered if str(n) not in seeds]
        missing += [z for z in all_sizes if z not in sizes]
        if missing:
            record.setdefault("primary", {})["verdict"] = f"none yet: {missing} not run"
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")  # after each seed
    print("primary:", json.dumps(record.get("primary", {})))
    return record


if __name__ == "__main__":
    main()
