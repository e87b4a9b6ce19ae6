"""Measure a preset's update step on this machine: the RL module of a composed config trains on
synthetic rollouts at the preset's shapes, on randomly initialised networks of the preset's
architectures (nothing downloaded, no generation), and the measured peak memory, step time,
tokens/s and MFU are written beside the plan's prediction.

    python -m lit_rlhf.measure --config configs/ppo/countdown_tre.yaml [--config frag.yaml]
        --out x.json [--sequences N] [--max-prompt P] [--max-response R] [--layers L] [--steps S]

What runs is the module's own update (``PolicyStep.prepare`` and ``PolicyStep.optimize``: the
old and reference log-probs, the critic's values, the clipped updates with the preset's
micro-batches, activation checkpointing, dtypes, ``trainer.precision`` and loss-term callbacks)
under a one-device Trainer with the preset's strategy. The models' ``from_pretrained`` is
replaced for the run by ``from_config`` on the device with the plan's architecture table
(:func:`lit_rlhf.plan.architectures.architecture`), so hub ids need no download. Each rollout
holds ``--sequences`` full-length responses (``max_prompt_length`` + ``max_new_tokens``, the
worst case the plan sizes), ``--sequences`` defaulting to two micro-batches: one optimizer step
per rollout; the first rollout allocates the optimizer's states and is not timed.

Not measured (stated in the JSON): the rollout phase (vLLM's weights, KV cache and sampling
dtype, the HF engine's generation), the reward models' forwards, and anything that needs more
than one process (ZeRO sharding over several GPUs: one GPU holds the unsharded states). The
prediction is the plan of the measured config on this device (the cut network with
``--layers``), its update phase without vLLM, reward models and embedders.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import torch

from lit_rlhf.plan.flops import device_peak_flops

UNMEASURED = [
    "the rollout phase: vLLM's weights, KV cache (gpu_memory_utilization, sleep mode) and "
    "sampling dtype, and HF generation (no generation runs here)",
    "reward models' and judges' forwards (rewards are synthetic)",
    "sharding over several processes (one device: ZeRO states are unsharded)",
]
# stand-ins replace these (multi-turn presets are measured as single-turn rollouts: no env)
_DROP = ("engine", "reward", "tokenizer", "environment", "env")


def compose(configs: list[str]) -> dict[str, Any]:
    """The composed config (``lit-rlhf fit --config ... --print_config``) as a dict."""
    import yaml

    args = [sys.executable, "-m", "lit_rlhf.cli", "fit"]
    for config in configs:
        args += ["--config", config]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([*args, "--print_config"], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise ValueError(f"composing {configs} failed:\n{out.stderr[-2000:]}")
    lines = out.stdout.splitlines()  # after any library's warnings printed to stdout
    start = next((i for i, line in enumerate(lines) if line[:1].isalpha()), 0)
    composed: dict[str, Any] = yaml.safe_load("\n".join(lines[start:]))
    return composed


def _get(tree: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or node.get(key) is None:
            return default
        node = node[key]
    return node


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set a key the composed config has (``--print_config`` writes every key out)."""
    *path, last = dotted.split(".")
    parent = _get(tree, ".".join(path))
    if isinstance(parent, dict) and last in parent:
        parent[last] = value


def data_tasks(config: dict[str, Any]) -> list[str]:
    """The task labels the training data's sources give (a multi-domain run's domains)."""
    found: set[str] = set()
    stack: list[Any] = [_get(config, "data.init_args.train")]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(v for k, v in node.items() if k == "task" and isinstance(v, str))
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return sorted(found)


