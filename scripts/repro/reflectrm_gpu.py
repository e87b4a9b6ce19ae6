"""ReflectRM, the GPU window (issue [7/7] item 6; docs/grm.md, "The GPU window (`bash
scripts/gpu_paper.sh reflectrm`)", where the rule is registered): one command of at most 8
minutes on one GPU, nothing downloaded.

1. A judge trained inside the command: ``builtin:mid-llama`` (random weights) fine-tuned with
   ``SFTModule`` on checked judgments of a warm pool, analysis-preference rows and every
   question's arithmetic (the CPU judge failed the gate on arithmetic).
2. The gate: the planted analysis pairs of ``reflectrm_planted.py`` on this judge.
3. Only if it passes: the stage-2 comparison on the reserved pairs, seed after seed while time
   is left: reflective-of-8 against majority-of-8 of the same votes on the contested rows.

    python scripts/repro/reflectrm_gpu.py                            # on the GPU
    python scripts/repro/reflectrm_gpu.py --regime smoke --out X     # CPU plumbing, seconds

Writes ``--out`` after every stage (a stopped run keeps what finished): the SFT time, the gate's
replies and figures, per seed every row's votes and verdicts, the primary, the verdict, the
settings and the commit. The smoke regime runs the comparison whatever its gate says (a tiny
random judge never passes it), to exercise the path; its verdict says so.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from repro import judge_common as jc  # noqa: E402
from repro.common import git_commit  # noqa: E402
from repro.consistrm import PRESETS  # noqa: E402
from repro.intervals import Interval, clustered_difference  # noqa: E402
from repro.reflectrm_planted import figures, judge, planted_pools  # noqa: E402
from repro.runs import window_parser  # noqa: E402

_GPU = {"model": "builtin:mid-llama", "sft_config": "configs/sft/tiny.yaml", "in_process": True,
        "accelerator": "auto", "device": "cuda", "max_value": 20, "judge_style": "checked",
        "pools": {"warm": 96, "unlabelled": 48, "eval": 48}, "reflection_every": 2,
        "fact_copies": 4, "sft_steps": 1500, "sft_lr": 1e-3, "sft_batch_size": 64,
        "max_length": 512, "max_new_tokens": 136, "eval_batch_size": 96, "samples": 8,
        "temperature": 1.0, "seeds": [0, 1, 2], "min_contested": 48}  # fmt: skip
_SMOKE = {"model": "builtin:tiny-llama", "accelerator": "cpu", "device": "cpu",
          "pools": {"warm": 4, "unlabelled": 2, "eval": 2}, "fact_copies": 1, "sft_steps": 1,
          "sft_batch_size": 8, "max_new_tokens": 6, "eval_batch_size": 8, "samples": 2,
          "seeds": [0, 1], "min_contested": 1, "smoke": True, "full_judgments": False}  # fmt: skip
REGIMES: dict[str, dict[str, Any]] = {
    "gpu": {**PRESETS["cpu"].settings, **_GPU},
    "smoke": {**PRESETS["cpu"].settings, **_GPU, **_SMOKE},
}


def contested(votes: Sequence[int | None]) -> bool:
    """A row whose readable votes hold both verdicts."""
    readable = {v for v in votes if v is not None}
    return readable == {-1, 1}


def majority_score(votes: Sequence[int | None], label: int) -> float:
    """Majority-of-N's accuracy on one row: 1 right, 0 wrong, 0.5 on a tie (a fair coin)."""
    verdict = jc.majority(votes)
    return 0.5 if verdict == 0 else float(verdict == label)


def seed_rows(judged: Sequence[jc.Judged]) -> list[dict[str, Any]]:
    """Every row's record: votes, anchor, both verdicts, whether contested, both scores."""
    return [
        {"query_id": j.query_id, "pair": j.family, "label": j.label, "greedy": j.greedy,
         "votes": list(j.votes), "anchor": j.anchor, "reflective": j.reflective,
         "majority": jc.majority(j.votes), "contested": contested(j.votes),
         "reflective_score": float(j.reflective == j.label),
         "majority_score": majority_score(j.votes, j.label)}
        for j in judged
    ]  # fmt: skip


