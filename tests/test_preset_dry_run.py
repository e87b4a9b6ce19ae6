"""Preset dry run: every GPU preset builds and takes real optimizer steps on CPU, and every
setting of it equals the authors' recipe in docs/recipes.md unless that row lists a deviation.

The GPU presets are found, not listed: every ``configs/<family>/*.yaml`` whose header says GPUs
(``Hardware: ... GPU``) or whose trainer asks for ``accelerator: gpu``. A GPU preset without a
table in docs/recipes.md fails. Its header's ``--config configs/trainer/<fragment>.yaml`` (if any)
is composed after it, and the table's heading must name the same fragment.

For each preset (one test id per file, ``test_preset_dry_run[<file stem>]``):

1. Recipe: the config composed from the files (``lit-rlhf fit --config <preset> [--config
   <fragment>] --print_config``: every default filled in, before any override) is held to the
   table (:func:`tests.recipes.check_table`): each row's config value equals ``ours``, and ``ours``
   equals the authors' value unless the row gives a deviation reason; a row whose path is missing
   from the config fails.
2. Dry run: the composed config with the overrides of :data:`OVERRIDES` (and nothing else) is run
   with ``Trainer.fit`` in this process, for one training batch (two when the learning rate warms
   up from 0, so that one step is taken with a learning rate above 0). Asserted afterwards:
   the trainable weights moved (at least 90 % of the entries that the optimizer's first moment
   says were stepped changed: a 16-bit weight without float32 master copy loses such steps), the
   optimizer's parameters and Adam state (``exp_avg``, ``exp_avg_sq``) are float32 (under
   DeepSpeed: its float32 partitions), and ``train/lr`` is logged with the value the schedule
   must give at that step (warmup from 0 by ``lr_warmup_steps`` or ``int(lr_warmup_ratio x
   total)``, then constant / linear / cosine to ``min_lr_ratio x lr``; verl's shapes).

The overrides (:data:`OVERRIDES`; the same list is in docs/recipes.md's introduction):

- CPU: ``trainer.accelerator: cpu``, ``trainer.devices: 1``, ``num_nodes: 1``; a DeepSpeed
  fragment of the header is replaced by its CPU twin
  (``configs/trainer/cpu_deepspeed_zero2/3.yaml``: ``lit_rlhf.strategies.CPUDeepSpeedStrategy``,
  same stage, one process), ``strategy: ddp`` by one plain process. Precision stays as parsed.
- Tiny stand-ins: every model, tokenizer and embedder id (keys ``model``, ``tokenizer``,
  ``compressor``, ``decoder``, ``critic_model``, ``embedder``) becomes ``builtin:tiny-qwen2`` for
  a Qwen id, else ``builtin:tiny-llama``.
- Offline data: hub or missing files become the shipped samples (``lit_rlhf/data/samples/``):
  prompts by task (math, chat, ifeval), preference pairs (``reflectrm_copy.jsonl``,
  schema ``pairs``), text (``text_sample.jsonl``); procedural Countdown keeps its generator. At most
  16 rows per source.
- The HF engine (``HFGenerationEngine``) instead of vLLM, with the same ``temperature``,
  ``top_p`` and ``top_k`` (vLLM's -1 = HF's 0, both off).
- Capped lengths: ``max_new_tokens`` <= 16, ``max_prompt_length`` <= 768, other ``max_length``
  <= 1024, ``context_tokens`` <= 64, ``continuation_tokens`` <= 16 (the tiny models have 1,024
  positions).
- Small batches: ``data.batch_size`` 1, and ``mini_batch_size`` scaled by the same factor, so
  a rollout still takes as many optimizer steps as the preset's.
- Run length: ``max_epochs: 1``, ``max_steps: -1``, ``limit_train_batches`` 1 (2 with a warmup),
  no validation (``limit_val_batches: 0``, ``num_sanity_val_steps: 0``, ``val_check_interval:
  1.0``, ``check_val_every_n_epoch: 1``), no checkpoints, logs under the test's temp folder.
- A reward term below 0.01 from the response text (:class:`VariedReward`): a random tiny model
  earns no Countdown, MATH or verdict reward, and with every reward 0 no gradient exists.
- ``lr_total_steps``: where the schedule needs a total (a warmup ratio, a decay) and the preset
  derives it from the trainer, 100 (the real run's total comes from its dataset and epochs, the
  dry run's trainer would give 1 or 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from lit_rlhf.cli import cli_main
from tests.recipes import RECIPES, check_table, load_recipes

REPO = Path(__file__).parents[1]
CONFIG_DIR = REPO / "configs"
SAMPLES = "lit_rlhf/data/samples"
MODEL_KEYS = ("model", "tokenizer", "compressor", "decoder", "critic_model", "embedder")
MAX_NEW_TOKENS, MAX_PROMPT, MAX_LENGTH, MAX_CONTEXT, MAX_CONTINUATION = 16, 768, 1024, 64, 16
MAX_BATCH, MAX_ROWS, STANDIN_TOTAL = 1, 16, 100
SAMPLE_PROMPTS = {  # task -> the FilePrompts arguments of its offline sample
    "math": {"path": f"{SAMPLES}/math_prompts.jsonl", "id_field": "id"},
    "chat": {"path": f"{SAMPLES}/chat_prompts.jsonl", "answer_field": None, "id_field": "id"},
    "ifeval": {
        "path": f"{SAMPLES}/ifeval_prompts.jsonl",
        "question_field": "prompt",
        "answer_field": None,
        "id_field": "key",
    },
}


# ------------------------------------------------------------------ which configs
def _header(path: Path) -> str:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return "\n".join(lines)


def _is_gpu_preset(path: Path) -> bool:
    hardware = re.search(r"Hardware:\s*([^.;]*)", _header(path))
    config = yaml.safe_load(path.read_text()) or {}
    on_gpu = (config.get("trainer") or {}).get("accelerator") == "gpu"
    return on_gpu or bool(hardware and re.search(r"\bGPUs?\b", hardware.group(1)))


def _header_fragment(path: Path) -> str | None:
    found = set(re.findall(r"--config\s+(configs/trainer/\S+?\.yaml)", _header(path)))
    assert len(found) <= 1, f"{path}: its header composes several fragments: {sorted(found)}"
    return found.pop() if found else None


PRESETS = sorted(
    p
    for p in CONFIG_DIR.rglob("*.yaml")
    if not p.is_relative_to(CONFIG_DIR / "trainer") and _is_gpu_preset(p)
)


def test_gpu_presets_are_found_by_header():
    names = [p.stem for p in PRESETS]
    assert len(names) == len(set(names)), "two GPU presets share a file name (the test id)"
    families = {p.parent.name for p in PRESETS}
    assert families >= {"compressor", "grm", "ppo", "rm"}, families
    assert {"countdown_tre", "math_tre", "hh_tre_ultrafeedback"} <= set(names)


# ------------------------------------------------------------------ composing
def compose(preset: Path, fragment: str | None) -> dict[str, Any]:
    """The config as LightningCLI composes it from the files (defaults filled in)."""
    args = ["fit", "--config", str(preset)]
    if fragment is not None:
        args += ["--config", str(REPO / fragment)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        cli_main([*args, "--print_config"])
    assert exit_info.value.code == 0, out.getvalue()[-2000:]
    # importing deepspeed may print its accelerator notice ("[<time>] [WARNING] ...") first
    text = "\n".join(x for x in out.getvalue().splitlines() if not x.startswith("["))
    return yaml.safe_load(text)


# ------------------------------------------------------------------ the overrides
@dataclass(frozen=True)
class Context:
    root: Path  # the test's temp folder
    dry_fragment: str | None  # the CPU fragment replacing the header's, or None
    batches: int  # training batches to run


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict of a config tree, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _classes(config: dict[str, Any], suffix: str) -> Iterator[dict[str, Any]]:
    """The ``init_args`` of every ``class_path`` ending in ``suffix`` (created if absent)."""
    for node in list(_walk(config)):
        if str(node.get("class_path", "")).endswith(suffix):
            if not isinstance(node.get("init_args"), dict):
                node["init_args"] = {}
            yield node["init_args"]


def _cap(node: dict[str, Any], key: str, cap: int) -> None:
    if isinstance(node.get(key), int) and not isinstance(node[key], bool) and node[key] > cap:
        node[key] = cap


def run_on_cpu(config: dict[str, Any], ctx: Context) -> None:
    """CPU, one process; the CPU DeepSpeed twin of a DeepSpeed fragment; ddp -> one process."""
    trainer = config["trainer"]
    trainer.update(accelerator="cpu", devices=1, num_nodes=1)
    if ctx.dry_fragment is None and trainer.get("strategy") in ("ddp", "ddp_spawn"):
        trainer["strategy"] = "auto"


def tiny_models(config: dict[str, Any], ctx: Context) -> None:
    """Every model / tokenizer / embedder id -> the tiny builtin of its family."""
    for node in list(_walk(config)):
        for key in MODEL_KEYS:
            value = node.get(key)
            if isinstance(value, str) and not value.startswith("builtin:"):
                node[key] = (
                    "builtin:tiny-qwen2" if "qwen" in value.lower() else "builtin:tiny-llama"
                )


def offline_data(config: dict[str, Any], ctx: Context) -> None:
    """Hub datasets and missing files -> the shipped samples; at most MAX_ROWS rows a source."""
    for args in _classes(config, ".FilePrompts"):
        if not (REPO / str(args.get("path"))).is_file():
            task = args.get("task", "math")
            assert task in SAMPLE_PROMPTS, f"no offline sample for FilePrompts task {task!r}"
            args.update(split="train", name=None, question_template="{question}")
            args.update({"question_field": "question", "answer_field": "answer"})
            args.update(SAMPLE_PROMPTS[task])
            args.pop("where", None)  # a row filter names the hub set's columns
        args["max_examples"] = min(args.get("max_examples") or MAX_ROWS, MAX_ROWS)
    for args in _classes(config, ".InstructionPrompts"):  # MGS's instruction-following source
        if not (REPO / str(args.get("path"))).is_file():  # -> its schema's offline sample
            args.update(path=f"{SAMPLES}/instruction_train_prompts.jsonl", name=None)
            args.update(split="train")
        args["max_examples"] = min(args.get("max_examples") or MAX_ROWS, MAX_ROWS)
    for args in _classes(config, ".PreferencePairs"):
        if not (REPO / str(args.get("path"))).is_file():
            args.update(path=f"{SAMPLES}/reflectrm_copy.jsonl", schema="pairs", split="train")
            args.update(name=None, id_field="id")
        args["num_examples"] = min(args.get("num_examples") or MAX_ROWS, MAX_ROWS)
    for args in _classes(config, ".TextChunks"):
        if not (REPO / str(args.get("path"))).is_file():
            args.update(path=f"{SAMPLES}/text_sample.jsonl", name=None, split="train")
            args["text_field"] = "text"
        args["max_chunks"] = min(args.get("max_chunks") or MAX_ROWS, MAX_ROWS)
    for suffix in (".CountdownPrompts", ".MixturePrompts", ".SyntheticPairs"):
        for args in _classes(config, suffix):
            if args.get("num_examples") is not None:
                args["num_examples"] = min(args["num_examples"], MAX_ROWS)


def hf_engine(config: dict[str, Any], ctx: Context) -> None:
    """vLLM -> HF generate with the same temperature, top_p and top_k."""
    for node in list(_walk(config)):
        if str(node.get("class_path", "")).endswith(".VLLMGenerationEngine"):
            args = node.get("init_args") or {}
            node["class_path"] = "lit_rlhf.rollout.HFGenerationEngine"
            node["init_args"] = {
                "max_new_tokens": args.get("max_new_tokens", 64),
                "temperature": args.get("temperature", 1.0),
                "top_p": args.get("top_p", 1.0),
                "top_k": max(int(args.get("top_k", 0)), 0),
            }


def cap_lengths(config: dict[str, Any], ctx: Context) -> None:
    for node in list(_walk(config)):
        _cap(node, "max_new_tokens", MAX_NEW_TOKENS)
        _cap(node, "max_prompt_length", MAX_PROMPT)
        _cap(node, "max_length", MAX_LENGTH)
        _cap(node, "context_tokens", MAX_CONTEXT)
        _cap(node, "continuation_tokens", MAX_CONTINUATION)


def small_batches(config: dict[str, Any], ctx: Context) -> None:
    """data.batch_size <= MAX_BATCH; mini_batch_size scaled alike (same steps per rollout)."""
    data = config["data"]["init_args"]
    batch = data.get("batch_size")
    if not batch or batch <= MAX_BATCH:
        return
    data["batch_size"] = MAX_BATCH
    model = config["model"]["init_args"]
    mini = model.get("mini_batch_size")
    if mini is not None:
        model["mini_batch_size"] = max(1, round(mini * MAX_BATCH / batch))


def run_length(config: dict[str, Any], ctx: Context) -> None:
    """One (or two) training batches, no validation, no checkpoints, logs in the temp folder."""
    trainer = config["trainer"]
    trainer.update(max_epochs=1, max_steps=-1, limit_train_batches=ctx.batches)
    trainer.update(limit_val_batches=0, num_sanity_val_steps=0, val_check_interval=1.0)
    trainer.update(check_val_every_n_epoch=1, enable_checkpointing=False)
    trainer.update(default_root_dir=str(ctx.root), enable_progress_bar=False)
    trainer["enable_model_summary"] = False
    logger = trainer.get("logger")
    if isinstance(logger, dict):
        logger.setdefault("init_args", {})["save_dir"] = str(ctx.root)
    for args in _classes(config, "RewardModelModule"):
        args["export_dir"] = None  # nothing written outside the temp folder


def standin_total(config: dict[str, Any], ctx: Context) -> None:
    """A schedule that needs a total and derives it from the trainer gets STANDIN_TOTAL (or
    twice a warmup of more steps than that: a total must leave room after the warmup)."""
    args = config["model"]["init_args"]
    needs = args.get("lr_warmup_ratio", 0) > 0 or args.get("lr_schedule", "constant") != "constant"
    if needs and args.get("lr_total_steps") is None:
        args["lr_total_steps"] = max(STANDIN_TOTAL, 2 * int(args.get("lr_warmup_steps", 0)))


Override = Callable[[dict[str, Any], Context], None]
OVERRIDES: tuple[Override, ...] = (
    run_on_cpu,
    tiny_models,
    offline_data,
    hf_engine,
    cap_lengths,
    small_batches,
    run_length,
    standin_total,
)


def dry_run_config(composed: dict[str, Any], ctx: Context) -> dict[str, Any]:
    config = yaml.safe_load(yaml.safe_dump(composed))  # a deep copy
    for key in set(config) - {"seed_everything", "trainer", "model", "data"}:
        del config[key]  # fit's own arguments (ckpt_path, ...): the dry run calls Trainer.fit
    for override in OVERRIDES:
        override(config, ctx)
    return config


# ------------------------------------------------------------------ the schedule
def warmup_steps(args: dict[str, Any], total: int) -> int:
    if args.get("lr_warmup_ratio", 0) > 0:
        return int(args["lr_warmup_ratio"] * total)
    return int(args.get("lr_warmup_steps", 0))


def expected_lr(args: dict[str, Any], count: int, total: int) -> float:
    """The lr verl's schedules give at ``count`` (hand-written here, independent of the code)."""
    lr, warmup = float(args["lr"]), warmup_steps(args, total)
    if count < warmup:
        return lr * count / warmup
    kind = args.get("lr_schedule", "constant")
    if kind == "constant":
        return lr
    floor = lr * float(args.get("min_lr_ratio", 0.0))
    progress = min((count - warmup) / (total - warmup), 1.0)
    if kind == "linear":
        return lr + (floor - lr) * progress
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ------------------------------------------------------------------ the run
def _innermost(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer that holds the Adam state (DeepSpeed's ZeRO optimizers wrap one)."""
    inner = optimizer
    for _ in range(4):
        nested = getattr(inner, "optimizer", None)
        if not isinstance(nested, torch.optim.Optimizer):
            break
        inner = nested
    assert isinstance(inner, torch.optim.Optimizer), type(optimizer)
    return inner


def stepped_params(optimizer: Any) -> list[torch.Tensor]:
    """The tensors the optimizer steps: DeepSpeed's float32 partitions (ZeRO-3 puts its own into
    the inner optimizer's groups only during a step), else the parameters of the groups."""
    for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups"):
        partitions = getattr(optimizer, name, None)
        if partitions:
            return list(partitions)
    return [p for group in _innermost(optimizer).param_groups for p in group["params"]]


class VariedReward(L.Callback):
    """A reward term below 0.01 that varies with the response text (sha1 of it): a random tiny
    model earns no Countdown, MATH or verdict reward, and with every reward 0 (and a value head
    that starts at 0) the update has no gradient at all, so nothing could be asserted."""

    def reward_term(self, trainer: Any, pl_module: Any, ctx: Any) -> tuple[torch.Tensor, dict]:
        digits = [int(hashlib.sha1(r.encode()).hexdigest()[:6], 16) for r in ctx.responses]
        term = torch.tensor(digits, dtype=torch.float32) / 16**6 * 0.01
        return term.to(ctx.scores.device), {}


class Probe(L.Callback):
    """Snapshots the optimizer's parameters at the start, reads ``train/lr`` after each batch."""

    def __init__(self) -> None:
        self.before: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.optimizer: torch.optim.Optimizer | None = None
        self.wrapper: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.wrapper = trainer.optimizers[0]
        self.optimizer = _innermost(self.wrapper)
        self.before = [p.detach().clone() for p in stepped_params(self.wrapper)]
        assert self.before, "the optimizer holds no parameter"

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        lr = trainer.callback_metrics.get("train/lr")
        if lr is not None:
            self.lrs.append(float(lr))

    def check_state(self) -> None:
        """Float32 parameters and Adam moments; the stepped entries changed."""
        assert self.optimizer is not None
        stepped = changed = 0
        for before, param in zip(self.before, stepped_params(self.wrapper), strict=True):
            assert param.dtype == torch.float32, f"an optimizer parameter is {param.dtype}"
            state = self.optimizer.state.get(param, {})
            for key in ("exp_avg", "exp_avg_sq"):
                assert key in state, f"no Adam {key} for a trainable parameter"
                assert state[key].dtype == torch.float32, f"Adam {key} is {state[key].dtype}"
            moved = state["exp_avg"] != 0
            stepped += int(moved.sum())
            changed += int((param.detach() != before)[moved].sum())
        assert stepped > 0, "no parameter was stepped"
        assert changed >= 0.9 * stepped, (
            f"only {changed} of {stepped} stepped entries changed: the update was lost "
            "(a 16-bit weight without float32 master copy?)"
        )


def dry_run(config: dict[str, Any], ctx: Context) -> tuple[Any, Probe]:
    path = ctx.root / "dry_run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = cli_main(["--config", str(path)], run=False)  # run=False: no subcommand
    probe = Probe()
    cli.trainer.callbacks.extend([VariedReward(), probe])
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        close = getattr(cli.model, "close", None)
        if callable(close):
            close()
        end_process_group()
    return cli, probe


def end_process_group() -> None:
    """Destroy the one-process group of an in-process DeepSpeed run, through DeepSpeed when it
    made it (it caches groups; a later run would meet the destroyed ones)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    ds_comm = sys.modules.get("deepspeed.comm.comm")
    if ds_comm is not None and getattr(ds_comm, "cdb", None) is not None:
        ds_comm.destroy_process_group()
    else:
        torch.distributed.destroy_process_group()


def check_lr(args: dict[str, Any], probe: Probe, batches: int) -> None:
    """``train/lr`` after each batch is what the schedule gives there (lr_interval: batch), or
    within warmup / decay bounds (optimizer_step: the logged value spans the batch's steps)."""
    assert len(probe.lrs) == batches, f"train/lr logged after {len(probe.lrs)} of {batches} batches"
    total = args.get("lr_total_steps") or batches
    lr = float(args["lr"])
    if args.get("lr_interval", "batch") == "batch":
        for count, logged in enumerate(probe.lrs):
            assert math.isclose(logged, expected_lr(args, count, total), rel_tol=1e-5, abs_tol=0)
    else:
        assert all(0 <= x <= lr * (1 + 1e-6) for x in probe.lrs), probe.lrs
    if warmup_steps(args, total) > 0:
        assert probe.lrs[0] < lr, "a warmup must start below the configured lr"


# ------------------------------------------------------------------ the test
RECIPE_TABLES = load_recipes()


def _cpu_fragment(fragment: str | None) -> str | None:
    if fragment is None or "deepspeed" not in Path(fragment).stem:
        return None
    return f"configs/trainer/cpu_{Path(fragment).stem.removeprefix('cpu_')}.yaml"


def _needs(config: dict[str, Any]) -> None:
    text = yaml.safe_dump(config)
    if "InstructionReward" in text:
        pytest.importorskip("if_verifiable", reason="needs the [ifeval] extra")
    if (config["model"]["init_args"].get("lora_rank") or 0) > 0:
        pytest.importorskip("peft", reason="lora_rank > 0 needs the [lora] extra")
    if "DeepSpeed" in text:
        pytest.importorskip("deepspeed", reason="needs DeepSpeed")


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_dry_run(preset: Path, tmp_path: Path) -> None:
    rel = str(preset.relative_to(REPO))
    fragment = _header_fragment(preset)
    composed = compose(preset, fragment)
    table = RECIPE_TABLES.get(rel)
    problems = [f"{rel} is a GPU preset without a table in {RECIPES.name}"] if table is None else []
    if table is not None and table.fragment != fragment:
        problems.append(f"its table's heading composes {table.fragment}, its header {fragment}")
    if table is not None:
        problems += check_table(table, composed)
    print("\n".join(["recipe problems:", *problems]) if problems else "recipe: holds")

    args = composed["model"]["init_args"]
    batches = 2 if warmup_steps(args, args.get("lr_total_steps") or STANDIN_TOTAL) > 0 else 1
    ctx = Context(tmp_path, _cpu_fragment(fragment), batches)
    base = compose(preset, ctx.dry_fragment) if ctx.dry_fragment else composed
    config = dry_run_config(base, ctx)
    _needs(config)
    _, probe = dry_run(config, ctx)
    probe.check_state()
    dry_args = config["model"]["init_args"]
    if "lr_schedule" in dry_args:  # every module has the schedule settings
        check_lr(dry_args, probe, batches)
    assert not problems, "\n".join([f"{rel} against {RECIPES.name}:", *problems])
