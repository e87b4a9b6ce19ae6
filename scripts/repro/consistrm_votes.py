"""How good are the warm judge's own votes at a given temperature? The ConsistRM pre-check's
question (does the majority of the judge's samples beat its greedy verdict?) asked again at
lower temperatures and with more votes, on the same warm judge and unlabelled pool as
``scripts/reproduce.py consistrm --preset cpu`` (run that first: it trains the judge and writes
the pools).

    python scripts/repro/consistrm_votes.py 0.6 0.3 --samples 16

Per temperature: majority-of-8 (the first 8 samples) and majority-of-all accuracy, a random
sample's accuracy, the format-valid share, the majority-of-8 positional consistency and the wall
time; printed, and written to ``runs/reproduce/consistrm/cpu/votes.json``. Results:
docs/history/grm.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/
from repro import judge_common as jc
from repro.consistrm import PRESETS


def vote_figures(model: str, pool: Path, temperature: float, samples: int) -> dict[str, float]:
    start = time.perf_counter()
    preds, rows = jc.predict_pool(
        model, pool, samples=samples, seed=0, max_new_tokens=64, batch_size=16,
        reflective=False, temperature=temperature,
    )  # fmt: skip
    first8, every, valid, single = [], [], [], []
    families: dict[str, list[bool]] = {}
    for p in preds:
        row = rows[p["query_id"]]
        label, votes = int(row["label"]), p["votes"]
        first8.append(jc.majority(votes[:8]) == label)
        every.append(jc.majority(votes) == label)
        valid += [v is not None for v in votes]
        single.append(statistics.fmean(v == label for v in votes))
        families.setdefault(str(row["family_id"]), []).append(first8[-1])
    return {
        "majority_8": statistics.fmean(first8),
        f"majority_{samples}": statistics.fmean(every),
        "random_sample": statistics.fmean(single),
        "format_valid": statistics.fmean(valid),
        "majority_8_consistency": statistics.fmean(all(f) for f in families.values()),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("temperatures", type=float, nargs="+")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("runs/reproduce/consistrm/cpu"))
    args = parser.parse_args()
    if args.samples < 8:
        parser.error("--samples must be >= 8 (majority-of-8 is read from the first 8)")
    settings = PRESETS["cpu"].settings
    model = jc.warm_judge(args.out, settings)
    pool = args.out / "pools" / "unlabelled.jsonl"
    if not pool.exists():
        parser.error(f"{pool} is missing: run scripts/reproduce.py consistrm --precheck-only first")
    results = {}
    for t in args.temperatures:
        results[str(t)] = vote_figures(model, pool, t, args.samples)
        print(t, json.dumps(results[str(t)]), flush=True)
    (args.out / "votes.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
