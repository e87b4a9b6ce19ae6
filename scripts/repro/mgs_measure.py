"""MGS as a measurement study (docs/multidomain.md, "Measurement study"; the rule, the gate and
the verdict are registered there before the first run): at a fixed policy, do the domains'
gradients conflict per module more than random prompt sets of the same sizes do, beyond what the
same comparison shows over the whole gradient?

    python scripts/repro/mgs_measure.py           # gate, trained policy, 2 x 40 batches
    python scripts/repro/mgs_measure.py --smoke   # tiny random model, plumbing only

Two fixed policies (``base``: SmolLM2-135M-Instruct; ``trained``: after 16 mixed GRPO steps on
the development prompts). Per policy: the gate on the development pools, then 40 batches of 8
prompts per domain (arithmetic, generated instructions, chat), one gradient per prompt group,
per-module Gram matrices, the true labels' conflict figures and 20 in-batch permutations' (the
null). Every batch, gate and the trained policy are cached under ``--root`` (a stopped run
resumes). Writes ``--out`` (default docs/multidomain_measure.json): per policy the gate and every
batch's figures, the primary, the settings and the commit.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))

from repro.common import git_commit  # noqa: E402
from repro.intervals import Interval, bootstrap_interval  # noqa: E402
from repro.mgs_grams import batch_figures, group_grams, module_groups, sample_batch  # noqa: E402
from repro.mgs_runs import arm_fragment, instantiate, write_pool  # noqa: E402

SMOLLM2 = "builtin:smollm2-135m-instruct"
_TINY = "builtin:tiny-llama"
TEMPLATE = ("What is {expression}? Reply with only the final number inside \\boxed{{}}, for "
            "example: \\boxed{{12}}")  # fmt: skip
DOMAINS = ("arithmetic", "chat", "ifeval")
REWARDS: dict[str, dict[str, Any]] = {
    "arithmetic": {"class_path": "lit_rlhf.rewards.MathReward",
                   "init_args": {"format_reward": 0.1, "literal_answers": True}},
    "ifeval": {"class_path": "lit_rlhf.rewards.InstructionReward"},
    "chat": {"class_path": "lit_rlhf.rewards.ReferenceSimilarityReward"},
}  # fmt: skip
CHAT = {"class_path": "lit_rlhf.data.FilePrompts",
        "init_args": {"path": str(ROOT / "lit_rlhf/data/samples/chat_prompts.jsonl"),
                      "answer_field": None, "id_field": "id", "task": "chat"}}  # fmt: skip


def settings(smoke: bool) -> dict[str, Any]:
    """The registered settings (docs/multidomain.md); ``smoke``: a tiny random model."""
    s: dict[str, Any] = {
        "model": SMOLLM2, "embedder": None, "bf16": _native_bf16(), "batches": 40,
        "per_domain": 8, "samples": 4, "max_new_tokens": 32, "temperature": 1.0,
        "permutations": 20, "primary_pool": 320, "dev_pool": 48, "gate_min_live": 0.25,
        "train_steps": 16, "train_batch": 6, "seed": 0,
        "train_configs": ["configs/ppo/multidomain_smollm2.yaml"], "train_overrides": {},
    }  # fmt: skip
    if smoke:
        s.update(model=_TINY, embedder=_TINY, bf16=False, batches=2, per_domain=2,
                 max_new_tokens=6, permutations=3, primary_pool=4, dev_pool=3,
                 gate_min_live=0.0, train_steps=1, train_batch=3)  # fmt: skip
        s["train_overrides"] = {
            "trainer": {"precision": "32-true"},
            "model": {"init_args": {"model": _TINY,
                                    "engine": {"init_args": {"max_new_tokens": 6}}}},
            "data": {"init_args": {"tokenizer": _TINY}},
        }  # fmt: skip
    return s


def _native_bf16() -> bool:
    """bf16 autocast only on a CPU with native bf16 (as ``precision: auto`` decides)."""
    from lit_rlhf.training.precision import resolve_precision

    return resolve_precision("auto", "cpu") == "bf16-mixed"


def rewards(s: dict[str, Any]) -> dict[str, Any]:
    out = dict(REWARDS)
    if s["embedder"]:
        out["chat"] = {**REWARDS["chat"], "init_args": {"embedder": s["embedder"]}}
    return out


def arithmetic_source(count: int, seed: int) -> dict[str, Any]:
    return {"class_path": "lit_rlhf.data.ArithmeticPrompts", "init_args": {
        "num_examples": count, "seed": seed, "min_a": 1, "max_a": 20, "min_b": 1, "max_b": 20,
        "operators": "+-", "question_template": TEMPLATE}}  # fmt: skip


def source_rows(spec: dict[str, Any], tokenizer_name: str) -> list[dict[str, Any]]:
    """A prompt source's rows as the data module prepares them, distinct questions only."""
    from lit_rlhf.data import PromptDataModule

    data = PromptDataModule(tokenizer=tokenizer_name, train=instantiate(spec), batch_size=1)
    data.setup("fit")
    assert data.train_data is not None
    rows, seen = [], set()
    for row in data.train_data:
        if row["question"] not in seen:
            seen.add(row["question"])
            rows.append(dict(row))
    return rows


