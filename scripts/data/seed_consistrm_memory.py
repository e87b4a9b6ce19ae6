"""Seed ConsistRM's memory from the starting judge (arXiv 2604.07484): N sampled verdicts per
training query (the authors: 8 rollouts of the starting model, their data's
``median_score_list`` column, which becomes each query's memory the first time it is seen), written
as the JSONL that ``ConsistencyAnswerReward(initial_memory=...)`` reads, one row
``{"query_id": ..., "labels": [-1, 1, ...]}`` per training query.

The training prompts are the config's own (its ``data`` section: source, template, order swaps,
chat template and its arguments, pre-fill), so the query ids are the ones training will see; the
judge, its output format and its sampling settings are the config's ``model`` section's.

    # GPU, the preset's judge through vLLM; then train with the fragment it writes
    python scripts/data/seed_consistrm_memory.py --config configs/grm/consistrm_qwen3-8b.yaml \\
        --engine vllm --dtype bfloat16 --out runs/consistrm_qwen3-8b/initial_memory.jsonl \\
        --fragment-out runs/consistrm_qwen3-8b/initial_memory.yaml
    lit-rlhf fit --config configs/grm/consistrm_qwen3-8b.yaml \\
        --config configs/trainer/deepspeed_zero3.yaml \\
        --config runs/consistrm_qwen3-8b/initial_memory.yaml
    # CPU smoke run on the tiny config
    python scripts/data/seed_consistrm_memory.py --config configs/grm/consistrm_tiny.yaml \\
        --samples 2 --out runs/consistrm_tiny/initial_memory.jsonl

Decisions the authors' public code leaves open [inferred]: a vote that is malformed or
unreadable (the format rule of ``lit_rlhf.algos.judge``) is left out, so a query's seed may hold
fewer than N labels (none at all: an empty memory); the votes are sampled with the config's
engine settings (temperature, max_new_tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from judge_samples import sampled_texts

ANSWER_REWARD = "lit_rlhf.callbacks.ConsistencyAnswerReward"


def memory_rows(
    query_ids: Sequence[str], votes: Sequence[Sequence[int | None]]
) -> list[dict[str, Any]]:
    """One seed row per query: its readable votes (-1 / +1) in sampling order; unreadable
    (None) votes are left out. A query seen twice (a repeated id) keeps its first votes."""
    rows: dict[str, dict[str, Any]] = {}
    for query, mine in zip(query_ids, votes, strict=True):
        if query not in rows:
            rows[query] = {"query_id": query, "labels": [int(v) for v in mine if v is not None]}
    return list(rows.values())


def load_config(path: Path, opts: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The config as a dict, and its data module built as the CLI would (in order, one batch of
    ``--batch-size`` prompts at a time; ``--num-examples`` caps the training source)."""
    import yaml
    from jsonargparse import ArgumentParser
    from lightning.pytorch import LightningDataModule

    config = yaml.safe_load(path.read_text()) or {}
    data = json.loads(json.dumps(config["data"]))  # a deep copy
    init = data.setdefault("init_args", {})
    init.update(shuffle=False, batch_size=opts.batch_size)
    init.pop("val", None)
    init.pop("test", None)
    if opts.num_examples is not None:
        init["train"].setdefault("init_args", {})["num_examples"] = opts.num_examples
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(LightningDataModule, "data")
    built = parser.instantiate_classes(parser.parse_object({"data": data}))
    return config, built.data


def make_engine(opts: argparse.Namespace, engine_config: dict[str, Any]) -> Any:
    """The config's sampling settings on the HF engine or vLLM (``--engine``)."""
    from lit_rlhf.rollout import HFGenerationEngine

    settings = dict(engine_config.get("init_args") or {})
    max_new_tokens = opts.max_new_tokens or settings.get("max_new_tokens", 64)
    temperature = settings.get("temperature", 1.0) if opts.temperature is None else opts.temperature
    if opts.engine == "vllm":
        from lit_rlhf.rollout import VLLMGenerationEngine

        return VLLMGenerationEngine(
            max_new_tokens=max_new_tokens, temperature=temperature, seed=opts.seed
        )
    return HFGenerationEngine(max_new_tokens=max_new_tokens, temperature=temperature)


def judge_format(model_args: dict[str, Any]) -> Any:
    """How the config's judge outputs are read (its ``judge`` group's tags, subject, pre-fill,
    suffix)."""
    from lit_rlhf.algos.judge import JUDGE_TAGS, JudgeFormat

    judge = model_args.get("judge") or {}
    return JudgeFormat(
        tuple(judge.get("tags") or JUDGE_TAGS),
        judge.get("subject", "Response"),
        judge.get("response_prefix", ""),
        judge.get("response_suffix", ""),
    )


