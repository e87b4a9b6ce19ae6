"""Base judge vs RFT vs ConsistRM (``--study consistrm``, arXiv 2604.07484) or vs ReflectRM
(``--study reflectrm``, arXiv 2604.07506) on one task, with one command, at the scale this
machine allows.

Each (arm, seed) is one ``python -m lit_rlhf.cli`` run of the base config plus a fragment:
``base`` validates the starting judge, ``rft`` trains against gold labels, ``consistrm`` trains
without labels (format reward + ``ConsistencyAnswerReward``; the critique bonus is added only
when the judge writes critiques, i.e. with a template that has them). Held-out: the config's
``val`` pairs, in both orders. Writes ``<out>/results.md`` (mean ± std over seeds of the last
validation) and ``<out>/curves.png`` (held-out accuracy, positional consistency, train reward).

ReflectRM's arms: ``base-reflective`` validates the starting judge with two-stage reflective
inference (``eval_samples: 8``); ``unified`` trains one judge on ReflectRM's mixed records
(``mode: reflectrm``; the records are built first from the base judge by
``scripts/build_reflectrm_data.py``, once, into ``<out>/reflectrm-records.jsonl``) and validates
it with one greedy judgment, like ``base`` and ``rft``; ``reflectrm`` (full ReflectRM) validates
the ``unified`` run's final checkpoint with reflective inference.

    python scripts/compare_grm.py --preset cpu              # SmolLM2-135M, copy pairs, ~20 min
    python scripts/compare_grm.py --preset cpu --seeds 0 1 --arms rft --steps 30
    python scripts/compare_grm.py --preset cpu --study reflectrm --seeds 0 1
    python scripts/compare_grm.py --preset gpu --seeds 0 1 2   # Qwen3-8B on HelpSteer3
    python scripts/compare_grm.py --preset gpu --study reflectrm   # Qwen3-4B, ReflectRM's recipe

The ``gpu`` preset is the authors' recipes (docs/recipes.md), each run composed with the
DeepSpeed ZeRO-3 fragment its preset's header names: ConsistRM's study starts from
``configs/grm/rft_qwen3-8b.yaml`` (the ConsistRM arm then equals
``configs/grm/consistrm_qwen3-8b.yaml``: the label-free reward, the memory seeded from 8 votes
of the starting judge by ``scripts/seed_consistrm_memory.py`` into ``<out>/consistrm-memory.jsonl``
first, and the critique bonus on Qwen3-Embedding-4B with last-token pooling, L2-normalised,
1,024 tokens); ReflectRM's study starts from ``configs/grm/reflectrm_qwen3-4b.yaml`` (Qwen3-4B,
the records built with Qwen3-4B, ``/no_think``), its ``base`` / ``rft`` arms on HelpSteer3 pairs in
the ReflectRM format.

Departures from the paper on the ``cpu`` preset: it judges synthetic copy pairs with a one-word
verdict (SmolLM2-135M writes no usable critiques), so it has no critique reward and no memory
seed, and trains for 60 steps; ReflectRM's arms there compare verdict-only judgments, so the
"analyses" that reflection compares are the verdict sentences themselves. ConsistRM's arm uses
the base config's ``VerdictReward`` in ``format`` mode (same scores, no gold label).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _runs import (
    base_callbacks,
    cli_command,
    mean_spread,
    plot_arms,
    read_rows,
    run_fragment,
    run_timed,
    series,
    write_fragment,
)

# the ReflectRM format per preset: judge template, tags, pre-fill and suffix ({subject}: Response
# or Critique per row), and the arguments of scripts/build_reflectrm_data.py for its records
_CPU_REFLECTRM = {
    "template": "verdict-short-v1",
    "tags": ["Result"],
    "prefix": " <Result>{subject} 1 is",
    "suffix": " than {subject} 2</Result>",
    "build": ["--model", "builtin:smollm2-135m-instruct", "--synthetic", "200", "--task-kind",
              "copy", "--no-chat-template", "--max-new-tokens", "1"],
    "max_steps": 60,  # the rft arm's budget (its 240 pairs x 2 orders / 8 per step)
}  # fmt: skip
_GPU_REFLECTRM = {
    "config": Path("configs/grm/reflectrm_qwen3-4b.yaml"),  # the study's base config
    "template": "reflectrm-v1",
    "tags": ["Analysis", "Result"],
    "prefix": "",
    "suffix": "",
    "build": ["--model", "Qwen/Qwen3-4B", "--pairs", "nvidia/HelpSteer3", "--schema",
              "helpsteer3", "--engine", "vllm", "--dtype", "bfloat16", "--max-new-tokens", "1024",
              "--question-suffix", " /no_think"],
    # what base / rft train on: the pairs themselves, in the ReflectRM format
    # (id_field null: the base config's records set one, and a fragment merges into them)
    "pairs": {"path": "nvidia/HelpSteer3", "schema": "helpsteer3", "split": "train",
              "id_field": None},
    "max_steps": None,  # the records' epochs (the paper: 3)
}  # fmt: skip
# ConsistRM's critique embedder on the gpu preset: the authors' (docs/recipes.md)
_GPU_CRITIQUE = {
    "embedder": "Qwen/Qwen3-Embedding-4B", "pooling": "last", "normalize": True,
    "max_length": 1024, "dtype": "float16", "text": "response", "bonus": 0.1,
}  # fmt: skip
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"config": Path("configs/grm/rft_smollm2.yaml"), "trainer": None, "steps": None,
            "critique": None, "seed_memory": None, "reflectrm": _CPU_REFLECTRM},
    "gpu": {"config": Path("configs/grm/rft_qwen3-8b.yaml"),
            "trainer": Path("configs/trainer/deepspeed_zero3.yaml"), "steps": None,
            "critique": _GPU_CRITIQUE, "seed_memory": ["--engine", "vllm", "--dtype", "bfloat16"],
            "reflectrm": _GPU_REFLECTRM},
}  # fmt: skip
STUDIES = {
    "consistrm": ("base", "rft", "consistrm"),
    "reflectrm": ("base", "base-reflective", "rft", "unified", "reflectrm"),
}
ARMS = ("base", "base-reflective", "rft", "consistrm", "unified", "reflectrm")
REFLECTIVE_SAMPLES = 8  # the paper's N
METRICS = ("val/accuracy", "val/positional_consistency", "val/format_valid")


def arm_fragment(arm: str, base: Path, out: Path, seed: int, opts: argparse.Namespace) -> dict:
    """The fragment of one (arm, seed) run on top of the base config."""
    import yaml

    config = yaml.safe_load(base.read_text()) or {}
    model = config["model"]["init_args"]
    callbacks = base_callbacks(base)
    reward = None
    if arm == "consistrm":
        answer = {
            "tags": model.get("tags", ["Criterion", "Analysis", "Result"]),
            "prefix": model.get("response_prefix", ""),
            "suffix": model.get("response_suffix", ""),
        }
        if isinstance(model.get("reward"), dict):  # the base's VerdictReward, label-free
            reward = {**model["reward"]}
            reward["init_args"] = {**reward.get("init_args", {}), "mode": "format"}
        if PRESETS[opts.preset]["seed_memory"]:
            answer["initial_memory"] = str(memory_path(out))
        callbacks = [
            *callbacks,
            {"class_path": "lit_rlhf.callbacks.ConsistencyAnswerReward", "init_args": answer},
        ]
        critique = PRESETS[opts.preset]["critique"]
        if critique:
            callbacks.append(
                {"class_path": "lit_rlhf.callbacks.CritiqueConsistencyReward",
                 "init_args": dict(critique)}
            )  # fmt: skip
    fragment = run_fragment(out, arm, seed, callbacks, seed_model=True)
    modes = {"consistrm": "consistrm", "unified": "reflectrm", "reflectrm": "reflectrm"}
    fragment["model"]["init_args"]["mode"] = modes.get(arm, "rft")
    if reward is not None:
        fragment["model"]["init_args"]["reward"] = reward
    fmt = PRESETS[opts.preset]["reflectrm"]
    if arm in ("unified", "reflectrm"):
        _reflectrm_format(fragment, config, fmt, records_path(out))
    elif opts.study == "reflectrm" and "pairs" in fmt:  # base / rft on the pairs, same format
        train = {**fmt["pairs"], "template": fmt["template"]}
        fragment["data"]["init_args"]["train"] = {
            "class_path": "lit_rlhf.data.PreferencePairs", "init_args": train
        }  # fmt: skip
    reflective = arm in ("base-reflective", "reflectrm")
    fragment["model"]["init_args"].update(
        eval_samples=REFLECTIVE_SAMPLES if reflective else 1,
        inference="reflective" if reflective else "single",
    )
    steps = opts.steps or PRESETS[opts.preset]["steps"]
    if steps:
        fragment["trainer"]["limit_train_batches"] = steps
    return fragment


def _reflectrm_format(
    fragment: dict, config: dict, fmt: dict[str, Any], records: Path
) -> None:  # fmt: skip
    """Unified training's data and judge format: ReflectRM's mixed records in both orders, the
    preset's template and tags, ``{subject}`` in the pre-fill and suffix."""
    model = config["model"]["init_args"]
    fragment["model"]["init_args"].update(
        tags=list(fmt["tags"]), response_prefix=fmt["prefix"], response_suffix=fmt["suffix"]
    )
    if isinstance(model.get("reward"), dict):  # the base's VerdictReward, in the new format
        reward = {**model["reward"]}
        reward["init_args"] = {**reward.get("init_args", {}), "tags": list(fmt["tags"]),
                               "prefix": fmt["prefix"], "suffix": fmt["suffix"]}  # fmt: skip
        fragment["model"]["init_args"]["reward"] = reward
    train = {"path": str(records), "schema": "pairs", "template": fmt["template"],
             "swap": "both", "id_field": "id"}  # fmt: skip
    if fmt["max_steps"]:  # as many steps as the rft arm, over as many epochs as that takes
        fragment["trainer"].update(max_steps=fmt["max_steps"], max_epochs=-1)
    fragment["data"]["init_args"].update(
        response_prefix=fmt["prefix"],
        train={"class_path": "lit_rlhf.data.PreferencePairs", "init_args": train},
        val={"init_args": {"template": fmt["template"]}},
    )


