"""TRE bonus-only drift, the GPU window (issue [7/7] item 6; docs/exploration.md, "The GPU
window"): the drift experiment of ``tre_drift.py`` as one command of at most 8 minutes on one
H200, with nothing downloaded. The SmolLM2 GGUF does not travel (a command carries 64 MiB), so
the policy is trained inside the command: ``builtin:mid-llama`` (random weights, 8 layers,
width 512) fine-tuned with ``SFTModule`` on Countdown questions of the CPU experiment's
difficulty and their solutions, until its next-token distributions are peaked. Then the
registered drift runs on it, with the step size picked on a pilot seed that is not scored.

    python scripts/repro/tre_drift_gpu.py                          # on the GPU (about 5 min)
    python scripts/repro/tre_drift_gpu.py --regime smoke --out X   # CPU plumbing, seconds

Writes ``--out`` (default docs/exploration_drift_gpu.json): the LM's training (steps, seconds,
its last loss), the pilot, per seed and arm the drift figures, the registered primary, the
settings and the commit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from lit_rlhf.data import CountdownPrompts  # noqa: E402
from lit_rlhf.models import load_causal_lm, load_tokenizer  # noqa: E402
from repro import tre_drift as td  # noqa: E402
from repro.judge_common import run_fit, write_jsonl  # noqa: E402
from repro.runs import read_rows, series, write_fragment  # noqa: E402

REGIMES: dict[str, dict[str, Any]] = {
    "gpu": {"model": "builtin:mid-llama", "sft_rows": 8192, "sft_steps": 1500, "sft_batch": 64,
            "sft_lr": 1e-3, "precision": "bf16-mixed", "seeds": list(range(1, 13)),
            "prompts": 64, "new_tokens": 16, "gain": 0.3, "max_steps": 100,
            "lrs": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2]},
    "smoke": {"model": "builtin:tiny-llama", "sft_rows": 16, "sft_steps": 2, "sft_batch": 4,
              "sft_lr": 1e-3, "precision": "32-true", "seeds": [1, 2], "prompts": 4,
              "new_tokens": 4, "gain": 0.05, "max_steps": 5, "lrs": [0.05]},
}  # fmt: skip
PILOT_SEED = 0  # picks the step size; never scored


def sft_rows(count: int) -> list[dict[str, str]]:
    """Countdown questions of the drift's difficulty (data seed 1000, disjoint from the drift's
    seeds) and their solutions in the answer tag the question asks for."""
    rows = CountdownPrompts(
        num_examples=count, seed=1000, num_numbers=3, max_value=10, max_target=30,
        operators="+", question_template=td.QUESTION,
    ).load()  # fmt: skip
    return [{"prompt": r["question"], "response": f"<answer>{r['solution']}</answer>"}
            for r in rows]  # fmt: skip


def train_lm(work: Path, s: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The policy, fine-tuned from random weights inside the command; its HF folder and a record
    of the training (steps, seconds, the last logged loss)."""
    export = work / "lm"
    data = write_jsonl(sft_rows(s["sft_rows"]), work / "sft.jsonl")
    fragment = {
        "seed_everything": 0,
        "trainer": {"accelerator": "auto", "precision": s["precision"], "max_steps": s["sft_steps"],
                    "max_epochs": -1, "enable_checkpointing": False, "enable_progress_bar": False,
                    "callbacks": [], "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                                                "init_args": {"save_dir": str(work), "name": "sft",
                                                              "version": 0}}},
        "model": {"init_args": {"model": s["model"], "export_dir": str(export),
                                "optim": {"lr": s["sft_lr"], "micro_batch_size": s["sft_batch"]}}},
        "data": {"init_args": {"tokenizer": s["model"], "train": str(data), "val": None,
                               "train_split": "train", "prompt_field": "prompt",
                               "response_field": "response", "max_length": 256,
                               "batch_size": s["sft_batch"]}},
    }  # fmt: skip
    start = time.perf_counter()
    run_fit([ROOT / "configs/sft/tiny.yaml", write_fragment(work / "sft.yaml", fragment)],
            in_process=False)  # fmt: skip
    last = series(read_rows(work / "sft" / "version_0" / "metrics.csv"), "train/loss")
    return export, {"steps": s["sft_steps"], "seconds": round(time.perf_counter() - start, 1),
                    "last_loss": last[-1] if last else None}  # fmt: skip


def pilot(model: Any, tokenizer: Any, opts: argparse.Namespace) -> dict[str, Any]:
    """The smallest step size of ``opts.lrs`` with which both arms reach the gain on the pilot
    seed (the largest when none does)."""
    batch = td.rollouts(model, tokenizer, opts.prompts, opts.new_tokens, PILOT_SEED)
    tried = {}
    for lr in opts.lrs:
        opts.lr = {"entropy": lr, "tre-k": lr}
        tried[str(lr)] = {arm: td.drift(model, batch, arm, opts) for arm in td.ARMS}
        if all(r["reached"] for r in tried[str(lr)].values()):
            return {"lr": lr, "tried": tried}
    return {"lr": opts.lrs[-1], "tried": tried}


def score(record: dict[str, Any]) -> dict[str, Any]:
    """The registered primary and the commit, when scipy (and git) are there; else what is
    missing: ``--rescore`` fills them in afterwards from the record's seeds."""
    try:
        from repro.common import git_commit  # imports scipy through repro.intervals

        record["primary"], record["commit"] = td.primary(record["seeds"]), git_commit()
    except ImportError as err:
        record["primary"] = {"missing": f"{err}: run --rescore on this file where scipy is"}
    return record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", choices=sorted(REGIMES), default="gpu")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "tre_drift_gpu")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "exploration_drift_gpu.json")
    parser.add_argument("--rescore", type=Path, help="a record: recompute its primary, no runs")
    args = parser.parse_args(argv)
    if args.rescore:
        record = json.loads(args.rescore.read_text())
        commit = record.get("commit", "unknown")
        record = {**score(record), "commit": commit}  # the commit the runs were made at
        args.rescore.write_text(json.dumps(record, indent=1, default=str) + "\n")
        print("primary:", json.dumps(record["primary"]))
        return record
    s = REGIMES[args.regime]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.monotonic()
    folder, training = train_lm(args.work, s)
    tokenizer = load_tokenizer(str(folder))
    model = load_causal_lm(str(folder), dtype="float32").eval()
    model.to(device)
    opts = argparse.Namespace(**{k: s[k] for k in ("prompts", "new_tokens", "gain", "max_steps",
                                                   "lrs")})  # fmt: skip
    chosen = pilot(model, tokenizer, opts)
    opts.lr = {"entropy": chosen["lr"], "tre-k": chosen["lr"]}
    results = {}
    for seed in s["seeds"]:
        batch = td.rollouts(model, tokenizer, opts.prompts, opts.new_tokens, seed)
        results[str(seed)] = {arm: td.drift(model, batch, arm, opts) for arm in td.ARMS}
    record = score({"regime": args.regime, "device": torch.cuda.get_device_name()
                    if device == "cuda" else "cpu", "settings": s, "commit": "unknown",
                    "lm_training": training, "pilot": chosen, "seeds": results,
                    "seconds": round(time.monotonic() - t0, 1)})  # fmt: skip
    print("primary:", json.dumps(record["primary"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"wrote {args.out} ({record['seconds']} s)")
    return record


if __name__ == "__main__":
    main()