def probe(s: dict[str, Any], path: Path) -> dict[str, Any]:
    """The development probe that chose the arithmetic template (docs/multidomain.md): 24
    prompts of seed 100 at the base policy; written to ``path``."""
    from lit_rlhf.models.loading import load_causal_lm, load_tokenizer

    rows = source_rows(arithmetic_source(24, 100), s["model"])
    measurer = Measurer(s, load_causal_lm(s["model"]), load_tokenizer(s["model"]))
    record = {"settings": s, "commit": git_commit(), "arithmetic": measurer.live(rows, 0)}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("probe:", json.dumps(record["arithmetic"]))
    return record


def pools(s: dict[str, Any], tokenizer_name: str) -> dict[str, dict[str, list[dict]]]:
    """``{"primary": {domain: rows}, "dev": {domain: rows}}``: arithmetic expressions and
    instruction prompts deduplicated, the first ``primary_pool`` primary, the next ``dev_pool``
    development (disjoint); chat's 24 prompts serve both."""
    n = s["primary_pool"] + s["dev_pool"]
    sources = {
        "arithmetic": arithmetic_source(4 * n, s["seed"]),
        "ifeval": {"class_path": "lit_rlhf.data.instructions.GeneratedInstructionPrompts",
                   "init_args": {"num_examples": n, "seed": s["seed"], "max_instructions": 1}},
        "chat": CHAT,
    }  # fmt: skip
    out: dict[str, dict[str, list[dict]]] = {"primary": {}, "dev": {}}
    for domain, spec in sources.items():
        rows = source_rows(spec, tokenizer_name)
        if domain == "chat":
            out["primary"][domain] = out["dev"][domain] = rows
        else:
            if len(rows) < n:
                raise SystemExit(f"{domain}: {len(rows)} distinct prompts, need {n}")
            out["primary"][domain] = rows[: s["primary_pool"]]
            out["dev"][domain] = rows[s["primary_pool"] : n]
    return out


def batch_rows(s: dict[str, Any], primary: dict[str, list[dict]], policy: int, b: int) -> list:
    """Batch ``b``: the next ``per_domain`` prompts of each pool (chat: a seeded draw of its 24,
    wrapping the other pools when a smoke pool is short)."""
    k, out = s["per_domain"], []
    for domain in DOMAINS:
        rows = primary[domain]
        if domain == "chat":
            out += random.Random(1_000 * policy + b).sample(rows, min(k, len(rows)))
        else:
            out += [rows[(b * k + i) % len(rows)] for i in range(k)]
    return out


