"""ConsistRM (arXiv 2604.07484) at CPU scale: does label-free self-training of a warm judge on
its own temporally consistent pseudo-labels improve it, and does the memory matter?

The judge writes a short checkable analysis, then its verdict, on arithmetic pairs
(:mod:`repro.judge_common`). It is first warm-started by supervised fine-tuning on a small
labelled pool (our deviation: SmolLM2-135M starts at chance and always says the same thing, so
its own votes carry no signal). Arms, from the same warm judge: ``warm`` (no training), ``rft``
(GRPO against gold labels), ``consistrm`` (label-free: format reward + the consistency answer
reward, memory seeded from 8 votes of the warm judge per query) and ``consistrm-nomem`` (the
paper's "w/o memory": this round's vote alone). Each query of the unlabelled pool is revisited
``epochs`` times. The mechanism figure: pseudo-label accuracy against gold over training
(gold labels are read for this diagnostic only, never for the reward).

Pre-check (on the unlabelled pool): the warm judge's greedy, majority-of-8 and seeded
pseudo-label accuracy; go only if the majority beats greedy (else its own votes cannot teach
it). It also measures the step time that sizes the preset.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from repro import judge_common as jc
from repro.common import Context, Figures, Paper, Preset, Primary
from repro.intervals import Kind, bounded, judge_rows
from repro.judge_records import row_outputs
from repro.runs import read_rows, steps_and_values, write_fragment

ANSWER = "lit_rlhf.callbacks.ConsistencyAnswerReward"
RECORDS = "lit_rlhf.callbacks.JudgmentRecords"


def _settings(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "builtin:smollm2-135m-instruct", "sft_config": "configs/sft/smollm2.yaml",
        "in_process": False, "max_value": 20,
        "pools": {"warm": 48, "unlabelled": 48, "eval": 48},
        "sft_steps": 96, "sft_lr": 1e-4, "sft_batch_size": 8, "reflection_every": 2,
        "samples": 8, "max_new_tokens": 64, "eval_batch_size": 16,
        "samples_per_prompt": 4, "batch_size": 8, "val_batch_size": 32, "micro_batch_size": 16,
        "lr": 2e-6, "kl_coef": 0.05, "epochs": 4, "probe_steps": 3, "full_judgments": True,
    }  # fmt: skip
    return {**base, **over}


GPU_SETTINGS = {
    "configs": {"rft": "configs/grm/rft_qwen3-8b.yaml",
                "consistrm": "configs/grm/consistrm_qwen3-8b.yaml"},
    "trainer": "configs/trainer/deepspeed_zero3.yaml",
    "seed_memory": ["--engine", "vllm", "--dtype", "bfloat16", "--samples", "8"],
}  # fmt: skip


PRESETS: dict[str, Preset] = {
    "cpu": Preset("cpu", (0, 1, 2), 120, _settings()),
    # a warm judge whose mistakes vary between samples (repro.judge_varied; rule registered in
    # docs/grm.md before its first run): one-digit operands, one lazy first-position judgment
    # in three, the checked ones in four wordings; GRPO at 5x the cpu preset's lr (that
    # preset's 48 steps at 2e-6 moved greedy accuracy by 0.01); the registered gate below
    "cpu-varied": Preset("cpu-varied", (0, 1, 2), 180, _settings(
        max_value=9, judge_style="varied", lazy_copies=2, reflection_every=0, sft_steps=144,
        lr=1e-5, gate={"majority_over_greedy": 0.05, "pseudo_over_sample": 0.05}),
        forcible=False, verdict_seeds=3, control=("rft", "warm")),
    # the GPU window (bash scripts/gpu_paper.sh consistrm; docs/grm.md): cpu-varied's design on
    # a judge trained from random weights inside the command (mid-llama: it first learns every
    # question's arithmetic, fact_copies rows each, beside the varied judgments), same gate
    "gpu-window": Preset("gpu-window", (0, 1, 2), 7, _settings(
        model="builtin:mid-llama", sft_config="configs/sft/tiny.yaml", in_process=True,
        accelerator="auto", max_value=9, judge_style="varied", lazy_copies=2, fact_copies=4,
        reflection_every=0, sft_steps=1500, sft_lr=1e-3, sft_batch_size=64, max_length=512,
        max_new_tokens=136, eval_batch_size=96, val_batch_size=96, micro_batch_size=32,
        lr=5e-5, probe_steps=1, gate={"majority_over_greedy": 0.05, "pseudo_over_sample": 0.05}),
        forcible=False, verdict_seeds=3, control=("rft", "warm")),
    "gpu": Preset("gpu", (0, 1, 2), 60 * 24 * 3, GPU_SETTINGS),
    "smoke": Preset("smoke", (0, 1), 1, _settings(
        model="builtin:tiny-llama", sft_config="configs/sft/tiny.yaml", in_process=True,
        pools={"warm": 4, "unlabelled": 2, "eval": 2}, sft_steps=1, sft_lr=1e-3,
        samples=2, max_new_tokens=6, full_judgments=False, samples_per_prompt=2, batch_size=4,
        val_batch_size=4, micro_batch_size=8, lr=1e-4, epochs=1, probe_steps=1)),
}  # fmt: skip


class ConsistRM(Paper):
    name = "consistrm"
    title = "ConsistRM: label-free self-training of a warm judge (arXiv 2604.07484)"
    doc = "docs/grm.md"
    arms = ("warm", "rft", "consistrm", "consistrm-nomem")
    primary = Primary("accuracy", "consistrm", "warm", +1)
    presets = PRESETS
    # per-row outcomes on the fixed held-out rows when every arm and seed has them (the warm
    # arm's from the pre-check, the trained arms' from their last validation's JudgmentRecords;
    # runs cached before 2026-12-05 have none), else a bounded rate
    metric_kinds: ClassVar[dict[str, Kind]] = {
        "accuracy": judge_rows("rows"),
        "positional_consistency": bounded(0.0, 1.0),
        "pseudo_label_accuracy": bounded(0.0, 1.0),
    }
    # gold labels: no pseudo-labels (its NaN is "not measured", not a collapsed judge)
    not_measured: ClassVar[dict[str, tuple[str, ...]]] = {"rft": ("pseudo_label_accuracy",)}
    table_metrics = ("accuracy", "positional_consistency", "pseudo_label_accuracy")
    curve_keys = ("accuracy", "positional_consistency", "pseudo_label_accuracy")

    # ------------------------------------------------------------------ pre-check
    def precheck(self, ctx: Context) -> Figures:
        if ctx.preset.name == "gpu":
            return {"go": True, "reason": "the authors' recipe: Qwen3-8B starts above chance"}
        s = ctx.settings
        warm, sft_seconds = self._warm(ctx)
        pool = self._judged(ctx, "unlabelled", seed=0)
        figures: Figures = {f"pool_{k}": v for k, v in jc.inference_figures(pool).items()}
        held_rows = self._judged(ctx, "eval", seed=0)
        held = jc.inference_figures(held_rows)
        figures.update({f"warm_{k}": v for k, v in held.items()})
        figures["warm_rows"] = row_outputs(held_rows, "greedy")  # the warm arm's per-row record
        online, _ = jc.predict_pool(
            str(warm), self._pool_path(ctx, "unlabelled"), samples=s["samples_per_prompt"],
            seed=1, max_new_tokens=s["max_new_tokens"], batch_size=s["eval_batch_size"],
            reflective=False, accelerator=s.get("accelerator", "cpu"),
        )  # fmt: skip
        by_query = {p["query_id"]: p["votes"] for p in online}
        figures.update(jc.seeded_pseudo_accuracy(
            [j.votes for j in pool], [by_query[j.query_id] for j in pool],
            [j.label for j in pool]))  # fmt: skip
        figures.update(self._step_time(ctx), sft_seconds=sft_seconds)
        figures["go"] = gate_passes(figures, s.get("gate"))
        figures["reason"] = (
            f"on the unlabelled pool majority-of-{s['samples']} "
            f"{figures['pool_majority_accuracy']:.3f} vs greedy "
            f"{figures['pool_greedy_accuracy']:.3f}, seeded pseudo-labels "
            f"{figures['pseudo_label_accuracy']:.3f} vs a random sample "
            f"{figures['pool_random_sample_accuracy']:.3f}; estimated preset "
            f"{figures['estimated_preset_minutes']:.0f} min"
        )
        return figures

    def _warm(self, ctx: Context) -> tuple[Path, float]:
        pools = jc.make_pools(ctx.settings["pools"], seed=0, max_value=ctx.settings["max_value"])
        for name, pairs in pools.items():
            jc.write_pairs(pairs, self._pool_path(ctx, name))
        return jc.warm_start(ctx.out, pools["warm"], ctx.settings, log=ctx.log)

    def _pool_path(self, ctx: Context, name: str) -> Path:
        return ctx.out / "pools" / f"{name}.jsonl"

    def _judged(self, ctx: Context, pool: str, *, seed: int) -> list[jc.Judged]:
        s = ctx.settings
        return jc.judge_pool_cached(
            ctx.out / "judged" / f"{pool}-seed{seed}.json", jc.warm_judge(ctx.out, ctx.settings),
            self._pool_path(ctx, pool), samples=s["samples"],
            seed=seed, max_new_tokens=s["max_new_tokens"], batch_size=s["eval_batch_size"],
            accelerator=s.get("accelerator", "cpu"),
        )  # fmt: skip

    def _memory(self, ctx: Context) -> Path:
        """The memory seed: 8 votes of the warm judge per unlabelled query (seed 0)."""
        path = ctx.out / "consistrm-memory.jsonl"
        if not path.exists():
            pool = self._judged(ctx, "unlabelled", seed=0)
            rows = [{"query_id": j.query_id, "labels": [v for v in j.votes if v is not None]}
                    for j in pool]  # fmt: skip
            jc.write_jsonl(rows, path)
        return path

    def _step_time(self, ctx: Context) -> Figures:
        """Seconds per GRPO step of the consistrm arm (``probe_steps`` steps, start-up
        included, so an upper bound) and the preset's wall time estimated from it."""
        s = ctx.settings
        probe = {**s, "epochs": 1, "limit_train_batches": s["probe_steps"]}
        seconds = self._fit(ctx, "consistrm", 0, ctx.out / "probe", probe, validate=False)
        step = seconds / s["probe_steps"]
        rows = 2 * s["pools"]["unlabelled"]
        steps = s["epochs"] * -(-rows // s["batch_size"])
        trained = (len(self.arms) - 1) * len(ctx.preset.seeds)
        return {"step_seconds": step, "steps_per_run": steps,
                "estimated_preset_minutes": trained * steps * step * 1.15 / 60}  # fmt: skip

    # ------------------------------------------------------------------ arms
    def run_arm(self, ctx: Context, arm: str, seed: int) -> Figures:
        if ctx.preset.name == "gpu":
            raise SystemExit("the gpu preset runs the authors' recipe: see docs/grm.md")
        pre = _precheck_figures(ctx)
        start = [[0.0, pre["warm_greedy_accuracy"]]], [[0.0, pre["warm_greedy_consistency"]]]
        if arm == "warm":
            curves = {"accuracy": start[0], "positional_consistency": start[1]}
            return {"accuracy": pre["warm_greedy_accuracy"],
                    "positional_consistency": pre["warm_greedy_consistency"],
                    "pseudo_label_accuracy": pre["pseudo_label_accuracy"],
                    "rows": pre.get("warm_rows", []), "curves": curves}  # fmt: skip
        run_dir = ctx.run_dir(arm, seed)
        self._fit(ctx, arm, seed, run_dir, ctx.settings, validate=True)
        figures = arm_figures(read_rows(run_dir / "metrics.csv"), start)
        figures["rows"] = last_judgments(run_dir / "judgments")
        return figures

    def _fit(self, ctx: Context, arm: str, seed: int, run_dir: Path, settings: dict[str, Any],
             *, validate: bool) -> float:  # fmt: skip
        callbacks: list[dict[str, Any]] = []
        if arm.startswith("consistrm"):
            init: dict[str, Any] = {"tags": list(jc.TAGS), "seed": seed}
            if arm == "consistrm":
                init["initial_memory"] = str(self._memory(ctx))
            else:
                init["use_memory"] = False
            callbacks.append({"class_path": ANSWER, "init_args": init})
        config = grpo_config(
            model=jc.warm_judge(ctx.out, ctx.settings), mode="rft" if arm == "rft" else "consistrm",
            train=self._pool_path(ctx, "unlabelled"), val=self._pool_path(ctx, "eval"),
            run_dir=run_dir, seed=seed, settings=settings, callbacks=callbacks,
        )  # fmt: skip
        if validate:  # each validation's per-row judgments (the trained arms' row records)
            config["trainer"]["callbacks"].append({"class_path": RECORDS, "init_args": {
                "dirpath": str(run_dir / "judgments")}})  # fmt: skip
        else:
            config["trainer"]["limit_val_batches"] = 0
        path = write_fragment(run_dir / "config.yaml", config)
        return jc.run_fit([path], in_process=settings["in_process"])


def gate_passes(figures: Figures, gate: dict[str, float] | None) -> bool:
    """The pre-check's go. Without a registered ``gate`` (the cpu preset): the majority beats
    greedy on the unlabelled pool. With one (cpu-varied): the majority beats greedy by at least
    ``majority_over_greedy`` AND the seeded pseudo-labels beat a random sample by at least
    ``pseudo_over_sample`` (docs/grm.md)."""
    majority, greedy = figures["pool_majority_accuracy"], figures["pool_greedy_accuracy"]
    if gate is None:
        return bool(majority > greedy)
    pseudo, sample = figures["pseudo_label_accuracy"], figures["pool_random_sample_accuracy"]
    return bool(majority - greedy >= gate["majority_over_greedy"] - 1e-9
                and pseudo - sample >= gate["pseudo_over_sample"] - 1e-9)  # fmt: skip


def _precheck_figures(ctx: Context) -> Figures:
    import json

    data: Figures = json.loads((ctx.out / "precheck.json").read_text())["figures"]
    return data


def last_judgments(folder: Path) -> list[dict[str, Any]]:
    """The last validation's per-row judgments (``JudgmentRecords``) as the row records the
    intervals read (``id``, ``family``, ``label``, ``verdict``, ``votes``, ``right``)."""
    import json

    files = sorted(folder.glob("val_epoch*.jsonl"), key=lambda p: int(p.stem.split("epoch")[1]))
    if not files:
        return []
    rows = [json.loads(line) for line in files[-1].read_text().splitlines() if line]
    return [{"id": r.pop("query_id"), **r} for r in rows]


def arm_figures(rows: list[dict[str, str]], start: tuple[list, list]) -> Figures:
    """Final held-out accuracy and positional consistency, the pseudo-label accuracy over
    training (mean of its logged values) and the curves, each starting at the warm judge."""
    acc = curve(rows, "val/accuracy")
    cons = curve(rows, "val/positional_consistency")
    figures: Figures = {
        "accuracy": acc[-1][1] if acc else float("nan"),
        "positional_consistency": cons[-1][1] if cons else float("nan"),
        "curves": {"accuracy": start[0] + acc, "positional_consistency": start[1] + cons},
    }
    key = column(rows, "pseudo_label_accuracy")
    pseudo = curve(rows, key) if key else []
    figures["pseudo_label_accuracy"] = float("nan")  # rft has none; so has a judge never read
    if pseudo:
        figures["pseudo_label_accuracy"] = statistics.fmean(v for _, v in pseudo)
        figures["pseudo_label_accuracy_last"] = pseudo[-1][1]
        figures["curves"]["pseudo_label_accuracy"] = pseudo
    return figures


PAPER = ConsistRM()


def grpo_config(
    *, model: str, mode: str, train: Path, val: Path, run_dir: Path, seed: int,
    settings: Mapping[str, Any], callbacks: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:  # fmt: skip
    """A whole ``GenerativeRewardModule`` run in this judge format: GRPO on ``train`` (each
    pair in both orders, shuffled), greedy validation on ``val`` after every epoch, one CSV
    logger in ``run_dir``."""

    def pairs(path: Path) -> dict[str, Any]:
        return {"class_path": "lit_rlhf.data.PreferencePairs", "init_args": {
            "path": str(path), "schema": "pairs", "template": jc.TEMPLATE, "swap": "both",
            "id_field": "id"}}  # fmt: skip

    return {
        "seed_everything": seed,
        "trainer": {
            "accelerator": settings.get("accelerator", "cpu"), "devices": 1, "precision": "auto",
            "max_epochs": settings["epochs"], "log_every_n_steps": 1,
            "num_sanity_val_steps": 0, "enable_checkpointing": False,
            "enable_progress_bar": False, "enable_model_summary": False,
            "limit_train_batches": settings.get("limit_train_batches"),
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {
                "save_dir": str(run_dir), "name": "", "version": ""}},
            "callbacks": list(callbacks),
        },
        "model": {"class_path": "lit_rlhf.modules.GenerativeRewardModule", "init_args": {
            "mode": mode, "model": model,
            "judge": {"tags": list(jc.TAGS), "critique_template": jc.CRITIQUE_TEMPLATE},
            "engine": {"class_path": "lit_rlhf.rollout.HFGenerationEngine", "init_args": {
                "max_new_tokens": settings["max_new_tokens"],
                "temperature": settings.get("temperature", 1.0)}},
            "rollout": {"samples_per_prompt": settings["samples_per_prompt"]},
            "optim": {"micro_batch_size": settings["micro_batch_size"], "lr": settings["lr"]},
            "kl": {"coef": settings["kl_coef"]}, "update": {"seed": seed}}},
        "data": {"class_path": "lit_rlhf.data.PromptDataModule", "init_args": {
            "tokenizer": model, "batch_size": settings["batch_size"],
            "val_batch_size": settings["val_batch_size"], "seed": seed,
            "train": pairs(train), "val": pairs(val)}},
    }  # fmt: skip


def curve(rows: Sequence[Mapping[str, str]], key: str) -> list[list[float]]:
    """``[[step, value], ...]`` of a metrics.csv column (the trainer's optimizer step)."""
    return [
        [float(s), v] for s, v in steps_and_values([dict(r) for r in rows], key, step_key="step")
    ]


def column(rows: Sequence[Mapping[str, str]], suffix: str) -> str | None:
    """The metrics.csv column ending in ``suffix`` (reward terms log under their class)."""
    names = sorted({k for r in rows for k in r if k.endswith(suffix)})
    return names[0] if names else None
