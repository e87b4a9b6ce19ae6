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

Departures from the paper: the ``cpu`` preset judges synthetic copy pairs with a one-word
verdict (SmolLM2-135M writes no usable critiques), so it has no critique reward, and trains
for 60 steps; the paper trains Qwen3-8B on HelpSteer3 with critiques. ConsistRM's arm uses the
base config's ``VerdictReward`` in ``format`` mode (same scores, no gold label). ReflectRM's
arms on the ``cpu`` preset compare verdict-only judgments, so the "analyses" that reflection
compares are the verdict sentences themselves; the ``gpu`` preset runs them on the base config's
model (Qwen3-8B; the paper's is Qwen3-4B, ``configs/grm/reflectrm_qwen3-4b.yaml``) with the
ReflectRM format (Analysis, Result).
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
    "template": "reflectrm-v1",
    "tags": ["Analysis", "Result"],
    "prefix": "",
    "suffix": "",
    "build": ["--model", "Qwen/Qwen3-8B", "--pairs", "nvidia/HelpSteer3", "--schema",
              "helpsteer3", "--engine", "vllm", "--dtype", "bfloat16", "--max-new-tokens", "1024"],
    "max_steps": None,  # the records' epochs (the paper: 3)
}  # fmt: skip
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {"config": Path("configs/grm/rft_smollm2.yaml"), "steps": None, "critique": False,
            "reflectrm": _CPU_REFLECTRM},
    "gpu": {"config": Path("configs/grm/rft_qwen3-8b.yaml"), "steps": None, "critique": True,
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
        callbacks = [
            *callbacks,
            {"class_path": "lit_rlhf.callbacks.ConsistencyAnswerReward", "init_args": answer},
        ]
        if PRESETS[opts.preset]["critique"]:
            callbacks.append({"class_path": "lit_rlhf.callbacks.CritiqueConsistencyReward"})
    fragment = run_fragment(out, arm, seed, callbacks, seed_model=True)
    modes = {"consistrm": "consistrm", "unified": "reflectrm", "reflectrm": "reflectrm"}
    fragment["model"]["init_args"]["mode"] = modes.get(arm, "rft")
    if reward is not None:
        fragment["model"]["init_args"]["reward"] = reward
    if arm in ("unified", "reflectrm"):
        _reflectrm_format(fragment, config, PRESETS[opts.preset]["reflectrm"], records_path(out))
    if arm in ("base-reflective", "reflectrm"):
        fragment["model"]["init_args"].update(
            eval_samples=REFLECTIVE_SAMPLES, inference="reflective"
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


def arm_command(arm: str, base: Path, fragment: Path, out: Path, seed: int) -> list[str]:
    """The CLI run of one arm: ``validate`` for the untrained judge and for full ReflectRM (the
    unified run's last checkpoint), ``fit`` otherwise."""
    if arm in ("base", "base-reflective"):
        return cli_command("validate", [base, fragment])
    if arm == "reflectrm":
        found = sorted((out / "unified" / f"seed{seed}" / "checkpoints").glob("*.ckpt"))
        ckpt = str(found[-1]) if found else f"<the unified seed{seed} run's checkpoint>"
        return [*cli_command("validate", [base, fragment]), "--ckpt_path", ckpt]
    return cli_command("fit", [base, fragment])


def run_all(opts: argparse.Namespace) -> dict[str, list[Path]]:
    base: Path = opts.config or PRESETS[opts.preset]["config"]
    arms = opts.arms or list(STUDIES[opts.study])
    csvs: dict[str, list[Path]] = {arm: [] for arm in arms}
    if {"unified", "reflectrm"} & set(arms) and not records_path(opts.out).exists():
        command = build_records_command(opts)
        print(f"records: {' '.join(command)}", flush=True)
        if not opts.dry_run:
            print(f"  {run_timed(command):.0f} s", flush=True)
    for arm in arms:
        for seed in opts.seeds:
            fragment = write_fragment(
                opts.out / f"{arm}-seed{seed}.yaml", arm_fragment(arm, base, opts.out, seed, opts)
            )
            command = arm_command(arm, base, fragment, opts.out, seed)
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
