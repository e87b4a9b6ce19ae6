"""The judge pieces ConsistRM's and ReflectRM's reproductions share (``scripts/repro/consistrm.py``,
``scripts/repro/reflectrm.py``): arithmetic pairs with a short checkable analysis, the disjoint
pools (warm start / unlabelled / held-out), the supervised warm start of the judge (our
deviation: at 135M parameters the judge starts at chance, so it is first fine-tuned on a small
labelled set, ``lit_rlhf.modules.SFTModule``), and the inference figures of one judge on a pool:
greedy, majority-of-N and reflective-of-N from ONE set of N samples per pair (ReflectRM arXiv
2604.07506), the anchor's accuracy against a random sample's, positional consistency, and the
pseudo-label a seeded ConsistRM memory gives (arXiv 2604.07484).

The judgment format (template ``analysis-short-v1``, tags Analysis, Result)::

    <Analysis>Response 1 says 42. Response 2 says 44. 17 + 25 = 42, as Response 1 says.</Analysis>
    <Result>Response 1 is better than Response 2</Result>

Every claim in the analysis is checkable against the pair, and the verdict follows from it.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_rlhf.algos.consistency import pseudo_label
from lit_rlhf.data.judge_templates import render_judge_prompt, render_reflection_prompt

TEMPLATE = "analysis-short-v1"
CRITIQUE_TEMPLATE = "analysis-critique-short-v1"
TAGS = ("Analysis", "Result")
OFFSETS = (-3, -2, -1, 1, 2, 3)  # how far the wrong answer is from the right one


@dataclass(frozen=True)
class ArithPair:
    """``a op b``: the right value against a wrong one; ``right_first``: response 1 is right."""

    pair_id: str
    a: int
    op: str
    b: int
    wrong: int
    right_first: bool

    @property
    def expr(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def right(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def values(self) -> tuple[int, int]:
        """The values responses 1 and 2 state."""
        return (self.right, self.wrong) if self.right_first else (self.wrong, self.right)

    @property
    def label(self) -> int:
        """-1: response 1 is better, +1: response 2 (the judge templates' convention)."""
        return -1 if self.right_first else 1


def make_pools(
    sizes: Mapping[str, int], *, seed: int, max_value: int, exclude: Set[tuple] = frozenset()
) -> dict[str, list[ArithPair]]:
    """Disjoint pools of distinct questions (``a op b`` appears in at most one pool, and never
    when in ``exclude``), each with balanced positions of the right answer by a seeded coin."""
    rng = random.Random(f"judge-pools/{seed}")
    space = [(a, op, b) for a in range(1, max_value + 1) for b in range(1, max_value + 1)
             for op in "+-" if (a, op, b) not in exclude]  # fmt: skip
    need = sum(sizes.values())
    if need > len(space):
        raise ValueError(f"pools need {need} distinct questions; max_value={max_value} has "
                         f"{len(space)}. Fix: raise max_value or shrink the pools.")  # fmt: skip
    questions = rng.sample(space, need)
    pools, start = {}, 0
    for name, size in sizes.items():
        pools[name] = [
            ArithPair(f"{name}-{i}", a, op, b, _wrong(rng, a, op, b), rng.random() < 0.5)
            for i, (a, op, b) in enumerate(questions[start : start + size])
        ]
        start += size
    return pools


def _wrong(rng: random.Random, a: int, op: str, b: int) -> int:
    return (a + b if op == "+" else a - b) + rng.choice(OFFSETS)


def pair_record(pair: ArithPair) -> dict[str, Any]:
    """The pair as a row of ``PreferencePairs(schema="pairs", id_field="id")``."""
    v1, v2 = pair.values
    return {"id": pair.pair_id, "prompt": f"What is {pair.expr}?",
            "response_1": f"{pair.expr} = {v1}", "response_2": f"{pair.expr} = {v2}",
            "label": pair.label, "subset": "arithmetic"}  # fmt: skip


def write_pairs(pairs: Sequence[ArithPair], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(pair_record(p)) + "\n" for p in pairs))
    return path


