"""Measure asynchronous against synchronous PPO training on one CPU workload: the wall time per
training step and the share of the generation hidden behind the update, side by side.

    python -m lit_rlhf.measure.asynchrony [--model builtin:small-llama] [--steps N]
        [--rounds R] [--seed S] [--config PPO.yaml] [--out x.json]

Runs in the vLLM venv (``.venv-vllm``). One ``vllm serve`` process
(:class:`~lit_rlhf.rollout.server_launch.LocalServer`: float32, ``--enforce-eager``, a 64 MiB KV
cache) serves the model's folder for the whole measurement. Three arms train the same config
(``configs/ppo/countdown_tiny_server.yaml``: PPO with GRPO advantages on Countdown through
:class:`~lit_rlhf.rollout.VLLMServerEngine`) with the same seed for ``--steps`` training batches,
validation and checkpoints off:

- ``sync``: ``rollout.max_staleness: 0`` (generate, then update, then push);
- ``one_step_off``: ``max_staleness: 1`` (the next batch generates while the update runs);
- ``partial``: ``max_staleness: 1`` and ``partial_rollouts: true`` (fully asynchronous: pushes
  do not wait for the requests in flight).

Each arm is its own ``lit-rlhf fit`` process (no shared process state); the arms alternate
over ``--rounds`` rounds, the order rotating by one arm per round. Each run has the probe
:class:`~lit_rlhf.measure.step_clock.StepClock` and a CSVLogger; its ``metrics.csv`` gives per
batch:

- ``step_s``: wall seconds per training batch (the probe's ``measure/step_s``: from the end of
  the previous batch to the end of this one; ``metrics.csv`` has no timestamp of its own);
- ``generate_s``, ``update_s``, ``wait_s`` (the main thread waiting for a generation),
  ``sync_s`` (the weight push) and ``overlap``: the module's logged ``time/*`` and
  ``rollout/overlap`` where it logs them (the overlapped arms; ``one_step_off`` logs no
  ``time/sync_s``), else the probe's ``measure/*`` (the sync arm logs none of them: its
  generation is all waited for, ``wait_s`` = ``generate_s`` and ``overlap`` = 0);
- the staleness metrics (``rollout/staleness``, and with partial rollouts the per-sample
  ``rollout/staleness_mean`` / ``_max``, ``rollout/stale_token_frac``,
  ``rollout/mixed_version_frac``, ``rollout/stale_dropped``) and ``perf/tokens_per_s``.

Counted: batches ``k + 1`` to ``steps - 1`` (k = 1: the overlapped arms' first batch only fills
the queue, the second is the first update; the first batch of every arm also starts the engine
and pushes the full weights), the same batches in every arm; ``--steps`` must be >= 3.

Prints (and with ``--out`` writes) a JSON: the CPU (``/proc/cpuinfo``: model name, cores, the
``avx512_bf16`` / ``amx_bf16`` flags), the settings, per arm each run's per-batch values and the
medians over the counted batches of all rounds, the share of the generation hidden
(1 - sum of ``wait_s`` / sum of ``generate_s`` over the counted batches) and the ratio of the
median step times ``sync / arm`` (above 1: the arm is faster); then a short table.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ppo" / "countdown_tiny_server.yaml"
STALENESS = 1  # k of the overlapped arms
ARMS: dict[str, tuple[int, bool]] = {  # max_staleness, partial_rollouts
    "sync": (0, False),
    "one_step_off": (STALENESS, False),
    "partial": (STALENESS, True),
}
SERVER_ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes",
               str(64 << 20), "--max-model-len", "512"]  # fmt: skip
PARTS = ("step_s", "generate_s", "update_s", "wait_s", "sync_s", "overlap")
EXTRA = ("perf/tokens_per_s", "rollout/staleness", "rollout/staleness_mean",
         "rollout/staleness_max", "rollout/stale_token_frac", "rollout/mixed_version_frac",
         "rollout/stale_dropped")  # fmt: skip
BATCH_SIZE = 4  # prompts per batch, as in the config
DEFINITIONS = {
    "step_s": "wall s per batch: end of the previous batch to the end of this one (probe)",
    "generate_s, update_s, wait_s, sync_s, overlap": "the module's time/* and rollout/overlap "
    "where logged, else the probe's measure/*; sync arm: wait_s = generate_s, overlap = 0",
    "hidden_share": "1 - sum(wait_s) / sum(generate_s) over the counted batches of all rounds",
    "step_ratio_sync_over_arm": "median step_s of sync / of the arm (above 1: the arm is faster)",
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lit_rlhf.measure.asynchrony", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--model", default="builtin:small-llama", help="folder or builtin:")
    parser.add_argument("--steps", type=int, default=8, help="training batches per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per arm, interleaved")
    parser.add_argument("--seed", type=int, default=0, help="seed_everything of every run")
    parser.add_argument("--config", default=str(CONFIG), help="the PPO config of every arm")
    parser.add_argument("--out", help="also write the JSON here")
    opts = parser.parse_args(argv)
    if opts.steps < STALENESS + 2 or opts.rounds < 1:
        parser.error(f"--steps must be >= {STALENESS + 2} and --rounds >= 1")
    return opts


def cpu_info(path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU's model name, core counts and bf16 flags (unknown where there is no cpuinfo)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, Any] = {"model_name": "unknown", "cores": os.cpu_count(), "usable": usable}
    try:
        text = Path(path).read_text()
    except OSError:
        return info
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in text.splitlines())
        if key.strip() in ("model name", "flags")
    )
    flags = set(fields.get("flags", "").split())
    info["model_name"] = fields.get("model name", "unknown")
    info["cores"] = text.count("\nprocessor") + text.startswith("processor")
    info["avx512_bf16"] = "avx512_bf16" in flags
    info["amx_bf16"] = "amx_bf16" in flags
    return info


def fit_command(opts: argparse.Namespace, arm: str, url: str, root: Path) -> list[str]:
    """The ``lit-rlhf fit`` command line of one run of ``arm`` against the server at ``url``."""
    staleness, partial = ARMS[arm]
    examples = max(64, BATCH_SIZE * opts.steps)
    return [
        sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", opts.config,
        f"--seed_everything={opts.seed}",
        f"--model.init_args.model={opts.model}", f"--data.init_args.tokenizer={opts.model}",
        f"--model.init_args.engine.init_args.urls=[{url}]",
        f"--model.init_args.rollout.max_staleness={staleness}",
        f"--model.init_args.rollout.partial_rollouts={str(partial).lower()}",
        f"--data.init_args.batch_size={BATCH_SIZE}",
        f"--data.init_args.train.init_args.num_examples={examples}",
        "--trainer.max_epochs=1", f"--trainer.limit_train_batches={opts.steps}",
        "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={root}", "--trainer.logger.name=csv",
        "--trainer.logger.version=0",
        "--trainer.callbacks+=lit_rlhf.measure.step_clock.StepClock",
    ]  # fmt: skip


def read_batches(path: Path) -> list[dict[str, float]]:
    """Per training batch (by ``measure/batch``), every non-empty value of its rows."""
    batches: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            if not row.get("measure/batch"):
                continue
            values = {k: float(v) for k, v in row.items() if v not in ("", None)}
            batches.setdefault(int(values["measure/batch"]), {}).update(values)
    return [batches[i] for i in sorted(batches)]


def parts(values: dict[str, float], arm: str) -> dict[str, float]:
    """One batch's step, generate, update, wait, sync and overlap (see the module)."""
    out = {"step_s": values["measure/step_s"]}
    for name in ("generate_s", "update_s", "wait_s", "sync_s"):
        logged = values.get(f"time/{name}")
        out[name] = logged if logged is not None else values.get(f"measure/{name}", math.nan)
    out["overlap"] = values.get("rollout/overlap", math.nan)
    if ARMS[arm][0] == 0:  # nothing runs beside the generation: all of it is waited for
        out["wait_s"], out["overlap"] = out["generate_s"], 0.0
    for key in EXTRA:
        if key in values:
            out[key] = values[key]
    return out


