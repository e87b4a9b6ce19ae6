"""ReflectRM mechanism experiment, planted analysis pairs (docs/grm.md, "Stage 2 on planted
analysis pairs"; the rule is registered there): does the warm judge's reflection step pick the
right analysis when the other one checks a wrong value, and does it in both orders?

    python scripts/repro/reflectrm_planted.py            # the CPU preset's warm judge, ~5 min
    python scripts/repro/reflectrm_planted.py --smoke    # tiny random judge, plumbing only

Each development pair (new questions: disjoint from the warm-start, unlabelled and held-out pools
and from the pairs reserved for the stage-2 comparison) is shown twice, the right analysis as
Critique 1 and as Critique 2; both analyses come from target judgments read the way reflective
inference reads sampled ones. The judge answers greedily through
``GenerativeRewardModule.compare_analyses`` (stage 2's own prompts, rendering and parsing).
Writes ``--out`` (default docs/grm_reflectrm_planted.json): every prompt's reply, verdict and
outcome, the figures with their intervals, the gate, the settings and the commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))
from repro import judge_common as jc  # noqa: E402
from repro.common import git_commit  # noqa: E402
from repro.consistrm import PRESETS  # noqa: E402
from repro.intervals import binomial_interval, bootstrap_interval  # noqa: E402

GATE = 0.6  # reflection accuracy the stage-2 comparison needs (issue [7/7] item 3)
POOLS = {"dev": 96, "primary": 192}  # dev: this experiment; primary: reserved, never read here


def planted_pools(settings: dict[str, Any]) -> dict[str, list[jc.ArithPair]]:
    """The development pool and the stage-2 comparison's reserved pool: new questions, none in
    the preset's warm-start, unlabelled or held-out pools."""
    used = jc.make_pools(settings["pools"], seed=0, max_value=settings["max_value"])
    taken = {(p.a, p.op, p.b) for pool in used.values() for p in pool}
    sizes = {k: max(1, v // 24) for k, v in POOLS.items()} if settings.get("smoke") else POOLS
    return jc.make_pools(sizes, seed=7, max_value=settings["max_value"], exclude=taken)


def questions(pair: jc.ArithPair, fmt: Any) -> list[tuple[dict[str, str], tuple[str, str], bool]]:
    """The pair's two prompts: (row, (analysis 1, analysis 2), the right one shown first), the
    analyses read from target judgments by the judge's format ``fmt`` as stage 2 reads them."""
    from lit_rlhf.algos.judge import analysis_text

    right = analysis_text(fmt.text(jc.judgment(pair)))
    wrong = analysis_text(fmt.text(jc.planted_judgment(pair)))
    r1, r2 = (f"{pair.expr} = {v}" for v in pair.values)
    row = {"query": f"What is {pair.expr}?", "response_1": r1, "response_2": r2,
           "query_id": pair.pair_id}  # fmt: skip
    return [(row, (right, wrong), True), (row, (wrong, right), False)]


def figures(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Reflection accuracy (pair-clustered bootstrap over pairs), positional consistency and the
    'Critique 1' rate (exact binomial), the unreadable rate, and the gate."""
    by_pair: dict[str, list[bool]] = {}
    for o in outcomes:
        by_pair.setdefault(o["pair"], []).append(o["correct"])
    per_pair = [sum(v) / len(v) for v in by_pair.values()]
    both = sum(all(v) for v in by_pair.values())
    first = sum(o["verdict"] == -1 for o in outcomes)
    unreadable = sum(o["verdict"] is None for o in outcomes)
    accuracy = bootstrap_interval(per_pair, 0.0, 1.0)
    return {
        "pairs": len(by_pair),
        "prompts": len(outcomes),
        "reflection_accuracy": vars(accuracy),
        "positional_consistency": vars(binomial_interval(both, len(by_pair))),
        "says_critique_1": vars(binomial_interval(first, len(outcomes))),
        "unreadable": unreadable / max(1, len(outcomes)),
        "gate": {"threshold": GATE, "passes": accuracy.mean >= GATE and accuracy.low > 0.5},
    }


def judge(
    model: str, pairs: list[jc.ArithPair], settings: dict[str, Any], device: str = "cpu"
) -> list[dict[str, Any]]:
    """Every planted prompt through the warm judge's stage 2, in batches, on ``device``."""
    module = jc.judge_module(model, samples=2, seed=0, max_new_tokens=settings["max_new_tokens"])
    module.configure_model()
    module.to(device)
    module.policy.eval()
    jobs = [q for pair in pairs for q in questions(pair, module.judge_format)]
    size, out = settings["eval_batch_size"], []
    for start in range(0, len(jobs), size):
        chunk = jobs[start : start + size]
        replies = module.compare_analyses([(row, pair) for row, pair, _ in chunk])
        for (row, _, right_first), (verdict, text) in zip(chunk, replies, strict=True):
            correct = verdict == (-1 if right_first else 1)
            out.append({"pair": row["query_id"], "right_first": right_first, "reply": text,
                        "verdict": verdict, "correct": correct})  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny random judge, tiny pools")
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT / "runs" / "reproduce",
        help="the reproductions' output root (the warm judge is cached there)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "grm_reflectrm_planted.json")
    opts = parser.parse_args(argv)
    preset = PRESETS["smoke" if opts.smoke else "cpu"]
    settings = {**preset.settings, "smoke": opts.smoke}
    out = opts.root / "reflectrm" / preset.name  # the warm judge's cache is shared with reflectrm
    t0 = time.monotonic()
    pools = planted_pools(settings)
    warm = jc.make_pools(settings["pools"], seed=0, max_value=settings["max_value"])["warm"]
    model, sft_seconds = jc.warm_start(out, warm, settings)
    outcomes = judge(str(model), pools["dev"], settings)
    record = {
        "experiment": "reflectrm planted analysis pairs (docs/grm.md)",
        "settings": {k: settings[k] for k in (*jc.WARM_KEYS, "max_new_tokens")},
        "warm_judge": str(Path(model).relative_to(opts.root.parent)) if not opts.smoke else "",
        "commit": git_commit(),
        "seconds": {"warm_start": round(sft_seconds, 1), "total": round(time.monotonic() - t0, 1)},
        "figures": figures(outcomes),
        "rows": outcomes,
    }
    print(json.dumps(record["figures"], indent=1))
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {opts.out}")
    return record


if __name__ == "__main__":
    main()
