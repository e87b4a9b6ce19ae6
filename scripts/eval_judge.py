"""Evaluate a pairwise judge on judge benchmarks (RewardBench, RM-Bench, RMB, JudgeBench,
PPE-Preference, HelpSteer3) or any preference pairs: per benchmark its headline score as its
authors compute it, accuracy and positional consistency (correct in both orders), format-valid
and tie rates, per-subset accuracy and consistency, and the papers' averages over benchmarks
(ConsistRM arXiv 2604.07484, ReflectRM arXiv 2604.07506). Prints markdown tables; writes them
with ``--markdown`` and everything with ``--json``.

    python scripts/eval_judge.py --model Qwen/Qwen3-8B --benchmarks rewardbench rm_bench \\
        judgebench ppe_preference rmb=RMB_dataset/Pairwise_set,RMB_dataset/BoN_set
    python scripts/eval_judge.py --checkpoint runs/.../last.ckpt --benchmarks judgebench@claude
    python scripts/eval_judge.py --model builtin:tiny-llama --pairs pairs.jsonl --schema pairs
    python scripts/eval_judge.py --model builtin:tiny-llama --synthetic 32   # no file needed

A benchmark is ``NAME`` (its hub id and split, ``lit_rlhf.data.judge_benchmarks``),
``NAME=PATH[,PATH...]`` (local files/folders or hub ids in its schema, pooled) and an optional
``@SPLIT``. Every pair is judged in both orders. ``--model`` is any HF causal LM (hub id,
folder, ``builtin:``); ``--checkpoint`` a ``GenerativeRewardModule`` checkpoint. ``--samples N``
judges by majority of N sampled outputs (default: 1 greedy); ``--inference reflective --samples
8`` with ReflectRM's two-stage reflective inference. Prompts longer than
``--max-prompt-length`` are not judged and count as wrong (the table says how many rows were
judged). Qwen3's thinking switches (arXiv 2505.09388; the judge papers evaluate without
thinking): ``--chat-template-kwargs '{"enable_thinking": false}'`` (the hard switch, passed to
the chat template) and ``--question-suffix " /no_think"`` (the soft one, appended to every
judge prompt); a think trace in the output is stripped before the verdict is read either way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from statistics import fmean
from typing import Any, get_args

import datasets
import lightning as L

from lit_rlhf.data.judge_benchmarks import JUDGE_BENCHMARKS, JudgeBenchmark
from lit_rlhf.data.pairs import PairSchema
from lit_rlhf.metrics.judge_benchmarks import Judged, benchmark_report, paper_averages


class LoadedPairs:
    """A pair table loaded once, so the rows judged and the rows scored are the same."""

    def __init__(self, data: datasets.Dataset) -> None:
        self.data = data

    def load(self) -> datasets.Dataset:
        return self.data


def parse_benchmark(spec: str) -> tuple[str, JudgeBenchmark, list[str]]:
    """``NAME[=PATH[,PATH...]][@SPLIT]`` -> (name, its record with the split applied, paths)."""
    spec, _, split = spec.partition("@")
    name, _, paths = spec.partition("=")
    if name not in JUDGE_BENCHMARKS:
        raise SystemExit(
            f"--benchmarks: unknown benchmark {name!r}. Fix: one of {', '.join(JUDGE_BENCHMARKS)}"
            ", optionally =PATH[,PATH...] and @SPLIT (or --pairs FILE --schema S for others)."
        )
    bench = JUDGE_BENCHMARKS[name]
    bench = bench._replace(split=split or bench.split)
    sources = [p for p in paths.split(",") if p] or ([bench.hub_id] if bench.hub_id else [])
    if not sources:
        raise SystemExit(
            f"--benchmarks: {bench.title} has no hub copy. Fix: {name}=PATH[,PATH...], e.g. "
            f"{name}=RMB_dataset/Pairwise_set,RMB_dataset/BoN_set (from its authors' repo)."
        )
    return name, bench, sources


def load_pairs(opts: argparse.Namespace, bench: JudgeBenchmark, paths: list[str]) -> Any:
    """One table of pairs, each in both orders, pooled over ``paths``."""
    from lit_rlhf.data import PreferencePairs, SyntheticPairs

    if opts.synthetic:
        source: Any = SyntheticPairs(
            num_examples=opts.synthetic, seed=opts.seed, template=opts.template, swap="both"
        )
        return source.load()
    tables = [
        PreferencePairs(
            path,
            schema=bench.schema,  # type: ignore[arg-type]
            split=bench.split,
            name=bench.config,
            template=opts.template,
            swap="both",
            seed=opts.seed,
            num_examples=opts.limit,
            skip_malformed=opts.skip_malformed,
        ).load()
        for path in paths
    ]
    return datasets.concatenate_datasets(tables) if len(tables) > 1 else tables[0]


def build_judge(opts: argparse.Namespace) -> tuple[Any, str]:
    """The judge module and the model (tokenizer) name."""
    from lit_rlhf.modules import GenerativeRewardModule
    from lit_rlhf.rollout import HFGenerationEngine

    engine = HFGenerationEngine(max_new_tokens=opts.max_new_tokens, temperature=opts.temperature)
    judging = {"eval_samples": opts.samples, "inference": opts.inference}
    if opts.checkpoint:
        judge = {**checkpoint_judge(opts.checkpoint), **judging}  # its format, this inference
        module = GenerativeRewardModule.load_from_checkpoint(
            opts.checkpoint, weights_only=True, engine=engine, judge=judge
        )
        return module, module.hparams["model"]
    return GenerativeRewardModule(model=opts.model, engine=engine, judge=judging), opts.model


def checkpoint_judge(path: str) -> dict[str, Any]:
    """The ``judge`` group a ``GenerativeRewardModule`` checkpoint was trained with (tags,
    subject, pre-fill ...; flat names of a checkpoint from before the groups regrouped), so the
    evaluation overrides only its inference."""
    import torch

    from lit_rlhf.modules import GenerativeRewardModule
    from lit_rlhf.settings import regroup_flat

    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    hparams = regroup_flat(GenerativeRewardModule, checkpoint.get("hyper_parameters") or {})
    return dict(hparams.get("judge") or {})


def evaluate(trainer: L.Trainer, module: Any, model: str, rows: Any, opts: Any) -> dict[str, Any]:
    """Judge every row; the verdicts, vote validity and row counts of one benchmark."""
    from lit_rlhf.data import PromptDataModule

    source = LoadedPairs(rows)
    data = PromptDataModule(
        tokenizer=model,
        train=source,
        test=source,
        batch_size=opts.batch_size,
        max_prompt_length=opts.max_prompt_length,
        chat_template_kwargs=opts.chat_template_kwargs,
        question_suffix=opts.question_suffix,
    )
    batches = trainer.predict(module, datamodule=data) or []
    predictions = {p["query_id"]: p for batch in batches for p in batch}
    votes = [v for p in predictions.values() for v in p["votes"]]
    judged = [
        Judged(
            family=row["family_id"],
            comparison=row.get("comparison") or "",
            subset=row["subset"] or "",
            swapped=row["swapped"],
            label=row["label"],
            verdict=predictions.get(row["query_id"], {}).get("verdict", 0),
        )
        for row in rows
        if row["label"] is not None  # unlabelled rows (kept ties) cannot be scored
    ]
    return {
        "judged": judged,
        "rows": len(rows),
        "rows_judged": len(predictions),
        "format_valid": fmean(v is not None for v in votes) if votes else math.nan,
        "tie_rate": fmean(j.verdict == 0 for j in judged) if judged else math.nan,
    }


def report(bench: JudgeBenchmark, outcome: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's scores (``lit_rlhf.metrics.judge_benchmarks``) and the run's counts."""
    judged = outcome.pop("judged")
    return {
        "title": bench.title,
        "schema": bench.schema,
        **benchmark_report(bench.schema, judged),
        **outcome,
    }