def records_path(out: Path) -> Path:
    return out / "reflectrm-records.jsonl"


def memory_path(out: Path) -> Path:
    return out / "consistrm-memory.jsonl"


def study_config(opts: argparse.Namespace) -> Path:
    """The base config of the study: ``--config``, else ReflectRM's own preset for its study on
    the gpu preset, else the preset's."""
    preset = PRESETS[opts.preset]
    if opts.config:
        return Path(opts.config)
    if opts.study == "reflectrm" and "config" in preset["reflectrm"]:
        return Path(preset["reflectrm"]["config"])
    return Path(preset["config"])


def seed_memory_command(opts: argparse.Namespace, base: Path) -> list[str]:
    """scripts/seed_consistrm_memory.py for the preset: 8 votes per training query, seed 0."""
    script = Path(__file__).parent / "seed_consistrm_memory.py"
    return [
        sys.executable, str(script), "--config", str(base), "--out", str(memory_path(opts.out)),
        "--samples", str(REFLECTIVE_SAMPLES), "--seed", "0", *PRESETS[opts.preset]["seed_memory"],
    ]  # fmt: skip


def build_records_command(opts: argparse.Namespace) -> list[str]:
    """scripts/build_reflectrm_data.py for the preset: N = 8 judgments per pair, seed 0."""
    fmt = PRESETS[opts.preset]["reflectrm"]
    script = Path(__file__).parent / "build_reflectrm_data.py"
    return [
        sys.executable, str(script), *fmt["build"], "--template", fmt["template"],
        "--tags", *fmt["tags"], "--response-prefix", fmt["prefix"],
        "--response-suffix", fmt["suffix"], "--samples", str(REFLECTIVE_SAMPLES), "--seed", "0",
        "--out", str(records_path(opts.out)),
    ]  # fmt: skip


