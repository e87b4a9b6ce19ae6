"""Compression carry-first, the GPU window (issue [7/7] item 6; docs/compressor.md, "The GPU
window"): the size comparison of ``compression_sizes.py`` as one command of at most 8 minutes on
one H200, with nothing downloaded. SmolLM2 does not travel (a command carries 64 MiB), so the
decoder is trained inside the command: ``builtin:mid-llama`` (random weights, 8 layers, width
512) learns a corpus of fact sentences in which each subject takes its prior value in
``prior_share`` of the sentences ("The carrots in Kofi's field are orange.") and another value
otherwise, so its priors are ours to know. Then the CPU comparison runs on it: that LM cut to
2 / 4 / 8 layers trains as compressors against it, frozen, on one-sentence counterfactual facts;
gates and primary as registered for the CPU comparison.

    python scripts/repro/compression_gpu.py                          # on the GPU
    python scripts/repro/compression_gpu.py --regime smoke --out X   # CPU plumbing, seconds

Writes ``--out`` (default docs/compressor_gpu.json): the LM's training (steps, seconds), per seed
and size the development curves and readings, the verdict, the settings and the commit.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from repro.common import git_commit  # noqa: E402
from repro.compression_matched import DEV_SEED  # noqa: E402
from repro.compression_planted import EVAL_SEED, fact_items, subject_values  # noqa: E402
from repro.compression_runs import fact_stem  # noqa: E402
from repro.compression_sizes import seed_figures, size_settings, verdict  # noqa: E402

REGIMES: dict[str, dict[str, Any]] = {
    "gpu": {"model": "builtin:mid-llama", "corpus": 50_000, "prior_share": 0.9,
            "lm_steps": 3000, "lm_batch": 64, "lm_lr": 1e-3, "copy_fraction": 0.25,
            "device": "cuda", "precision": "bf16-mixed",
            "sizes": {"small": 2, "mid": 4, "large": 8}, "steps": 400, "every": 25,
            "seeds": [0, 1, 2, 3, 4], "lora_rank": 0, "lr": 3e-4},
    "smoke": {"model": "builtin:tiny-llama", "corpus": 200, "prior_share": 0.9, "lm_steps": 3,
              "lm_batch": 4, "lm_lr": 1e-3, "copy_fraction": 0.25, "device": "cpu",
              "precision": "32-true", "sizes": {"small": 1, "large": 2}, "steps": 2, "every": 1,
              "seeds": [0], "lora_rank": 0, "lr": 1e-2},
}  # fmt: skip
CORPUS_SEED = 5000  # probe seed of the LM's corpus (none of the evaluation, training, dev seeds)


def corpus(count: int, prior_share: float, seed: int = CORPUS_SEED) -> list[str]:
    """``count`` fact sentences: the subject's prior value with probability ``prior_share``,
    else one of its other values, uniformly."""
    from lit_rlhf.data.probes import make_probes

    rng = random.Random(seed)
    values = subject_values()
    texts = []
    for item in make_probes("overwrite", count, seed=seed):
        others = [v for v in values[item["subject"]] if v != item["prior"]]
        value = item["prior"] if rng.random() < prior_share else rng.choice(others)
        texts.append(f"{fact_stem(item)} {value}.")
    return texts


def window_settings(regime: str) -> dict[str, Any]:
    """The CPU comparison's settings with the regime's models, hardware and schedule."""
    r = REGIMES[regime]
    s = size_settings(smoke=regime == "smoke")
    s.update({k: r[k] for k in ("sizes", "steps", "every", "seeds", "lora_rank", "lr")})
    s.update(precision=r["precision"], accelerator="cuda" if r["device"] == "cuda" else "cpu")
    s["lm"] = {k: r[k] for k in ("model", "corpus", "prior_share", "lm_steps", "lm_batch",
                                 "lm_lr", "copy_fraction")}  # fmt: skip
    return s


def train_lm(s: dict[str, Any], device: str, out: Path) -> tuple[Path, dict[str, Any]]:
    """The decoder LM, trained on the prior corpus (cached)."""
    from lit_rlhf.models.pretrain import pretrain_on_texts

    folder, lm = out / "lm", s["lm"]
    record: dict[str, Any] = {"cached": (folder / "config.json").exists()}
    if not record["cached"]:
        start = time.perf_counter()
        texts = corpus(lm["corpus"], lm["prior_share"])
        pretrain_on_texts(lm["model"], texts, folder, steps=lm["lm_steps"], seq_len=64,
                          batch_size=lm["lm_batch"], lr=lm["lm_lr"],
                          copy_fraction=lm["copy_fraction"], device=device)  # fmt: skip
        record["seconds"] = time.perf_counter() - start
    return folder, record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(REGIMES), default="gpu")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "compression_gpu")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compressor_gpu.json")
    parser.add_argument("--budget", type=float, default=330.0,
                        help="seconds after which no new seed starts (the record is written "
                        "after each seed)")  # fmt: skip
    opts = parser.parse_args(argv)
    s = window_settings(opts.regime)
    out = opts.work / opts.regime
    start = time.perf_counter()
    lm, lm_record = train_lm(s, REGIMES[opts.regime]["device"], out)
    s.update(compressor=str(lm), decoder=str(lm))
    evaluation = fact_items(s["eval_facts"], EVAL_SEED)
    dev = fact_items(s["dev_facts"], DEV_SEED, {i["sentence"] for i in evaluation})
    sizes = list(s["sizes"])
    record: dict[str, Any] = {"settings": s, "commit": git_commit(), "lm": lm_record}
    seeds: dict[str, Any] = {}
    for seed in s["seeds"]:
        if time.perf_counter() - start > opts.budget:
            break  # the record so far, within the command's limit
        seeds[str(seed)] = seed_figures(s, seed, sizes, out, evaluation, dev)
        record.update(seconds=time.perf_counter() - start, seeds=seeds)
        record["primary"] = verdict(seeds, sizes, "this scale")
        if len(seeds) < len(s["seeds"]):
            record["primary"]["verdict"] = f"none yet: {len(seeds)} of {len(s['seeds'])} seeds"
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")  # after each seed
        print(f"seed {seed} done at {record['seconds']:.0f} s", flush=True)
    if not seeds:  # the LM took the whole budget
        record["primary"] = {"verdict": f"none yet: 0 of {len(s['seeds'])} seeds"}
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print("primary:", json.dumps({k: v for k, v in record["primary"].items() if k != "final"}))
    return record


if __name__ == "__main__":
    main()
