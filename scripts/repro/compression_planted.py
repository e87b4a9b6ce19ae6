"""Compression, planted prior (docs/compressor.md, "Planted prior"; the rule and the gates are
registered there before the first run): can the overwrite margin see a prior that we put into a
compressor ourselves?

    python scripts/repro/compression_planted.py            # seeds 0-2, cached, resumable
    python scripts/repro/compression_planted.py --smoke    # tiny random models, plumbing only

Per seed: SmolLM2 cut to 10 layers is fine-tuned as a plain LM for a few steps on sentences that
assert each subject's prior value ("The carrots in Kofi's field are orange.": the ``planted``
twin), or on the same sentences with the subject's values spread evenly over its prior and
counterfactual values (the ``twin``: the same template, steps and tokens, no consistent value).
Both are then trained as compressors (LoRA, 4 memory tokens) against the frozen SmolLM2 decoder
on one-sentence counterfactual facts, and read on 200 held-out facts: memory gain, and per fact
the overwrite margin = the decoder's log p(prior value) - log p(context value) at the value slot,
reading the fact's memory. Writes ``--out`` (default docs/compressor_planted.json).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "scripts"))

from repro.common import git_commit  # noqa: E402
from repro.compression_runs import (  # noqa: E402
    cpu_run,
    fact_stem,
    flush_denormals,
    prior_margins,
    train_and_evaluate,
    write_passages,
)
from repro.intervals import Interval, bootstrap_interval  # noqa: E402

SMOLLM2 = "builtin:smollm2-135m-instruct"
_TINY = "builtin:tiny-llama"
TWINS = ("planted", "twin")
EVAL_SEED, TRAIN_SEED, PLANT_SEED = 0, 1000, 2000  # probe seeds of the three sentence sets
GATES = {"plant_margin": 1.0, "memory_gain": 0.5, "equal_gain": 0.2}


def settings(smoke: bool) -> dict[str, Any]:
    """The registered settings (docs/compressor.md); ``smoke``: tiny random models."""
    s: dict[str, Any] = {
        "compressor": SMOLLM2, "decoder": SMOLLM2, "layers": 10, "precision": "auto",
        "plant_sentences": 256, "plant_steps": 48, "plant_lr": 5e-5, "plant_batch": 8,
        "lora_rank": 16, "lora_alpha": 32, "lora_target_modules": "all-linear", "lr": 1e-3,
        "memory_tokens": 4, "context_tokens": 24, "batch_size": 8, "steps": 400,
        "train_facts": 1600,
        "max_new_tokens": 24, "eval_facts": 200, "probes": 4, "seeds": [0, 1, 2],
    }  # fmt: skip
    if smoke:
        s.update(compressor=_TINY, decoder=_TINY, layers=1, precision="32-true",
                 plant_sentences=8, plant_steps=2, plant_batch=4, lora_rank=0, lr=1e-2,
                 batch_size=4, steps=2, train_facts=8, max_new_tokens=8, eval_facts=6, probes=1,
                 seeds=[0])  # fmt: skip
    return s


def fact_items(
    count: int, seed: int, avoid: frozenset[str] | set[str] = frozenset()
) -> list[dict[str, Any]]:
    """``count`` overwrite items of probe seed ``seed`` with distinct fact sentences, none in
    ``avoid``; each gains ``stem`` and ``sentence`` (the fact sentence alone)."""
    from lit_rlhf.data.probes import make_probes

    out: list[dict[str, Any]] = []
    seen = set(avoid)
    for item in make_probes("overwrite", 4 * count, seed=seed):
        stem = fact_stem(item)
        sentence = f"{stem} {item['fact']}."
        if sentence not in seen:
            seen.add(sentence)
            out.append({**item, "stem": stem, "sentence": sentence})
    if len(out) < count:
        raise SystemExit(f"probe seed {seed}: {len(out)} distinct fact sentences, need {count}")
    return out[:count]


@functools.cache
def subject_values() -> dict[str, list[str]]:
    """Each subject's prior and counterfactual values, as the probe generator draws them."""
    from lit_rlhf.data.probes import make_probes

    values: dict[str, set[str]] = {}
    for item in make_probes("overwrite", 4000, seed=PLANT_SEED - 1):
        values.setdefault(item["subject"], {item["prior"]}).add(item["fact"])
    return {subject: sorted(v) for subject, v in values.items()}


def plant_rows(items: list[dict[str, Any]], twin: str, seed: int) -> list[dict[str, str]]:
    """SFT rows ``{prompt: stem, response: " value."}``: the prior value (``planted``), or the
    subject's values (prior and counterfactuals) in turn, shuffled (``twin``)."""
    rng = random.Random(seed)
    rows = []
    for k, item in enumerate(items):
        values = subject_values()[item["subject"]]
        value = item["prior"] if twin == "planted" else values[k % len(values)]
        rows.append({"prompt": item["stem"], "response": f" {value}."})
    rng.shuffle(rows)
    return rows


