"""``python -m scripts.bench NAME [--smoke] [--json PATH] [--threads N] [options]``: run one
benchmark of ``scripts/bench/`` from the repository root (``python -m scripts.bench`` lists them;
``python -m scripts.bench NAME --help`` shows a benchmark's options). ``--smoke`` runs it at tiny
sizes with one repeat: a check that it runs, in seconds, not a measurement."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

NAMES = {
    "peer_trl": "lit-rlhf vs TRL's GRPOTrainer on one GRPO workload (.venv-vllm; make benchmark)",
    "exploration": "cost of the entropy bonus, TRE-K and TRE-P (step time, entropy memory)",
    "mgs": "modular gradient surgery vs mixed RL (step, update phase, peak memory)",
    "grm": "where a ConsistRM judge-training step's time goes",
    "compressor": "Lightning's overhead on the compressor step vs a bare PyTorch loop",
    "packing": "the PPO update padded vs packed (micro_batch_tokens)",
    "overlap": "on-policy vs one-step-off training (max_staleness: 1)",
    "lora_memory": "peak memory of PPO updates, LoRA vs full fine-tuning",
    "precision": "the demo's wall time per precision, native and emulated no-bf16 CPU",
    "cli_startup": "lit-rlhf --help and a refused config against import lightning",
}


def parse(name: str, module: Any, argv: list[str]) -> argparse.Namespace:
    """The common options, the module's own, and ``--smoke``'s defaults (explicit flags win)."""
    doc = (module.__doc__ or name).split("\n\n")
    parser = argparse.ArgumentParser(
        prog=f"python -m scripts.bench {name}", description=doc[0],
        epilog="\n\n".join(doc[1:]), formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat (seconds)")
    parser.add_argument("--json", help="write the results and the machine description here")
    parser.add_argument("--threads", type=int, default=2, help="torch's intra-op threads")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    module.add_args(parser)
    if "--smoke" in argv:
        parser.set_defaults(**module.SMOKE)
    opts = parser.parse_args(argv)
    opts.argv = argv
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in NAMES:
        print(__doc__ + "\n\n" + "\n".join(f"  {k:12s} {v}" for k, v in NAMES.items()))
        return 0 if not argv else 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch

    from scripts.bench.machine import Machine
    from scripts.bench.runner import Report

    module = importlib.import_module(f"scripts.bench.{argv[0]}")
    opts = parse(argv[0], module, argv[1:])
    torch.set_num_threads(opts.threads)
    if opts.child is not None:  # one measurement in a fresh process: its result as JSON
        print("\n" + json.dumps(module.child(opts)))
        return 0
    machine = Machine(opts.smoke)
    report = Report(machine.info)
    report.say(machine.header(), "")
    module.run(opts, report)
    machine.close()
    report.say("", *machine.footer())
    if opts.json:
        options = {k: v for k, v in vars(opts).items() if k not in ("argv", "child")}
        record = {"benchmark": argv[0], "options": options, "machine": machine.info,
                  "results": report.data, "table": report.lines}  # fmt: skip
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1, default=str)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