def sample_votes(
    data: Any, model: Any, engine: Any, fmt: Any, samples: int
) -> tuple[list[str], list[list[int | None]], list[Any]]:
    """Per training prompt: its query id, ``samples`` sampled verdicts (None: unreadable) and
    its gold label (None when the row has none; reported, never written)."""
    query_ids: list[str] = []
    votes: list[list[int | None]] = []
    gold: list[Any] = []
    for batch, per_row in sampled_texts(data, model, engine, samples):
        for b, (row, mine) in enumerate(zip(batch["row"], per_row, strict=True)):
            votes.append([fmt.verdict(t, row.get("subject")) for t in mine])
            query_ids.append(str(batch["query_id"][b]))
            gold.append(row.get("label"))
    return query_ids, votes, gold


def seed_stats(
    rows: list[dict[str, Any]], votes: list[list[int | None]], gold: list[Any]
) -> dict[str, Any]:
    """How much the seed says: readable votes, queries with an empty seed or a tied one, and
    (diagnostic only, where rows carry gold labels) how often the seed's majority is right."""
    flat = [v for mine in votes for v in mine]
    sums = [sum(row["labels"]) for row in rows]
    stats: dict[str, Any] = {
        "queries": len(rows),
        "votes": len(flat),
        "readable_fraction": sum(v is not None for v in flat) / max(1, len(flat)),
        "empty_seed_fraction": sum(not row["labels"] for row in rows) / max(1, len(rows)),
        "tied_seed_fraction": sum(s == 0 for s in sums) / max(1, len(rows)),
    }
    judged = [(s > 0) - (s < 0) for s, g in zip(sums, gold, strict=False) if g in (-1, 1)]
    labelled = [g for g in gold if g in (-1, 1)]
    if labelled and len(judged) == len(labelled):
        right = sum(m == g for m, g in zip(judged, labelled, strict=True) if m != 0)
        stats["seed_majority_accuracy"] = right / max(1, sum(m != 0 for m in judged))
    return stats


def fragment_with_memory(config: dict[str, Any], memory: Path) -> dict[str, Any]:
    """A config fragment: the config's ``trainer.callbacks`` (a fragment replaces the whole list)
    with ``initial_memory`` set on ``ConsistencyAnswerReward``."""
    callbacks = json.loads(json.dumps(config.get("trainer", {}).get("callbacks") or []))
    answers = [c for c in callbacks if isinstance(c, dict) and c.get("class_path") == ANSWER_REWARD]
    if not answers:
        raise ValueError(
            f"the config has no {ANSWER_REWARD} in trainer.callbacks, so nothing reads the "
            "memory. Fix: seed the memory for a ConsistRM config (mode: consistrm)."
        )
    for callback in answers:
        callback.setdefault("init_args", {})["initial_memory"] = str(memory)
    return {"trainer": {"callbacks": callbacks}}


def run(opts: argparse.Namespace, engine: Any = None) -> dict[str, Any]:
    """Sample, write the seed JSONL (and the fragment); returns the statistics."""
    import yaml

    from lit_rlhf.models import load_causal_lm

    config, data = load_config(opts.config, opts)
    model_args = config["model"].get("init_args", {})
    fragment = fragment_with_memory(config, opts.out) if opts.fragment_out else None
    data.setup("fit")
    device = "cuda" if opts.device == "auto" and _cuda() else "cpu"
    if opts.device not in ("auto", "cpu"):
        device = opts.device
    model = load_causal_lm(opts.model or model_args["model"], dtype=opts.dtype).eval().to(device)
    engine = engine or make_engine(opts, model_args.get("engine") or {})
    query_ids, votes, gold = sample_votes(
        data, model, engine, judge_format(model_args), opts.samples
    )
    rows = memory_rows(query_ids, votes)
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    if fragment is not None:
        opts.fragment_out.parent.mkdir(parents=True, exist_ok=True)
        opts.fragment_out.write_text(yaml.safe_dump(fragment))
    return {"out": str(opts.out), **seed_stats(rows, votes, gold)}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the training config")
    parser.add_argument("--out", type=Path, required=True, help="the seed JSONL to write")
    parser.add_argument("--fragment-out", type=Path, help="also write a config fragment")
    parser.add_argument("--samples", type=int, default=8, help="votes per query (authors: 8)")
    parser.add_argument("--model", help="the starting judge (default: the config's)")
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--max-new-tokens", type=int, help="default: the config's engine's")
    parser.add_argument("--temperature", type=float, help="default: the config's engine's")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda:0")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    parser.add_argument("--num-examples", type=int, help="cap the training source (smoke runs)")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    if opts.samples < 1 or opts.batch_size < 1:
        parser.error("--samples and --batch-size must be >= 1")
    return opts


def main(argv: list[str] | None = None, engine: Any = None) -> int:
    opts = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import lightning as L

    L.seed_everything(opts.seed, verbose=False)
    stats = run(opts, engine)
    print(json.dumps(stats, indent=1))
    empty = "warning: no vote was readable, so every seed is empty (the memory starts empty, as "
    empty += "without a seed); check the judge's format settings and max_new_tokens\n"
    sys.stderr.write(empty if stats["readable_fraction"] == 0 else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