def analysis(pair: ArithPair, *, swapped: bool = False, value: int | None = None) -> str:
    """The checkable analysis of the pair as shown (``swapped``: response 2 first), stating
    ``value`` as the checked result (default: the right one)."""
    v1, v2 = pair.values[::-1] if swapped else pair.values
    checked = pair.right if value is None else value
    # the conclusion names the response that states the checked value, right before the
    # verdict: the verdict then copies it (a 135M judge did not learn to match the values
    # itself: the third pre-check, docs/history/grm.md)
    said = "Response 1" if v1 == checked else "Response 2" if v2 == checked else "neither"
    return f"Response 1 says {v1}. Response 2 says {v2}. {pair.expr} = {checked}, as {said} says."


def judgment(pair: ArithPair, *, swapped: bool = False) -> str:
    """The target judgment (analysis, then the verdict it implies)."""
    first_right = pair.right_first != swapped
    result = "Response 1 is better than Response 2" if first_right else (
        "Response 2 is better than Response 1")  # fmt: skip
    return f"<Analysis>{analysis(pair, swapped=swapped)}</Analysis><Result>{result}</Result>"


def planted_judgment(pair: ArithPair) -> str:
    """A judgment whose analysis checks the wrong value, its verdict following it: the planted
    wrong analysis of the stage-2 experiment (scripts/repro/reflectrm_planted.py)."""
    result = "Response 2 is better than Response 1" if pair.right_first else (
        "Response 1 is better than Response 2")  # fmt: skip
    return f"<Analysis>{analysis(pair, value=pair.wrong)}</Analysis><Result>{result}</Result>"


def reflection_row(pair: ArithPair, rng: random.Random) -> dict[str, str]:
    """One analysis-preference SFT row: the right analysis against one that checks a wrong
    value, in a random order; the target names the values each critique checks."""
    good = f"<Analysis>{analysis(pair)}</Analysis>"
    bad = f"<Analysis>{analysis(pair, value=pair.wrong)}</Analysis>"
    good_first = rng.random() < 0.5
    c1, c2 = (good, bad) if good_first else (bad, good)
    r1, r2 = (f"{pair.expr} = {v}" for v in pair.values)
    prompt = render_reflection_prompt(CRITIQUE_TEMPLATE, prompt=f"What is {pair.expr}?",
                                      response_1=r1, response_2=r2, critique_1=c1,
                                      critique_2=c2)  # fmt: skip
    k1, k2 = (pair.right, pair.wrong) if good_first else (pair.wrong, pair.right)
    result = "Critique 1 is better than Critique 2" if good_first else (
        "Critique 2 is better than Critique 1")  # fmt: skip
    text = (f"Critique 1 checks {k1}. Critique 2 checks {k2}. {pair.expr} = {pair.right}, as "
            f"Critique {1 if good_first else 2} checks.")  # fmt: skip
    return {"prompt": prompt, "response": f"<Analysis>{text}</Analysis><Result>{result}</Result>"}


def warm_start_rows(
    pairs: Sequence[ArithPair], *, reflection_every: int, seed: int
) -> list[dict[str, str]]:
    """SFT rows (``{"prompt", "response"}``) of the warm start: every pair in both orders
    (response preference) and, for every ``reflection_every``-th pair, one analysis-preference
    row (ReflectRM's 4 : 1 mix is ``reflection_every=2``: two preference rows per pair)."""
    rng = random.Random(f"warm-start/{seed}")
    rows = []
    for i, pair in enumerate(pairs):
        r1, r2 = (f"{pair.expr} = {v}" for v in pair.values)
        for swapped in (False, True):
            a, b = (r2, r1) if swapped else (r1, r2)
            prompt = render_judge_prompt(TEMPLATE, prompt=f"What is {pair.expr}?",
                                         response_1=a, response_2=b)  # fmt: skip
            rows.append({"prompt": prompt, "response": judgment(pair, swapped=swapped)})
        if reflection_every and i % reflection_every == 0:
            rows.append(reflection_row(pair, rng))
    rng.shuffle(rows)
    return rows