def plant(s: dict[str, Any], twin: str, seed: int, out: Path) -> Path:
    """The ``twin``'s 10-layer compressor LM after its plain-LM steps (cached HF folder)."""
    folder = out / f"seed{seed}" / twin / "lm"
    if (folder / "config.json").exists():
        return folder
    import lightning as L

    from lit_rlhf.data import SFTDataModule
    from lit_rlhf.modules import SFTModule
    from lit_rlhf.settings import OptimSettings

    cut = cut_model(s, out)
    items = fact_items(s["plant_sentences"], PLANT_SEED + seed)
    rows = out / f"seed{seed}" / twin / "plant.jsonl"
    rows.parent.mkdir(parents=True, exist_ok=True)
    rows.write_text("".join(json.dumps(r) + "\n" for r in plant_rows(items, twin, seed)))
    L.seed_everything(seed, verbose=False)
    data = SFTDataModule(tokenizer=str(cut), train=str(rows), batch_size=s["plant_batch"],
                         chat_template=False, seed=seed, max_length=64)  # fmt: skip
    module = SFTModule(model=str(cut), tokenizer=data.tokenizer, export_dir=str(folder),
                       optim=OptimSettings(lr=s["plant_lr"], max_grad_norm=1.0))  # fmt: skip
    L.Trainer(accelerator="cpu", devices=1, max_steps=s["plant_steps"], logger=False,
              enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False).fit(module, datamodule=data)  # fmt: skip
    return folder


def cut_model(s: dict[str, Any], out: Path, layers: int | None = None, name: str = "cut") -> Path:
    """The compressor LM cut to ``layers`` layers (default ``s["layers"]``), saved once as the
    folder ``out / name`` with its tokenizer."""
    from lit_rlhf.models.loading import load_causal_lm, load_tokenizer

    cut = out / name
    if not (cut / "config.json").exists():
        num_layers = s["layers"] if layers is None else layers
        load_causal_lm(s["compressor"], num_layers=num_layers).save_pretrained(cut)
        load_tokenizer(s["compressor"]).save_pretrained(cut)
    return cut


def lm_margins(folder: Path, items: list[dict[str, Any]]) -> list[float]:
    """The plain LM's log p(prior) - log p(fact) after each item's stem (cached in the LM's
    folder per item set: every snapshot of a compressor shares its LM's prior)."""
    from lit_rlhf.models.loading import load_causal_lm, load_tokenizer

    key = hashlib.sha256(json.dumps([i["sentence"] for i in items]).encode()).hexdigest()[:16]
    path = folder / f"lm_margins-{key}.json"
    if path.exists():
        return list(json.loads(path.read_text()))
    margins = prior_margins(load_causal_lm(str(folder)).eval(), load_tokenizer(str(folder)), items)
    path.write_text(json.dumps(margins) + "\n")
    return margins


def memory_margins(module: Any, items: list[dict[str, Any]]) -> list[float]:
    """Per item, reading the fact sentence's memory: log p(" prior") - log p(" fact") at the
    value slot after the stem (the decoder, teacher-forced, summed over the value's tokens)."""
    tok, margins = module.tokenizer, []
    contexts = [i["sentence"] for i in items]
    scores = {}
    for key in ("prior", "fact"):
        targets = [f"{i['stem']} {i[key]}" for i in items]
        scores[key] = module.target_log_probs(contexts, targets)
    for k, item in enumerate(items):
        diff = 0.0
        for key, sign in (("prior", 1.0), ("fact", -1.0)):
            value = tok(" " + item[key], add_special_tokens=False)["input_ids"]
            whole = tok(f"{item['stem']} {item[key]}", add_special_tokens=False)["input_ids"]
            if whole[-len(value) :] != value:  # the value's tokens must end the target
                raise ValueError(f"{item[key]!r} is tokenized differently after {item['stem']!r}")
            diff += sign * float(scores[key][k][-len(value) :].sum())
        margins.append(diff)
    return margins


def compress(s: dict[str, Any], lm: Path, train_seed: int, evaluation: list[dict[str, Any]],
             folder: Path) -> dict[str, Any]:  # fmt: skip
    """Train a compressor from the LM folder ``lm`` on one-sentence facts of probe seed
    ``train_seed`` (none an evaluation sentence); its figures on ``evaluation`` (cached)."""
    path = folder / "figures.json"
    if path.exists():
        return dict(json.loads(path.read_text()))
    from repro.compression_runs import no_memory_loss

    avoid = {i["sentence"] for i in evaluation}
    train = fact_items(s["train_facts"], train_seed, avoid)  # epochs over them
    sentences = [i["sentence"] for i in evaluation]
    train_path = write_passages(folder / "train.jsonl", [i["sentence"] for i in train])
    val_path = write_passages(folder / "eval.jsonl", sentences)
    run = cpu_run({**s, "compressor": str(lm)}, 0, train_path, val_path)
    run["model"]["compressor_layers"] = None  # the folder holds the cut model already
    flush_denormals()
    captured: dict[str, Any] = {}
    result = train_and_evaluate(run, train_seed, s["probes"], EVAL_SEED, keep=captured)
    module = captured["module"]
    figures = {
        "memory_gain": result["metrics"].get("val/memory_gain", math.nan),
        "val_ae_loss": result["metrics"].get("val/ae_loss", math.nan),
        "no_memory_loss": no_memory_loss(module.decoder, module.tokenizer, sentences),
        "train_seconds": result["train_seconds"],
        "margins": memory_margins(module, evaluation),
        "lm_margins": lm_margins(lm, evaluation),
    }
    path.write_text(json.dumps(figures, indent=1) + "\n")
    return figures


