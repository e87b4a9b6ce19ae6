"""The pieces of the MGS comparison (scripts/repro/mgs.py): the config with a preset's overrides,
the pre-check's variance filter (the base policy samples each candidate prompt's group, the
domain's reward scores it, prompts whose group rewards all tie are dropped and the rest written
to the preset folder), each arm's fragment and the figures read back from a run's metrics.csv.
"""

from __future__ import annotations

import copy
import gc
import importlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

import yaml

from repro.runs import cli_in_process, read_rows, steps_and_values, write_fragment

SURGERY = "lit_rlhf.callbacks.ModularGradientSurgery"
_KEY = "ModularGradientSurgery/"
# figure name -> metrics.csv column, one curve each
CURVES = {
    "module_conflict": _KEY + "module/conflict_fraction",
    "global_conflict": _KEY + "global/conflict_fraction",
    "module_cosine": _KEY + "module/cosine_mean",
    "global_cosine": _KEY + "global/cosine_mean",
    "module_removed": _KEY + "module/removed_share",
    "global_removed": _KEY + "global/removed_share",
    "removed_share": _KEY + "removed_share",
    # domain pairs without a cosine (a domain's gradient zero: its rewards all tied this step)
    "undefined_pairs": _KEY + "global/undefined_pairs",
}
# arm -> the callback's settings (besides seed and the diagnostics every arm measures)
ARM_SURGERY: dict[str, dict[str, Any]] = {
    "mixed": {"granularity": "module", "apply": False},
    "null": {"granularity": "module", "apply": False, "shuffle_tasks": True},
    "pcgrad": {"granularity": "global", "apply": True},
    "mgs": {"granularity": "module", "apply": True},
}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` deep-merged into a copy of ``base`` (dicts merge, anything else replaces),
    as repeated ``--config`` files do."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The preset's base config with its ``overrides``, as the arms' runs see it."""
    config: dict[str, Any] = {}
    for path in settings["configs"]:
        config = merge(config, yaml.safe_load(Path(path).read_text()) or {})
    return merge(config, settings.get("overrides", {}))


def instantiate(spec: Any) -> Any:
    """A ``{class_path, init_args}`` spec built recursively (lists and dicts of specs too)."""
    if isinstance(spec, list):
        return [instantiate(s) for s in spec]
    if not isinstance(spec, dict):
        return spec
    if "class_path" not in spec:
        return {k: instantiate(v) for k, v in spec.items()}
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**{k: instantiate(v) for k, v in (spec.get("init_args") or {}).items()})


def group_std(scores: list[float], group: int) -> list[float]:
    """The population std of each consecutive block of ``group`` scores (one prompt's samples)."""
    if group < 1 or len(scores) % group:
        raise ValueError(f"{len(scores)} scores do not split into groups of {group}")
    return [statistics.pstdev(scores[i : i + group]) for i in range(0, len(scores), group)]


def sample_and_score(config: dict[str, Any], rows: list[dict[str, Any]], batch: int) -> list:
    """Each row's ``rollout.samples_per_prompt`` rewards under the base policy, sampled with the
    run's sampling settings (on HF generate), prompt rendering and precision (``auto``: bf16
    autocast on a CPU with native bf16 or a bf16 GPU), on the GPU when there is one."""
    import torch

    from lit_rlhf.data.prompts import tokenize_prompts
    from lit_rlhf.models.loading import load_causal_lm
    from lit_rlhf.rollout import HFGenerationEngine
    from lit_rlhf.training.precision import resolve_precision

    model_args = config["model"]["init_args"]
    data, reward = instantiate(config["data"]), instantiate(model_args["reward"])
    # the run's sampling settings on HF generate, whatever engine the run uses (vLLM included)
    sampling = ("max_new_tokens", "temperature", "top_p", "top_k")
    engine_args = model_args["engine"].get("init_args") or {}
    engine = HFGenerationEngine(**{k: v for k, v in engine_args.items() if k in sampling})
    group = int((model_args.get("rollout") or {}).get("samples_per_prompt", 4))  # the group default
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = load_causal_lm(model_args["model"]).eval().to(device)
    precision = config["trainer"].get("precision", "auto")
    bf16 = resolve_precision(precision, device) == "bf16-mixed"
    tokenizer = data.tokenizer
    scores: list[list[float]] = []
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        prompts = [data.render_prompt(str(r["question"])) for r in chunk for _ in range(group)]
        ids, mask = tokenize_prompts(tokenizer, prompts, chat_rendered=data.use_chat_template,
                                     device=device)  # fmt: skip
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            out = engine.generate(policy, ids, mask, tokenizer, log_probs=False)
        kept = out.response_ids.masked_fill(~out.response_mask, tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(kept, skip_special_tokens=True)
        flat = reward(prompts, texts, [r for r in chunk for _ in range(group)]).scores.tolist()
        scores += [flat[i : i + group] for i in range(0, len(flat), group)]
    return scores


def candidate_rows(config: dict[str, Any], pools: dict[str, int]) -> dict[str, list[dict]]:
    """The candidate prompts of each domain: the config's training sources, each cut to its
    ``pools`` size, keyed by the rows' task."""
    sources = config["data"]["init_args"]["train"]["init_args"]["sources"]
    by_task: dict[str, list[dict]] = {}
    for spec in sources:
        table = instantiate(spec).load()
        rows = [dict(r) for r in table]
        task = str(rows[0]["task"])
        by_task[task] = rows[: pools.get(task, len(rows))]
    return by_task


def filter_figures(
    scores: dict[str, list[list[float]]], *, min_pool: int, floor: float
) -> dict[str, Any]:
    """Per domain: candidates, prompts kept (group reward std > ``floor``), the share kept, the
    mean reward and mean group std; go when every domain keeps at least ``min_pool``."""
    domains: dict[str, Any] = {}
    for task, groups in scores.items():
        stds = [statistics.pstdev(g) for g in groups]
        kept = sum(s > floor for s in stds)
        domains[task] = {
            "candidates": len(groups),
            "kept": kept,
            "kept_share": kept / len(groups) if groups else 0.0,
            "mean_reward": statistics.fmean(x for g in groups for x in g) if groups else math.nan,
            "mean_group_std": statistics.fmean(stds) if stds else math.nan,
        }
    short = [t for t, d in domains.items() if d["kept"] < min_pool]
    pools = ", ".join(f"{t}: {d['kept']}/{d['candidates']}" for t, d in domains.items())
    reason = (
        f"every domain keeps >= {min_pool} prompts with non-zero group reward variance ({pools})"
        if not short
        else f"too few prompts with non-zero group reward variance in {short} ({pools}; need "
        f">= {min_pool} each)"
    )
    return {"go": not short, "reason": reason, "domains": domains}


def write_pool(path: Path, rows: list[dict[str, Any]]) -> Path:
    """The kept prompts of one domain as JSON lines (every column of the source rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return path


def pool_sources(pools: dict[str, str]) -> list[dict[str, Any]]:
    """FilePrompts specs of the filtered pools (domain -> file), for the arms' mixture."""
    return [
        {"class_path": "lit_rlhf.data.FilePrompts",
         "init_args": {"path": path, "question_field": "question", "answer_field": None,
                       "id_field": "query_id", "task": task,
                       "question_template": "{question}", "max_examples": None, "where": None}}
        for task, path in sorted(pools.items())
    ]  # fmt: skip


def arm_fragment(
    settings: dict[str, Any], arm: str, seed: int, root: Path, pools: dict[str, str]
) -> dict[str, Any]:
    """The whole config of one (arm, seed): the preset's configs and overrides merged here
    (one file, so no list or dict of the base is half-merged by the CLI), the arm's surgery
    callback (every arm measures ``module`` and ``global`` conflicts on its per-domain
    gradients), the filtered pools mixed 1/3 each, the seed everywhere, a CSV logger in
    ``root``."""
    steps, batch = settings["steps"], settings["batch_size"]
    surgery = {**ARM_SURGERY[arm], "seed": seed, "diagnostics": ["module", "global"]}
    callback: dict[str, Any] = {"class_path": SURGERY, "init_args": surgery}
    if settings.get("tensor_granularity") and arm == "mgs":
        callback["init_args"]["granularity"] = "tensor"  # the authors' code (GPU preset)
    mixture: dict[str, Any] = {"weights": [1, 1, 1], "seed": seed, "sources": pool_sources(pools)}
    if steps is not None:
        mixture["num_examples"] = steps * batch
    trainer: dict[str, Any] = {
        "callbacks": [*settings.get("other_callbacks", []), callback],
        "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                   "init_args": {"save_dir": str(root), "name": "logs", "version": ""}},
        "enable_progress_bar": False, "enable_checkpointing": False,
    }  # fmt: skip
    if steps is not None:
        trainer["limit_train_batches"] = steps
    fragment = merge(load_config(settings), {
        "seed_everything": seed, "trainer": trainer,
        "model": {"init_args": {"update": {"seed": seed}}},
        "data": {"init_args": {"seed": seed, "batch_size": batch, "global_batch_size": None,
                               "train": {
            "class_path": "lit_rlhf.data.MixturePrompts", "init_args": mixture}}},
    })  # fmt: skip
    return fragment


def run_fit(fragment: dict[str, Any], path: Path) -> Path:
    """``lit-rlhf fit`` of the config ``fragment`` (written to ``path``), in this process (a fresh
    process per run would add seconds of imports to each); returns the run's metrics.csv."""
    write_fragment(path, fragment)
    cli_in_process("fit", [path])
    gc.collect()
    return path.parent / "logs" / "metrics.csv"


def run_figures(metrics_csv: Path, domains: list[str]) -> dict[str, Any]:
    """Per-step curves (:data:`CURVES` and each domain's reward), their means over the steps,
    ``conflict_gap`` = mean over steps of (module - global conflict fraction), and each
    domain's training reward over the second half of the steps."""
    rows = read_rows(metrics_csv)
    figures: dict[str, Any] = {"curves": {}}
    for name, key in {**CURVES, **{f"reward_{d}": f"reward/{d}/score" for d in domains}}.items():
        points = steps_and_values(rows, key)
        figures["curves"][name] = [[s, v] for s, v in points]
        values = [v for _, v in points]
        late = values[len(values) // 2 :]
        figures[name] = statistics.fmean(late if name.startswith("reward_") else values) \
            if values else math.nan  # fmt: skip
    module = dict(steps_and_values(rows, CURVES["module_conflict"]))
    whole = dict(steps_and_values(rows, CURVES["global_conflict"]))
    gaps = [[s, module[s] - whole[s]] for s in sorted(set(module) & set(whole))]
    figures["curves"]["conflict_gap"] = gaps
    figures["conflict_gap"] = statistics.fmean(g for _, g in gaps) if gaps else math.nan
    return figures