def warm_rows(pairs: Sequence[ArithPair], settings: Mapping[str, Any]) -> list[dict[str, str]]:
    """The warm start's SFT rows for ``settings["judge_style"]``: ``checked`` (default: one
    target per row, :func:`warm_start_rows`) or ``varied`` (:mod:`repro.judge_varied`)."""
    from repro.judge_varied import fact_rows, varied_rows

    style = settings.get("judge_style", "checked")
    if style == "varied":
        rows = varied_rows(pairs, lazy_copies=settings["lazy_copies"], seed=0)
    elif style == "checked":
        rows = warm_start_rows(pairs, reflection_every=settings["reflection_every"], seed=0)
    else:
        raise ValueError(f"judge_style {style!r} is not one of 'checked', 'varied'")
    copies = settings.get("fact_copies", 0)  # a judge trained from random weights
    return rows + fact_rows(settings["max_value"], copies) if copies else rows


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(dict(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ inference figures
@dataclass(frozen=True)
class Judged:
    """One row judged: its family (the pair), gold label, the greedy verdict, the N sampled
    verdicts (None: unreadable), the reflective verdict and the anchor's index."""

    family: str
    label: int
    greedy: int | None
    votes: tuple[int | None, ...]
    reflective: int
    anchor: int | None
    query_id: str = ""


def majority(votes: Sequence[int | None]) -> int:
    """The majority of the readable votes; 0 on a tie or none."""
    total = sum(v for v in votes if v is not None)
    return (total > 0) - (total < 0)


def _consistency(correct: Mapping[str, list[bool]]) -> float:
    """The share of pairs (families) judged right in every order they were shown in."""
    return statistics.fmean(all(v) for v in correct.values()) if correct else float("nan")


def inference_figures(judged: Sequence[Judged]) -> dict[str, float]:
    """Accuracy and positional consistency of greedy, majority-of-N and reflective-of-N (all
    from the same N samples), the anchor's accuracy, a random sample's expected accuracy (the
    mean over samples; an unreadable one counts wrong), the format-valid rate of the samples
    and the first-position rate of greedy (how often it says response 1)."""
    by: dict[str, dict[str, list[bool]]] = {k: {} for k in ("greedy", "majority", "reflective")}
    anchor: list[bool] = []
    sample: list[float] = []
    valid: list[bool] = []
    first: list[bool] = []
    for j in judged:
        picks = {"greedy": j.greedy, "majority": majority(j.votes), "reflective": j.reflective}
        for name, verdict in picks.items():
            by[name].setdefault(j.family, []).append(verdict == j.label)
        if j.anchor is not None:
            anchor.append(j.votes[j.anchor] == j.label)
        sample.append(statistics.fmean(v == j.label for v in j.votes) if j.votes else 0.0)
        valid.extend(v is not None for v in j.votes)
        first.append(j.greedy == -1)
    out: dict[str, float] = {}
    for name, fams in by.items():
        out[f"{name}_accuracy"] = statistics.fmean(x for v in fams.values() for x in v)
        out[f"{name}_consistency"] = _consistency(fams)
    out["anchor_accuracy"] = statistics.fmean(anchor) if anchor else float("nan")
    out["random_sample_accuracy"] = statistics.fmean(sample)
    out["format_valid"] = statistics.fmean(valid) if valid else float("nan")
    out["greedy_first_rate"] = statistics.fmean(first)
    return out


def seeded_pseudo_accuracy(
    seeds: Sequence[Sequence[int | None]], online: Sequence[Sequence[int | None]],
    labels: Sequence[int],
) -> dict[str, float]:  # fmt: skip
    """ConsistRM's first pseudo-label of each query, ``sign(s_on + s_mem)`` with the memory
    seeded from ``seeds`` (the warm judge's votes) and ``online`` this round's votes: its
    accuracy against gold over the queries it supervises, and the supervised share."""
    ys = [pseudo_label(on, [v for v in seed if v is not None])
          for seed, on in zip(seeds, online, strict=True)]  # fmt: skip
    judged = [y == g for y, g in zip(ys, labels, strict=True) if y != 0]
    return {
        "pseudo_label_accuracy": statistics.fmean(judged) if judged else float("nan"),
        "pseudo_label_supervised": len(judged) / max(1, len(ys)),
    }


# ------------------------------------------------------------------ running the judge
WARM_KEYS = ("model", "sft_config", "max_value", "pools", "sft_steps", "sft_lr", "sft_batch_size",
             "reflection_every")  # fmt: skip


def warm_dir(out: Path, settings: Mapping[str, Any]) -> Path:
    """The warm judge's folder, shared by the ConsistRM and ReflectRM presets under one output
    root (``<root>/<paper>/<preset>`` -> ``<root>/judge-warm/<hash>``): the hash covers exactly
    the settings that make the warm judge (``WARM_KEYS``) and the judgment format (one pair's
    target judgment and reflection row), so both papers reuse one SFT run and a change of the
    format in this file trains a new judge."""
    import hashlib

    probe = ArithPair("format", 17, "+", 25, 44, right_first=True)
    fmt = judgment(probe) + reflection_row(probe, random.Random(0))["response"]
    keyed = {k: settings[k] for k in WARM_KEYS}
    if settings.get("judge_style", "checked") != "checked":  # the cpu preset's key unchanged
        from repro.judge_varied import format_probe

        fmt += format_probe(probe)
        keyed.update(judge_style=settings["judge_style"], lazy_copies=settings["lazy_copies"])
    keyed.update({k: settings[k] for k in ("fact_copies", "max_length") if k in settings})
    key = json.dumps({**keyed, "format": fmt}, sort_keys=True)
    return out.parent.parent / "judge-warm" / hashlib.sha256(key.encode()).hexdigest()[:12]


def warm_judge(out: Path, settings: Mapping[str, Any]) -> str:
    """The warm judge's HF folder (see ``warm_dir``)."""
    return str(warm_dir(out, settings) / "warm-judge")


def check_new_tokens(rows: Sequence[Mapping[str, str]], settings: Mapping[str, Any]) -> int:
    """The longest target judgment in the model's tokens; refuses a ``max_new_tokens`` that
    would cut it (every sampled judgment would then be unreadable, accuracy 0 for a reason
    in the preset, not the judge). Tokenizer only: runs before any model loads."""
    from lit_rlhf.models.loading import load_tokenizer

    tokenizer = load_tokenizer(settings["model"])
    longest = max(len(tokenizer(r["response"], add_special_tokens=False)["input_ids"])
                  for r in rows)  # fmt: skip
    if settings["max_new_tokens"] < longest:
        raise ValueError(
            f"max_new_tokens={settings['max_new_tokens']} is below the longest target judgment "
            f"({longest} tokens of {settings['model']}): every judgment would be cut before "
            f"its verdict. Fix: set max_new_tokens >= {longest}."
        )
    return longest


def warm_start(
    out: Path, pairs: Sequence[ArithPair], settings: Mapping[str, Any], log: Any = print
) -> tuple[Path, float]:
    """The warm judge: ``SFTModule`` (``settings["sft_config"]``) fine-tuned on the warm
    pool's judgments, exported to ``warm_dir(out, settings)/warm-judge`` (a HF folder) and
    reused when there; returns (folder, seconds spent now: 0 when reused)."""
    from repro.runs import sft_export

    rows = warm_rows(pairs, settings)
    # the smoke's random tiny model writes no judgment at all: only the presets need the check
    longest = check_new_tokens(rows, settings) if settings["full_judgments"] else 0
    root = warm_dir(out, settings)
    if not (root / "warm-judge" / "config.json").exists():
        log(f"warm start: {len(rows)} SFT rows (targets up to {longest} tokens), "
            f"{settings['sft_steps']} steps -> {root / 'warm-judge'}")  # fmt: skip
    return sft_export(rows, root, dict(settings), in_process=settings["in_process"])


def _pair_source(path: Path) -> Any:
    from lit_rlhf.data import PreferencePairs

    return PreferencePairs(str(path), schema="pairs", template=TEMPLATE, swap="both",
                           id_field="id")  # fmt: skip


def judge_module(
    model: str,
    *,
    samples: int,
    seed: int,
    max_new_tokens: int,
    reflective: bool = True,
    temperature: float = 1.0,
) -> Any:
    """A ``GenerativeRewardModule`` reading this format, judging by reflective-of-``samples``
    (or majority-of-``samples`` when not ``reflective``; ``samples == 1``: one greedy
    judgment); samples are drawn at ``temperature``."""
    from lit_rlhf.modules import GenerativeRewardModule
    from lit_rlhf.rollout.hf import HFGenerationEngine

    engine = HFGenerationEngine(max_new_tokens=max_new_tokens, temperature=temperature)
    inference = "single" if samples == 1 else "reflective" if reflective else "majority"
    settings: dict[str, Any] = {  # plain dicts: the module coerces them to its settings groups
        "engine": engine, "update": {"seed": seed},
        "judge": {"eval_samples": samples, "inference": inference,
                  "critique_template": CRITIQUE_TEMPLATE, "tags": TAGS},
    }  # fmt: skip
    return GenerativeRewardModule(model=model, **settings)


def predict_pool(
    model: str, pairs_path: Path, *, samples: int, seed: int, max_new_tokens: int,
    batch_size: int, reflective: bool = True, temperature: float = 1.0, accelerator: str = "cpu",
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:  # fmt: skip
    """Every row of the pool (each pair in both orders) judged in-process: the predictions
    (``query_id``, ``votes``, ``verdict``, ``anchor``) and the rows by query id."""
    import lightning as L

    from lit_rlhf.data import PromptDataModule

    source = _pair_source(pairs_path)
    rows = {str(r["query_id"]): dict(r) for r in source.load()}
    dm = PromptDataModule(tokenizer=model, train=source, test=source, batch_size=batch_size,
                          shuffle=False)  # fmt: skip
    module = judge_module(model, samples=samples, seed=seed, max_new_tokens=max_new_tokens,
                          reflective=reflective, temperature=temperature)  # fmt: skip
    L.seed_everything(seed, verbose=False)
    trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False)  # fmt: skip
    predictions = trainer.predict(module, datamodule=dm) or []
    return [p for batch in predictions for p in batch], rows


def judge_pool(
    model: str, pairs_path: Path, *, samples: int, seed: int, max_new_tokens: int,
    batch_size: int = 16, accelerator: str = "cpu",
) -> list[Judged]:  # fmt: skip
    """Greedy and reflective-of-``samples`` judgments of every row (one set of samples: the
    majority is taken from the same votes the reflection uses)."""
    kw: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "accelerator": accelerator,
    }
    greedy, rows = predict_pool(model, pairs_path, samples=1, seed=seed, **kw)
    sampled, _ = predict_pool(model, pairs_path, samples=samples, seed=seed, **kw)
    first = {p["query_id"]: p["verdict"] for p in greedy}
    return [
        Judged(family=str(row["family_id"]), label=int(row["label"]),
               greedy=first[p["query_id"]] or None, votes=tuple(p["votes"]),
               reflective=int(p["verdict"]), anchor=p["anchor"], query_id=p["query_id"])
        for p in sampled
        for row in [rows[p["query_id"]]]
    ]  # fmt: skip


def judge_pool_cached(cache: Path, model: str, pairs_path: Path, **kw: Any) -> list[Judged]:
    """:func:`judge_pool`, its rows kept in ``cache`` (JSON) with what made them: the judge's
    folder, the pool's text and the options. A stopped run reuses them instead of judging the
    pool again; a different judge, pool or option judges afresh and overwrites the file."""
    import hashlib

    key = {"model": str(model), "pool_sha256": hashlib.sha256(pairs_path.read_bytes()).hexdigest(),
           "options": {k: kw[k] for k in sorted(kw)}}  # fmt: skip
    if cache.exists():
        record = json.loads(cache.read_text())
        if record.get("key") == key:
            return [Judged(**{**r, "votes": tuple(r["votes"])}) for r in record["rows"]]
    judged = judge_pool(model, pairs_path, **kw)
    cache.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**j.__dict__, "votes": list(j.votes)} for j in judged]
    partial = cache.with_suffix(".partial")
    partial.write_text(json.dumps({"key": key, "rows": rows}))
    partial.replace(cache)  # a kill mid-write leaves no half file behind
    return judged


def run_fit(configs: Sequence[Path], *, in_process: bool) -> float:
    """``lit-rlhf fit`` over ``configs``: a subprocess (the presets), or in this process (the
    smoke, where a fresh interpreter per run would cost more than the run); its wall time."""
    import time

    from repro.runs import cli_command, cli_in_process, run_timed

    if not in_process:
        return run_timed(cli_command("fit", list(configs)))
    start = time.perf_counter()
    cli_in_process("fit", configs)
    return time.perf_counter() - start
