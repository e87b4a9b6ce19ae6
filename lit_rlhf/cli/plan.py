"""``lit-rlhf plan --config RUN.yaml [--config FRAGMENT.yaml] [--gpus N] [--gpu-memory 80GiB]
[--arch PATH=HUB_ID] [--json]``: the per-GPU memory plan, the batch figures, the update step's
FLOPs and a verdict of a run, before anything loads and without the hub.

The configs are parsed and composed as ``lit-rlhf fit`` does (the same parser, every default
filled in, ``--model.*`` / ``--data.*`` / ``--trainer.*`` overrides), and nothing is built: no
model, tokenizer or dataset is loaded (:func:`lit_rlhf.plan.report.plan_from_config`).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

import yaml

from lit_rlhf.cli.app import LitRLHFCLI, cli_main
from lit_rlhf.errors import config_refusal
from lit_rlhf.plan.architectures import exported_models
from lit_rlhf.plan.report import format_plan, parse_memory, plan_from_config, plan_json

_DESCRIPTION = (
    "Print what each GPU of a run will hold (model states by strategy, frozen networks, the "
    "weight-sync snapshot, the engine, one micro-batch's activations), by phase, the batch "
    "figures and a verdict, from the --config files alone: lit-rlhf plan --config RUN.yaml "
    "[--gpus N] [--gpu-memory 80GiB]."
)
_OPTIONS: list[tuple[list[str], dict[str, Any]]] = [
    (["--gpus"], dict(type=int, default=None,
                      help="GPUs (processes) per node; default: trainer.devices.")),
    (["--gpu-memory", "--gpu_memory"], dict(default="80GiB", dest="gpu_memory",
        help="Memory of one GPU: 80GiB (default), 141GB, 80000MB or bytes (GB = 10^9, "
             "GiB = 2^30).")),
    (["--arch"], dict(action="append", default=[],
        help="PATH=HUB_ID: plan the local model folder PATH (without a config.json) as the "
             "architecture of HUB_ID; repeat for several.")),
    (["--json"], dict(action="store_true", help="Print the plan as JSON.")),
]  # fmt: skip


class PlanCLI(LitRLHFCLI):
    """The training CLI's parser (no subcommand); the classes are never instantiated."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        super().add_arguments_to_parser(parser)
        parser.description = _DESCRIPTION
        parser.prog = "lit-rlhf plan"
        for names, spec in _OPTIONS:  # shown by --help; parsed by plan_options
            kwargs = {k: v for k, v in spec.items() if k in ("help", "default")}
            if spec.get("action") == "store_true":
                kwargs["type"] = bool
            elif names[0] == "--arch":
                kwargs["type"] = list[str]
            else:
                kwargs["type"] = spec.get("type", str) | None
            parser.add_argument(names[0], **kwargs)

    def instantiate_classes(self) -> None:  # the plan reads the parsed config only
        return

    def after_instantiate_classes(self) -> None:
        return


def plan_options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The plan's own options, and the rest of ``argv`` for the training parser."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for names, spec in _OPTIONS:
        parser.add_argument(*names, **spec)
    return parser.parse_known_args(argv)


def arch_map(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        path, sep, hub_id = pair.partition("=")
        if not sep or not path or not hub_id:
            raise ValueError(
                f"--arch {pair!r} is not PATH=HUB_ID. Fix: e.g. --arch "
                "runs/rm_ultrafeedback/hf=Qwen/Qwen2.5-1.5B-Instruct."
            )
        out[path] = hub_id
    return out


def composed_config(argv: list[str]) -> dict[str, Any]:
    """The config ``lit-rlhf fit ARGV`` would run, as a plain dict (nothing instantiated)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = cli_main(argv, run=False, cli_class=PlanCLI)
    text = cli.parser.dump(cli.config, skip_none=False, skip_check=True)
    config = yaml.safe_load(text)
    return {k: config.get(k) for k in ("trainer", "model", "data")}


def plan_main(args: list[str] | None = None) -> int:
    """``lit-rlhf plan ARGS`` (``args`` after ``plan``); prints the plan, returns 0."""
    argv = sys.argv[2:] if args is None else list(args)
    if any(a in ("-h", "--help") for a in argv):
        composed_config(argv)  # LightningCLI prints the help (with the plan's options), exits
    options, rest = plan_options(argv)
    config = composed_config(rest)
    try:
        if options.gpus is not None and options.gpus < 1:
            raise ValueError(f"--gpus {options.gpus}: at least 1. Fix: --gpus N with N >= 1.")
        known = {**default_arch_map(rest), **arch_map(options.arch)}
        plan = plan_from_config(config, gpus=options.gpus, gpu_memory=parse_memory(
            options.gpu_memory), arch_map=known)  # fmt: skip
    except (ValueError, TypeError) as err:
        refusal = config_refusal(err)  # "... Fix: ...": one line (lit-rlhf's entry point)
        if refusal is None:
            raise
        raise refusal from err
    print(plan_json(plan) if options.json else format_plan(plan))
    return 0


def default_arch_map(argv: list[str]) -> dict[str, str]:
    """{folder: model} of the folders the presets beside the ``--config`` files export."""
    configs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    return exported_models(configs)