def primary(by_seed: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Reflective minus majority accuracy on the contested rows, pooled over seeds: the
    pair-clustered bootstrap (a pair's rows, both orders and every seed, together) and the
    t-interval over per-seed differences beside it."""
    treat: dict[str, float] = {}
    base: dict[str, float] = {}
    clusters: dict[str, str] = {}
    diffs: list[float] = []
    for seed, rows in by_seed.items():
        hard = [r for r in rows if r["contested"]]
        for r in hard:
            key = f"{seed}/{r['query_id']}"
            treat[key], base[key], clusters[key] = (
                r["reflective_score"],
                r["majority_score"],
                r["pair"],
            )
        if hard:
            diffs.append(
                statistics.fmean(r["reflective_score"] - r["majority_score"] for r in hard)
            )
    pooled = clustered_difference({"pooled": treat}, {"pooled": base}, clusters)
    t = Interval.of(diffs) if len(diffs) > 1 else None  # the registered t-interval over seeds
    interval = Interval(pooled.mean, pooled.low, pooled.high, len(diffs), pooled.method,
                        t.low if t else None, t.high if t else None)  # fmt: skip
    return {"contested_rows": len(treat), "contested_pairs": len(set(clusters.values())),
            "per_seed_differences": diffs, "reflective_minus_majority": interval.as_dict(),
            "shown": interval.excludes_zero() and interval.mean > 0}  # fmt: skip


def verdict(gate: Mapping[str, Any], result: Mapping[str, Any] | None, s: Mapping[str, Any]) -> str:
    if not gate["passes"] and not s.get("smoke"):
        return "not testable in the window (the judge's stage 2 does not read the analyses)"
    if result is None:
        return "not testable in the window (no seed of the comparison finished in time)"
    if result["contested_rows"] < s["min_contested"]:
        return f"not testable in the window (fewer than {s['min_contested']} contested rows)"
    prefix = "smoke (gate ignored): " if s.get("smoke") else ""
    return prefix + ("shown" if result["shown"] else "not shown")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    work, out = ROOT / "runs" / "reflectrm_gpu", ROOT / "docs" / "grm_reflectrm_gpu.json"
    opts = window_parser(__doc__ or "", list(REGIMES), work, out).parse_args(argv)
    s = REGIMES[opts.regime]
    t0 = time.monotonic()
    record: dict[str, Any] = {
        "experiment": "reflectrm GPU window (docs/grm.md)",
        "regime": opts.regime,
        "settings": s,
        "commit": git_commit(),
    }

    def save() -> None:
        record["seconds"] = round(time.monotonic() - t0, 1)
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")

    pools = planted_pools(s)
    warm = jc.make_pools(s["pools"], seed=0, max_value=s["max_value"])["warm"]
    model, sft_s = jc.warm_start(opts.work, warm, s)
    record["sft_seconds"] = round(sft_s, 1)
    gate_rows = judge(str(model), pools["dev"], s, device=s["device"])
    record["gate"] = {**figures(gate_rows), "rows": gate_rows}
    save()
    by_seed: dict[str, list[dict[str, Any]]] = {}
    record["seeds"], result = by_seed, None
    if record["gate"]["gate"]["passes"] or s.get("smoke"):
        path = jc.write_pairs(pools["primary"], opts.work / "primary.jsonl")
        last = 0.0
        for seed in s["seeds"]:
            if time.monotonic() - t0 + last > opts.budget_s:
                break
            start = time.monotonic()
            judged = jc.judge_pool(
                str(model), path, samples=s["samples"], seed=seed,
                max_new_tokens=s["max_new_tokens"], batch_size=s["eval_batch_size"],
                accelerator=s["accelerator"],
            )  # fmt: skip
            by_seed[str(seed)] = seed_rows(judged)
            record.setdefault("inference", {})[str(seed)] = jc.inference_figures(judged)
            result = record["primary"] = primary(by_seed)
            last = time.monotonic() - start
            save()
    record["verdict"] = verdict(record["gate"]["gate"], result, s)
    save()
    print(json.dumps({k: record.get(k) for k in ("verdict", "primary", "seconds")}, indent=1))
    return record


if __name__ == "__main__":
    main()