def measured_config(config: dict[str, Any], opts: argparse.Namespace) -> dict[str, Any]:
    """The config the measurement runs: one device, on-policy, the response and prompt lengths
    capped by ``--max-response`` / ``--max-prompt``, a rollout of ``--sequences`` samples (whole
    prompt groups) updated in one optimizer step per PPO epoch."""
    config = copy.deepcopy(config)
    args = "model.init_args"
    group = int(_get(config, f"{args}.rollout.samples_per_prompt", 4))
    micro = int(_get(config, f"{args}.optim.micro_batch_size", 1))
    sequences = opts.sequences or 2 * micro
    prompts = max(1, -(-sequences // group), len(data_tasks(config)))  # a group per domain
    prompt_len = int(_get(config, "data.init_args.max_prompt_length", 64))
    response = int(_get(config, f"{args}.engine.init_args.max_new_tokens", 64))
    for key, value in {
        "trainer.devices": 1,
        "trainer.num_nodes": 1,
        "data.init_args.batch_size": prompts,
        "data.init_args.global_batch_size": None,
        "data.init_args.max_prompt_length": min(prompt_len, opts.max_prompt or prompt_len),
        f"{args}.engine.init_args.max_new_tokens": min(response, opts.max_response or response),
        f"{args}.update.mini_batch_size": prompts * group,
        f"{args}.update.global_mini_batch_size": None,
        f"{args}.rollout.max_staleness": 0,
        f"{args}.rollout.dynamic_sampling": False,
        f"{args}.eval.pass_metric": None,  # the synthetic rewards carry no info
    }.items():
        _set(config, key, value)
    return config


def _instantiate(spec: Any) -> Any:
    """An object from a ``{class_path, init_args}`` spec (nested specs too); other values as
    they are."""
    if isinstance(spec, list):
        return [_instantiate(item) for item in spec]
    if not (isinstance(spec, dict) and "class_path" in spec):
        return spec
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    kwargs = {k: _instantiate(v) for k, v in (spec.get("init_args") or {}).items()}
    return cls(**kwargs)


def _written(spec: Any) -> Any:
    """A strategy's spec without the defaults ``--print_config`` writes out as None and its
    ``timeout`` (a string there; the default stays)."""
    if not isinstance(spec, dict):
        return spec
    args = spec.get("init_args") or {}
    keep = {k: v for k, v in args.items() if v is not None and k != "timeout"}
    return {**spec, "init_args": keep}


def update_callbacks(specs: list[Any]) -> list[Any]:
    """The config's callbacks that take part in an update or are required by the module: loss
    terms, gradient hooks and reward terms (inert here: no rewards are computed). Loggers and
    plots are left out, and so is a callback that cannot be built here (its data missing)."""
    from lit_rlhf.training import protocols as p

    kinds = (p.PolicyLossTerm, p.GradientHook, p.TaskGradientHook, p.RewardTerm)
    kept = []
    for spec in specs:
        try:
            callback = _instantiate(spec)
        except Exception as err:
            print(f"measure: callback {spec.get('class_path')} left out: {err}", file=sys.stderr)
            continue
        if isinstance(callback, kinds):
            kept.append(callback)
    return kept


def run(config: dict[str, Any], opts: argparse.Namespace) -> list[dict[str, Any]]:
    """Fit the config's module on ``opts.steps`` synthetic rollouts; the recorded calls."""
    import lightning as L

    from lit_rlhf.measure.synthetic import (
        Recorder,
        StandInTokenizer,
        random_weights,
        synthetic_rollout,
    )
    from lit_rlhf.plan.architectures import architecture
    from lit_rlhf.rollout import HFGenerationEngine

    args = "model.init_args"
    trainer_cfg = config.get("trainer") or {}
    on_gpu = trainer_cfg.get("accelerator") == "gpu" and torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    group = int(_get(config, f"{args}.rollout.samples_per_prompt", 4))
    prompt_len = int(_get(config, "data.init_args.max_prompt_length"))
    response = int(_get(config, f"{args}.engine.init_args.max_new_tokens"))
    engine = HFGenerationEngine(
        max_new_tokens=response,
        temperature=float(_get(config, f"{args}.engine.init_args.temperature", 1.0)),
    )
    model_spec = config["model"]
    package, _, name = model_spec["class_path"].rpartition(".")
    module_cls = getattr(importlib.import_module(package), name)
    init = {k: _instantiate(v) for k, v in model_spec["init_args"].items() if k not in _DROP}
    extra = {"reward": lambda *a: None} if "reward" in model_spec["init_args"] else {}
    recorder = Recorder(device)
    with random_weights(device, opts.layers):
        module = module_cls(engine=engine, tokenizer=StandInTokenizer(), **extra, **init)
        vocab = architecture(str(init["model"])).vocab_size
        module.rl.collect = lambda mod, batch: synthetic_rollout(
            batch, group, prompt_len, response, vocab, device, data_tasks(config) or ["synthetic"]
        )
        module.rl.prepare = recorder.wrap("prepare", module.rl.prepare)
        module.rl.optimize = recorder.wrap("optimize", module.rl.optimize)
        callbacks = update_callbacks(trainer_cfg.get("callbacks") or [])
        trainer = L.Trainer(
            accelerator=device.type, devices=1, precision=trainer_cfg.get("precision", "32-true"),
            strategy=_instantiate(_written(trainer_cfg.get("strategy") or "auto")),
            max_epochs=1, limit_train_batches=opts.steps, logger=False, callbacks=callbacks,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        prompts = int(_get(config, "data.init_args.batch_size"))
        loader: Any = torch.utils.data.DataLoader(
            cast(Any, [str(i) for i in range(prompts * opts.steps)]), batch_size=prompts,
            collate_fn=lambda items: {"prompt": items, "row": [{} for _ in items]},
        )  # fmt: skip
        trainer.fit(module, loader)
    return recorder.calls


def shapes(config: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """What the measurement ran: the model, lengths, batch, checkpointing and dtypes."""
    args = "model.init_args"
    estimator = _get(config, f"{args}.advantage.estimator", "grpo")
    return {
        "module": config["model"]["class_path"],
        "model": _get(config, f"{args}.model"),
        "layers": layers,  # None: all of the model's
        "sequences": _get(config, "data.init_args.batch_size", 0)
        * _get(config, f"{args}.rollout.samples_per_prompt", 4),
        "prompt_len": _get(config, "data.init_args.max_prompt_length"),
        "response_len": _get(config, f"{args}.engine.init_args.max_new_tokens"),
        "micro_batch_size": _get(config, f"{args}.optim.micro_batch_size"),
        "micro_batch_tokens": _get(config, f"{args}.update.micro_batch_tokens"),
        "gradient_checkpointing": _get(config, f"{args}.precision.gradient_checkpointing", False),
        "dtype": _get(config, f"{args}.precision.dtype", "float32"),
        "trainer_precision": _get(config, "trainer.precision", "32-true"),
        "strategy": str(_get(config, "trainer.strategy.class_path", "auto")),
        "critic": _get(config, f"{args}.critic.kind") if estimator == "gae" else None,
        "reference": float(_get(config, f"{args}.kl.coef", 0.0)) > 0,
    }


def _median(values: list[Any]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def summary(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The timed updates (the first, which allocates the optimizer's states, is left out when
    there are more): peaks, memory held before the update, seconds, tokens/s and MFU."""
    optimize = [c for c in calls if c["phase"] == "optimize"]
    prepare = [c for c in calls if c["phase"] == "prepare"]
    timed = optimize[1:] or optimize
    peaks = [c["peak_bytes"] for c in timed if c["peak_bytes"] is not None]
    return {
        "updates_timed": len(timed),
        "update_peak_bytes": max(peaks) if peaks else None,
        "prepare_peak_bytes": max((c["peak_bytes"] or 0 for c in prepare), default=None) or None,
        "held_before_update_bytes": timed[-1]["held_bytes"] if timed else None,
        "update_s": _median([c["seconds"] for c in timed]),
        "tokens_per_s": _median([c.get("perf/tokens_per_s") for c in timed]),
        "mfu": _median([c.get("perf/mfu") for c in timed]),
    }


def predicted(config: dict[str, Any], layers: int | None) -> dict[str, Any]:
    """The plan of the measured config on this one device (``plan_from_config``; with
    ``layers``, of the cut network, through a folder holding its config.json), and its update
    phase without what the measurement does not build (vLLM, reward models, embedders)."""
    from lit_rlhf.plan.architectures import architecture
    from lit_rlhf.plan.memory import phase_bytes
    from lit_rlhf.plan.params import hf_config
    from lit_rlhf.plan.report import plan_from_config

    plan_config = copy.deepcopy(config)
    if layers is not None:
        arch = architecture(str(_get(config, "model.init_args.model")))
        cut = dataclasses.replace(arch, num_hidden_layers=min(layers, arch.num_hidden_layers))
        folder = Path(tempfile.mkdtemp(prefix="lit-rlhf-measure-"))
        (folder / "config.json").write_text(hf_config(cut).to_json_string())  # type: ignore[attr-defined]
        _set(plan_config, "model.init_args.model", str(folder))
    cuda = torch.cuda.is_available()
    memory = torch.cuda.get_device_properties(0).total_memory if cuda else None
    plan = plan_from_config(plan_config, gpus=1, gpu_memory=memory)
    built = [i for i in plan.items if i.kind != "engine"
             and (i.kind != "frozen" or i.name.startswith("reference"))]  # fmt: skip
    return {
        "update_bytes": phase_bytes(built, "update"),
        "left_out": [i.name for i in plan.items if i not in built],
        "verdict": plan.verdict,
        "plan": plan.as_dict(),
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lit_rlhf.measure", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--config", action="append", required=True, help="as lit-rlhf fit's")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--sequences", type=int, help="samples per rollout (2 micro-batches)")
    parser.add_argument("--max-prompt", type=int, help="cap on max_prompt_length (tokens)")
    parser.add_argument("--max-response", type=int, help="cap on max_new_tokens (tokens)")
    parser.add_argument("--layers", type=int, help="keep this many decoder layers (big models)")
    parser.add_argument("--steps", type=int, default=2, help="rollouts; the first is not timed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    record: dict[str, Any] = {"configs": opts.config, "unmeasured": UNMEASURED}
    try:
        config = measured_config(compose(opts.config), opts)
        record["shapes"] = shapes(config, opts.layers)
        record["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        given = _get(config, "model.init_args.update.device_peak_flops")
        record["device_peak_flops"] = device_peak_flops(record["device"], given)  # MFU's divisor
        try:
            record["predicted"] = predicted(config, opts.layers)
        except (ImportError, KeyError, TypeError, ValueError) as err:  # measure all the same
            record["predicted"] = {"unavailable": f"{type(err).__name__}: {err}"}
        calls = run(config, opts)
        record["measured"] = measured = summary(calls)
        if measured["update_peak_bytes"] and record["predicted"].get("update_bytes"):
            ratio = measured["update_peak_bytes"] / record["predicted"]["update_bytes"]
            record["measured_over_predicted"] = ratio
        record["calls"] = calls
        status = 0
    except Exception as err:  # out of memory included: written into the JSON
        record["error"] = f"{type(err).__name__}: {err}"[:2000]
        status = 1
    Path(opts.out).write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(json.dumps({k: record.get(k) for k in ("configs", "measured", "error")}, default=str))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