def run_arm(opts: argparse.Namespace, arm: str, url: str, root: Path) -> dict[str, Any]:
    """One ``lit-rlhf fit`` run of ``arm``; its per-batch values and its wall seconds."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    proc = subprocess.run(
        fit_command(opts, arm, url, root), cwd=ROOT, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"the {arm} run exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    batches = read_batches(root / "csv" / "version_0" / "metrics.csv")
    if len(batches) != opts.steps:
        raise RuntimeError(f"the {arm} run logged {len(batches)} batches, not {opts.steps}")
    return {"process_s": wall, "batches": [parts(b, arm) for b in batches]}


def summarize(runs: list[dict[str, Any]], counted: list[int]) -> dict[str, Any]:
    """Medians over the counted batches of every run, and the share of generation hidden."""
    rows = [run["batches"][i] for run in runs for i in counted]
    keys = [k for k in (*PARTS, *EXTRA) if any(k in r for r in rows)]
    medians = {k: statistics.median(r[k] for r in rows if k in r) for k in keys}
    generated = sum(r["generate_s"] for r in rows)
    return {
        "median": medians,
        "hidden_share": 1.0 - sum(r["wait_s"] for r in rows) / max(generated, 1e-12),
    }


def run(opts: argparse.Namespace) -> dict[str, Any]:
    from lit_rlhf.models.builtin import resolve_builtin
    from lit_rlhf.rollout.server_launch import LocalServer

    folder = resolve_builtin(opts.model) if opts.model.startswith("builtin:") else opts.model
    names = list(ARMS)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in names}
    order: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="lit-rlhf-asynchrony-") as tmp:
        server = LocalServer(folder, SERVER_ARGS, log=Path(tmp) / "server.log")
        try:
            for round_ in range(opts.rounds):
                shift = round_ % len(names)
                order.append(names[shift:] + names[:shift])
                for arm in order[-1]:
                    root = Path(tmp) / f"round{round_}_{arm}"
                    runs[arm].append(run_arm(opts, arm, server.url, root))
        finally:
            server.stop()
    counted = list(range(STALENESS + 1, opts.steps))
    arms = {arm: {**summarize(runs[arm], counted), "runs": runs[arm]} for arm in names}
    sync_step = arms["sync"]["median"]["step_s"]
    for arm in names:
        arms[arm]["step_ratio_sync_over_arm"] = sync_step / arms[arm]["median"]["step_s"]
    return {
        "cpu": cpu_info(),
        "model": opts.model,
        "config": opts.config,
        "seed": opts.seed,
        "steps": opts.steps,
        "rounds": opts.rounds,
        "arm_order_per_round": order,
        "counted_batches": counted,
        "server_args": SERVER_ARGS,
        "definitions": DEFINITIONS,
        "arms": arms,
    }


def table(record: dict[str, Any]) -> str:
    """A short text table of the medians."""
    cpu = record["cpu"]
    flags = [f for f in ("avx512_bf16", "amx_bf16") if cpu.get(f)]
    lines = [
        f"CPU: {cpu['model_name']}, {cpu['cores']} cores ({cpu['usable']} usable), "
        f"bf16 flags: {', '.join(flags) or 'none'}",
        f"{record['steps']} batches x {record['rounds']} rounds per arm; counted batches "
        f"{record['counted_batches'][0]}..{record['counted_batches'][-1]}; medians in seconds",
        f"{'arm':<13}{'step':>8}{'generate':>10}{'update':>8}{'wait':>8}{'sync':>8}"
        f"{'hidden':>8}{'overlap':>8}{'sync/arm':>10}",
    ]
    for arm, result in record["arms"].items():
        m = result["median"]
        lines.append(
            f"{arm:<13}{m['step_s']:>8.3f}{m['generate_s']:>10.3f}{m['update_s']:>8.3f}"
            f"{m['wait_s']:>8.3f}{m['sync_s']:>8.3f}{result['hidden_share']:>8.2f}"
            f"{m['overlap']:>8.2f}{result['step_ratio_sync_over_arm']:>10.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    record = run(opts)
    text = json.dumps(record, indent=1)
    if opts.out:
        Path(opts.out).write_text(text + "\n")
    print(text)
    print(table(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