def arm_command(
    arm: str, configs: list[Path], out: Path, seed: int
) -> list[str]:  # fmt: skip
    """The CLI run of one arm over ``configs`` (base, the preset's trainer fragment if any, the
    arm's fragment): ``validate`` for the untrained judge and for full ReflectRM (the unified
    run's last checkpoint), ``fit`` otherwise."""
    if arm in ("base", "base-reflective"):
        return cli_command("validate", configs)
    if arm == "reflectrm":
        found = sorted((out / "unified" / f"seed{seed}" / "checkpoints").glob("*.ckpt"))
        ckpt = str(found[-1]) if found else f"<the unified seed{seed} run's checkpoint>"
        return [*cli_command("validate", configs), "--ckpt_path", ckpt]
    return cli_command("fit", configs)


def run_all(opts: argparse.Namespace) -> dict[str, list[Path]]:
    base = study_config(opts)
    trainer = PRESETS[opts.preset]["trainer"]
    arms = opts.arms or list(STUDIES[opts.study])
    csvs: dict[str, list[Path]] = {arm: [] for arm in arms}
    first: list[tuple[str, list[str], Path]] = [
        ("records", build_records_command(opts), records_path(opts.out))
    ] if {"unified", "reflectrm"} & set(arms) else []  # fmt: skip
    if "consistrm" in arms and PRESETS[opts.preset]["seed_memory"]:
        first.append(("memory", seed_memory_command(opts, base), memory_path(opts.out)))
    for name, command, made in first:
        if made.exists():
            continue
        print(f"{name}: {' '.join(command)}", flush=True)
        if not opts.dry_run:
            print(f"  {run_timed(command):.0f} s", flush=True)
    for arm in arms:
        for seed in opts.seeds:
            fragment = write_fragment(
                opts.out / f"{arm}-seed{seed}.yaml", arm_fragment(arm, base, opts.out, seed, opts)
            )
            configs = [base, *([trainer] if trainer else []), fragment]
            command = arm_command(arm, configs, opts.out, seed)
            print(f"{arm} seed {seed}: {' '.join(command)}", flush=True)
            if not opts.dry_run:
                seconds = run_timed(command)
                print(f"  {seconds:.0f} s", flush=True)
            csvs[arm].append(opts.out / arm / f"seed{seed}" / "metrics.csv")
    return csvs