class Measurer:
    """One policy's collector, tokenizer and module groups; its gate and batches."""

    def __init__(self, s: dict[str, Any], policy: Any, tokenizer: Any) -> None:
        from lit_rlhf.rewards import RewardByTask
        from lit_rlhf.rollout import HFGenerationEngine
        from lit_rlhf.training.rollouts import RolloutCollector

        self.s, self.policy, self.tokenizer = s, policy.eval(), tokenizer
        engine = HFGenerationEngine(max_new_tokens=s["max_new_tokens"],
                                    temperature=s["temperature"])  # fmt: skip
        reward = RewardByTask(rewards={d: instantiate(spec) for d, spec in rewards(s).items()})
        self.collector = RolloutCollector(engine, reward)
        self.modules = module_groups(policy)

    def live(self, rows: list[dict], seed: int) -> dict[str, Any]:
        """One domain's prompts sampled (groups of ``samples``, 12 prompts per call): how many,
        the share whose group rewards do not all tie, the mean reward."""
        torch.manual_seed(seed)
        scores: list[list[float]] = []
        for start in range(0, len(rows), 12):
            ro = sample_batch(self.collector, self.policy, self.tokenizer, rows[start : start + 12],
                              samples=self.s["samples"], bf16=self.s["bf16"])  # fmt: skip
            scores += ro.scores.view(-1, self.s["samples"]).tolist()
        return {"prompts": len(scores),
                "live_share": sum(max(g) > min(g) for g in scores) / len(scores),
                "mean_reward": statistics.fmean(x for g in scores for x in g)}  # fmt: skip

    def gate(self, dev: dict[str, list[dict]], seed: int) -> dict[str, Any]:
        """Per domain, the share of development prompts whose group rewards do not all tie."""
        domains = {domain: self.live(dev[domain], seed) for domain in DOMAINS}
        short = [d for d, f in domains.items() if f["live_share"] < self.s["gate_min_live"]]
        return {"passes": not short, "short": short, "domains": domains}

    def batch(self, rows: list[dict], seed: int) -> dict[str, Any]:
        start = time.perf_counter()
        torch.manual_seed(seed)
        ro = sample_batch(self.collector, self.policy, self.tokenizer, rows,
                          samples=self.s["samples"], bf16=self.s["bf16"])  # fmt: skip
        grams, live = group_grams(
            self.policy, ro, self.modules, temperature=self.s["temperature"], bf16=self.s["bf16"]
        )
        labels = [str(r["task"]) for r in rows]
        figures = batch_figures(grams, list(self.modules), labels,
                                permutations=self.s["permutations"], seed=seed)  # fmt: skip
        scores = ro.scores.view(len(rows), -1)
        figures["live"] = {d: sum(labels[g] == d for g in live) for d in DOMAINS}
        figures["reward"] = {d: float(scores[[lab == d for lab in labels]].mean())
                             for d in DOMAINS}  # fmt: skip
        figures["seconds"] = round(time.perf_counter() - start, 1)
        return figures


def cached(path: Path, make: Any) -> Any:
    if path.exists():
        return json.loads(path.read_text())
    value = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")
    return value


def trained_policy(s: dict[str, Any], dev: dict[str, list[dict]], out: Path) -> Path:
    """The ``trained`` policy: ``train_steps`` mixed GRPO steps on the development pools (the
    comparison's config and settings, arithmetic's reward for Countdown's, no callbacks), its
    weights cached as ``trained.pt``."""
    path = out / "trained.pt"
    if path.exists():
        return path
    from repro.runs import cli_in_process, write_fragment

    files = {d: str(write_pool(out / "dev" / f"{d}.jsonl", rows)) for d, rows in dev.items()}
    arm = {"configs": s["train_configs"], "overrides": s["train_overrides"],
           "steps": s["train_steps"], "batch_size": s["train_batch"]}  # fmt: skip
    fragment = arm_fragment(arm, "mixed", s["seed"], out / "train", files)
    fragment["trainer"]["callbacks"] = []
    by_task = fragment["model"]["init_args"]["reward"]["init_args"]["rewards"]
    by_task.pop("countdown", None)
    by_task.update({d: spec for d, spec in rewards(s).items() if d == "arithmetic"})
    if s["embedder"]:
        by_task["chat"] = rewards(s)["chat"]
    write_fragment(out / "train" / "config.yaml", fragment)
    cli = cli_in_process("fit", [out / "train" / "config.yaml"])
    torch.save(cli.model.policy.state_dict(), path)
    return path


