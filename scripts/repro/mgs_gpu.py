"""MGS, the GPU window (issue [7/7] item 6; docs/multidomain.md, "The GPU window (`bash
scripts/gpu_paper.sh mgs`)", where the rule is registered): the measurement study of
``mgs_measure.py`` as one command of at most 8 minutes on one GPU, nothing downloaded.

The policy is trained inside the command: ``builtin:mid-llama`` (random weights) fine-tuned with
``SFTModule`` on the arithmetic questions outside the study's primary and development pools
(seen: memorised; the pools' unseen ones: guessed, so their groups differ) and on the chat
prompts' references. Chat's reward encodes with that policy (MiniLM does not travel). Then the
study's gate, its batches (until the budget is spent; the record is rewritten after each) and
its primary, unchanged.

    python scripts/repro/mgs_gpu.py                            # on the GPU
    python scripts/repro/mgs_gpu.py --regime smoke --out X     # CPU plumbing, seconds
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from repro import mgs_measure as mm  # noqa: E402
from repro.common import git_commit  # noqa: E402
from repro.runs import sft_export, window_parser  # noqa: E402

_SFT = {"model": "builtin:mid-llama", "sft_config": "configs/sft/tiny.yaml",
        "sft_steps": 600, "sft_lr": 1e-3, "sft_batch_size": 32,
        "max_length": 256, "arithmetic_copies": 4, "chat_copies": 8}  # fmt: skip
REGIMES: dict[str, dict[str, Any]] = {
    "gpu": {**mm.settings(smoke=False), **_SFT, "bf16": False, "device": "cuda",
            "accelerator": "auto"},
    "smoke": {**mm.settings(smoke=True), **_SFT, "model": "builtin:tiny-llama", "sft_steps": 1,
              "sft_batch_size": 8, "arithmetic_copies": 1, "chat_copies": 1, "device": "cpu",
              "accelerator": "cpu"},
}  # fmt: skip


def sft_rows(s: dict[str, Any], pools: dict[str, dict[str, list[dict]]]) -> list[dict[str, str]]:
    """The policy's SFT rows: every arithmetic question of the study's template (operands 1-20,
    ``+`` / ``-``) outside its primary and development pools, ``arithmetic_copies`` rows each
    with the boxed answer; every chat prompt with its reference, ``chat_copies`` rows each."""
    import random

    measured = {r["expression"] for part in pools.values() for r in part["arithmetic"]}
    rows = [
        {"prompt": mm.TEMPLATE.format(expression=e), "response": f"\\boxed{{{v}}}"}
        for a in range(1, 21)
        for b in range(1, 21)
        for op, v in (("+", a + b), ("-", a - b))
        for e in [f"{a} {op} {b}"]
        if e not in measured
    ] * s["arithmetic_copies"]
    chat = mm.source_rows(mm.CHAT, s["model"])
    rows += [{"prompt": r["question"], "response": r["reference"]} for r in chat] * s["chat_copies"]
    random.Random("mgs-gpu-sft").shuffle(rows)
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    work, out = ROOT / "runs" / "mgs_gpu", ROOT / "docs" / "multidomain_gpu.json"
    opts = window_parser(__doc__ or "", list(REGIMES), work, out).parse_args(argv)
    from lit_rlhf.models.loading import load_causal_lm, load_tokenizer

    s = dict(REGIMES[opts.regime])
    t0 = time.monotonic()
    record: dict[str, Any] = {"experiment": "mgs GPU window (docs/multidomain.md)",
                              "regime": opts.regime, "commit": git_commit()}  # fmt: skip

    def save() -> None:
        record["seconds"] = round(time.monotonic() - t0, 1)
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")

    data = mm.pools(s, s["model"])
    rows = sft_rows(s, data)
    policy_dir, sft_s = sft_export(
        rows,
        opts.work / opts.regime,
        s,
        in_process=True,
        export_name="sft-policy",
        data_name="sft-rows",
    )
    s["embedder"] = str(policy_dir)  # chat's encoder: the policy itself
    record.update(settings=s, sft={"rows": len(rows), "seconds": round(sft_s, 1)})
    measurer = mm.Measurer(s, load_causal_lm(str(policy_dir)).to(s["device"]),
                           load_tokenizer(str(policy_dir)))  # fmt: skip
    gate = measurer.gate(data["dev"], 17)
    record["gate"], record["batches"] = gate, []
    save()
    last = 0.0
    for b in range(s["batches"] if gate["passes"] else 0):
        if time.monotonic() - t0 + last > opts.budget_s:
            break
        record["batches"].append(measurer.batch(mm.batch_rows(s, data["primary"], 0, b), b))
        last = record["batches"][-1]["seconds"]
        record["primary"] = mm.primary(record["batches"])
        save()
    if not gate["passes"]:
        record["verdict"] = f"not testable in the window: the gate fails on {gate['short']}"
    else:
        record["verdict"] = record["primary"]["verdict"] if record["batches"] else "no batch ran"
        record["secondary"] = mm.secondary(record["batches"])
    save()
    print(json.dumps({k: record.get(k) for k in ("verdict", "seconds")}, indent=1))
    return record


if __name__ == "__main__":
    main()