def summarise(csvs: dict[str, list[Path]]) -> str:
    lines = [
        "| judge | " + " | ".join(m.removeprefix("val/") for m in METRICS) + " |",
        "|---|" + "---|" * len(METRICS),
    ]
    for arm, paths in csvs.items():
        cells = []
        for metric in METRICS:
            cells.append(
                mean_spread([series(read_rows(p), metric)[-1] for p in paths if p.exists()])
            )
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(csvs: dict[str, list[Path]], path: Path) -> None:
    keys = ("val/accuracy", "val/positional_consistency", "reward/mean")
    plot_arms(csvs, keys, path, step_key="step", xlabel="optimizer step", markers=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu")
    parser.add_argument("--config", type=Path, help="override the preset's base config")
    parser.add_argument("--study", choices=list(STUDIES), default="consistrm")
    parser.add_argument("--arms", nargs="+", choices=ARMS, help="default: the study's arms")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, help="training steps per run (default: preset's)")
    parser.add_argument("--out", type=Path, default=Path("runs/compare_grm"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    opts = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    csvs = run_all(opts)
    if opts.dry_run:
        return
    table = summarise(csvs)
    (opts.out / "results.md").write_text(table + "\n")
    plot(csvs, opts.out / "curves.png")
    print(table)


if __name__ == "__main__":
    main()