def _finite(value: Any) -> Any:
    """``value`` with every NaN as None (JSON has no NaN)."""
    if isinstance(value, dict):
        return {key: _finite(v) for key, v in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value


def _cell(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f}"


def render(reports: dict[str, dict[str, Any]], averages: dict[str, float]) -> str:
    """Markdown: metrics x benchmarks, the papers' averages, the benchmarks' own breakdowns and
    the subsets."""
    names = list(reports)
    lines = ["| metric | " + " | ".join(reports[n]["title"] for n in names) + " |"]
    lines.append("|---" * (len(names) + 1) + "|")
    for key in ("score", "accuracy", "positional_consistency", "format_valid", "tie_rate"):
        lines.append(f"| {key} | " + " | ".join(_cell(reports[n][key]) for n in names) + " |")
    judged = " | ".join(f"{reports[n]['rows_judged']}/{reports[n]['rows']}" for n in names)
    lines += [f"| rows_judged | {judged} |", "", "| average | value |", "|---|---|"]
    lines += [f"| {paper} | {_cell(value)} |" for paper, value in averages.items()]
    lines += ["", "| benchmark | score | value |", "|---|---|---|"]
    for n in names:
        lines += [
            f"| {reports[n]['title']} | {k} | {_cell(v)} |" for k, v in reports[n]["scores"].items()
        ]
    lines += ["", "| benchmark | subset | accuracy | positional_consistency | pairs |"]
    lines.append("|---|---|---|---|---|")
    for n in names:
        for subset, row in reports[n]["subsets"].items():
            lines.append(
                f"| {reports[n]['title']} | {subset} | {_cell(row['accuracy'])} | "
                f"{_cell(row['positional_consistency'])} | {int(row['pairs'])} |"
            )
    return "\n".join(lines)


def json_object(text: str) -> dict[str, Any]:
    """``--chat-template-kwargs``: a JSON object (``'{"enable_thinking": false}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}): {text!r}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"a JSON object is needed, e.g. '{{\"enable_thinking\": false}}', got {text!r}"
        )
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="HF causal LM: hub id, folder or builtin:<name>")
    which.add_argument("--checkpoint", help="a GenerativeRewardModule checkpoint")
    pairs = parser.add_mutually_exclusive_group(required=True)
    pairs.add_argument("--benchmarks", nargs="+", help="NAME[=PATH[,PATH...]][@SPLIT] ...")
    pairs.add_argument("--pairs", help="preference pairs: file, folder or hub id (--schema)")
    pairs.add_argument("--synthetic", type=int, help="N generated arithmetic pairs instead")
    parser.add_argument("--schema", default="rewardbench", choices=get_args(PairSchema))
    parser.add_argument("--split", default="train", help="the split of --pairs")
    parser.add_argument("--limit", type=int, help="judge the first N pairs of each benchmark")
    parser.add_argument("--skip-malformed", action="store_true", help="skip bad rows (warned)")
    parser.add_argument("--template", default="consistrm-v1")
    parser.add_argument("--samples", type=int, default=1, help="judge outputs per pair")
    parser.add_argument(
        "--inference",
        choices=["single", "majority", "reflective"],
        help="default: single for one sample, majority for several",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-prompt-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--chat-template-kwargs",
        type=json_object,
        help="JSON passed to the chat template, e.g. '{\"enable_thinking\": false}' (Qwen3)",
    )
    parser.add_argument(
        "--question-suffix", default="", help='appended to every judge prompt, e.g. " /no_think"'
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the reports and averages to this JSON file")
    parser.add_argument("--markdown", help="write the tables to this markdown file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    opts = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if opts.benchmarks:
        benchmarks = [parse_benchmark(spec) for spec in opts.benchmarks]
    else:  # one source: --pairs in --schema, or --synthetic
        name = "synthetic" if opts.synthetic else opts.schema
        bench = JudgeBenchmark(name, "pairs" if opts.synthetic else opts.schema, None, opts.split)
        benchmarks = [(name, bench, [opts.pairs] if opts.pairs else [])]
    L.seed_everything(opts.seed, verbose=False)
    module, model = build_judge(opts)
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    reports = {}
    for name, bench, paths in benchmarks:
        rows = load_pairs(opts, bench, paths)
        try:
            outcome = evaluate(trainer, module, model, rows, opts)
        except ValueError as err:  # e.g. every prompt longer than --max-prompt-length
            raise ValueError(f"{bench.title} ({', '.join(paths)}): {err}") from err
        reports[name] = report(bench, outcome)
    averages = paper_averages({name: r["score"] for name, r in reports.items()})
    tables = render(reports, averages)
    print(tables)
    if opts.markdown:
        with open(opts.markdown, "w", encoding="utf-8") as handle:
            handle.write(tables + "\n")
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(_finite({"benchmarks": reports, "averages": averages}), handle, indent=1)


if __name__ == "__main__":
    main()