def primary(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per batch (module - global conflict) true minus null; the mean over batches where all
    four are defined, its percentile bootstrap and t-intervals, the registered verdict."""
    values, left_out = [], 0
    for f in batches:
        t, n = f["true"], f["null"]
        parts = [t["module_conflict"], t["global_conflict"], n["module_conflict"],
                 n["global_conflict"]]  # fmt: skip
        if all(math.isfinite(x) for x in parts):
            values.append((parts[0] - parts[1]) - (parts[2] - parts[3]))
        else:
            left_out += 1
    boot, t_int = bootstrap_interval(values, -2.0, 2.0), Interval.of(values)
    verdict = "reproduced" if boot.low > 0 else "opposite" if boot.high < 0 else "not shown"
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return {
        "per_batch": values,
        "batches": len(values),
        "left_out": left_out,
        "mean": boot.mean,
        "bootstrap_95": [boot.low, boot.high],
        "t_95": [t_int.low, t_int.high],
        "sd": sd,
        "detectable": 2.8 * sd / math.sqrt(len(values)) if values else math.nan,
        "verdict": verdict if values else "none: no batch with every figure defined",
    }


def secondary(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """True minus null of every figure (bootstrap over the batches where both are defined)."""
    out: dict[str, Any] = {}
    for key in batches[0]["true"] if batches else []:
        diffs = [f["true"][key] - f["null"][key] for f in batches
                 if math.isfinite(f["true"][key]) and math.isfinite(f["null"][key])]  # fmt: skip
        boot = bootstrap_interval(diffs, -math.inf, math.inf)
        out[key] = {"mean": boot.mean, "bootstrap_95": [boot.low, boot.high], "n": len(diffs)}
    return out


def overall(by_policy: dict[str, dict[str, Any]]) -> str:
    measured = [p["primary"]["verdict"] for p in by_policy.values() if p["gate"]["passes"]]
    if not measured:
        return "not testable at CPU scale: no policy passed the gate"
    if len(measured) == len(by_policy) and len(set(measured)) == 1:
        return measured[0]
    return "not shown"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--probe", action="store_true", help="the arithmetic probe alone")
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "reproduce" / "mgs-measure")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "multidomain_measure.json")
    opts = parser.parse_args(argv)
    from lit_rlhf.models.loading import load_causal_lm, load_tokenizer

    s = settings(opts.smoke)
    if opts.probe:
        return probe(s, opts.out.with_name(opts.out.stem + "_probe.json"))
    out = opts.root / ("smoke" if opts.smoke else "cpu")
    data = pools(s, s["model"])
    tokenizer = load_tokenizer(s["model"])
    by_policy: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(("base", "trained")):
        policy = load_causal_lm(s["model"])
        if name == "trained":
            policy.load_state_dict(torch.load(trained_policy(s, data["dev"], out)))
        measurer = Measurer(s, policy, tokenizer)
        gate = cached(out / name / "gate.json", lambda m=measurer: m.gate(data["dev"], 17))
        print(f"{name}: gate {json.dumps(gate)}", flush=True)
        batches = []
        for b in range(s["batches"] if gate["passes"] else 0):
            rows = batch_rows(s, data["primary"], index, b)
            f = cached(
                out / name / f"batch_{b:02d}.json",
                lambda r=rows, m=measurer, seed=10_000 * index + b: m.batch(r, seed),
            )
            print(f"{name} batch {b}: {f['seconds']} s, live {f['live']}", flush=True)
            batches.append(f)
        closed = {"verdict": f"not measured: the gate fails on {gate['short']}"}
        by_policy[name] = {"gate": gate, "batches": batches,
                           "primary": primary(batches) if gate["passes"] else closed,
                           "secondary": secondary(batches)}  # fmt: skip
    record = {"settings": s, "commit": git_commit(), "policies": by_policy,
              "verdict": overall(by_policy)}  # fmt: skip
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    for name, p in by_policy.items():
        print(name, json.dumps({k: v for k, v in p["primary"].items() if k != "per_batch"}))
    print("verdict:", record["verdict"])
    return record


if __name__ == "__main__":
    main()