def pilot(s: dict[str, Any], out: Path, steps: list[int], path: Path) -> dict[str, Any]:
    """The development pilot that sized the compressor training (docs/compressor.md): the
    unplanted cut trained for each of ``steps`` on seed 3001's facts, read on 48 facts of seed
    3000 that are no evaluation sentence (neither seed is the evaluation's, the planting's or
    the training's)."""
    evaluation = {i["sentence"] for i in fact_items(s["eval_facts"], EVAL_SEED)}
    dev = fact_items(min(48, s["eval_facts"]), 3000, evaluation)
    runs = {}
    for n in steps:
        f = compress({**s, "steps": n}, cut_model(s, out), 3001, dev, out / "pilot" / f"{n}")
        runs[str(n)] = {k: v for k, v in f.items() if not k.endswith("margins")}
        runs[str(n)]["margin_mean"] = _mean(f["margins"])
    record = {"settings": s, "commit": git_commit(), "steps": runs}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("pilot:", json.dumps(runs))
    return record


def verdict(seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The gates, then the primary: planted - twin overwrite margin, paired by fact, pooled over
    seeds, with a bootstrap over facts (clustered: a fact's seeds move together)."""
    gates: dict[str, Any] = {}
    for key, run in seeds.items():
        p, t = run["planted"], run["twin"]
        gates[key] = {
            "plant_margin": _mean(p["lm_margins"]) - _mean(t["lm_margins"]),
            "memory_gain": [p["memory_gain"], t["memory_gain"]],
        }
    passes = all(
        g["plant_margin"] >= GATES["plant_margin"]
        and min(g["memory_gain"]) > GATES["memory_gain"]
        and abs(g["memory_gain"][0] - g["memory_gain"][1]) <= GATES["equal_gain"]
        for g in gates.values()
    )
    per_fact = [
        _mean([r["planted"]["margins"][k] - r["twin"]["margins"][k] for r in seeds.values()])
        for k in range(len(next(iter(seeds.values()))["planted"]["margins"]))
    ]
    boot, t_int = bootstrap_interval(per_fact, -math.inf, math.inf), Interval.of(per_fact)
    shows = "shown" if boot.low > 0 else "opposite" if boot.high < 0 else "not shown"
    return {"gates": gates, "passes": passes, "per_fact": per_fact, "mean": boot.mean,
            "bootstrap_95": [boot.low, boot.high], "t_95": [t_int.low, t_int.high],
            "verdict": shows if passes else f"gate fails (read: {shows})"}  # fmt: skip


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument(
        "--pilot",
        type=int,
        nargs="+",
        metavar="STEPS",
        help="the development pilot alone, at these step counts",
    )
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="these seeds only (a partial record: no verdict below the registered "
                        "seeds)")  # fmt: skip
    parser.add_argument("--root", type=Path, default=ROOT / "runs" / "reproduce" / "planted")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "compressor_planted.json")
    opts = parser.parse_args(argv)
    s = settings(opts.smoke)
    registered = list(s["seeds"])
    if opts.seeds:
        s["seeds"] = list(opts.seeds)
    out = opts.root / ("smoke" if opts.smoke else "cpu")
    if opts.pilot:
        return pilot(s, out, opts.pilot, opts.out.with_name(opts.out.stem + "_pilot.json"))
    evaluation = fact_items(s["eval_facts"], EVAL_SEED)
    seeds: dict[str, dict[str, Any]] = {}
    for seed in s["seeds"]:
        seeds[str(seed)] = {
            twin: compress(s, plant(s, twin, seed, out), TRAIN_SEED + seed, evaluation,
                           out / f"seed{seed}" / twin)
            for twin in TWINS
        }  # fmt: skip
        gains = {t: round(f["memory_gain"], 3) for t, f in seeds[str(seed)].items()}
        print(f"seed {seed}: memory gain {gains}", flush=True)
    record: dict[str, Any] = {"settings": s, "gates_registered": GATES, "commit": git_commit(),
              "evaluation": [i["sentence"] for i in evaluation], "seeds": seeds,
              "primary": verdict(seeds)}  # fmt: skip
    if not set(registered) <= set(s["seeds"]):
        missing = sorted(set(registered) - set(s["seeds"]))
        record["primary"]["verdict"] = f"none yet: seeds {missing} of {registered} not run"
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
    primary: dict[str, Any] = record["primary"]
    summary = {k: v for k, v in primary.items() if k != "per_fact"}
    print("primary:", json.dumps(summary))
    return record


if __name__ == "__main__":
    main()
