"""Preset dry run: every GPU preset builds and takes real optimizer steps on CPU, and every
setting of it equals the authors' recipe in docs/recipes.md unless that row lists a deviation.

The GPU presets are found, not listed: every ``configs/<family>/*.yaml`` whose header says GPUs
(``Hardware: ... GPU``) or whose trainer asks for ``accelerator: gpu``. A GPU preset without a
table in docs/recipes.md fails. Its header's ``--config configs/trainer/<fragment>.yaml`` (if any)
is composed after it, and the table's heading must name the same fragment.

For each preset (one test id per file, ``test_preset_dry_run[<file stem>]``):

1. Recipe (first, before any skip: a missing extra or device never hides it): the config
   composed from the files (``lit-rlhf fit --config <preset> [--config
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
  <= 1024, ``context_tokens`` <= 64, ``continuation_tokens`` <= 16, ``overlong_buffer`` <= 4
  (the tiny models have 1,024 positions).
- Small batches: ``data.batch_size`` 1, and ``mini_batch_size`` scaled by the same factor, so
  a rollout still takes as many optimizer steps as the preset's (``global_batch_size`` and
  ``global_mini_batch_size`` x ``samples_per_prompt`` become these per-process sizes first).
- Run length: ``max_epochs: 1``, ``max_steps: -1``, ``limit_train_batches`` 1 (2 with a warmup),
  no validation (``limit_val_batches: 0``, ``num_sanity_val_steps: 0``, ``val_check_interval:
  1.0``, ``check_val_every_n_epoch: 1``), no checkpoints, logs under the test's temp folder.
- A reward term below 0.01 from the response text (:class:`VariedReward`): a random tiny model
  earns no Countdown, MATH or verdict reward, and with every reward 0 no gradient exists.
- ConsistRM without its seeded memory (the preset's ``initial_memory: null``; the seed is the
  8B judge's votes): ``unseeded: true`` on ``ConsistencyAnswerReward``, which otherwise refuses
  the fit.
- ``lr_total_steps``: where the schedule needs a total (a warmup ratio, a decay) and the preset
  derives it from the trainer, 100, or twice ``lr_warmup_steps`` where that is more (the real
  run's total comes from its dataset and epochs, the dry run's trainer would give 1 or 2).

GPU mode: with the environment variable ``LIT_RLHF_DRY_RUN_DEVICE=gpu`` (default ``cpu``) the
same dry run runs on one CUDA GPU: ``trainer.accelerator: gpu``, ``devices: 1``, ``num_nodes: 1``
and the preset's own DeepSpeed fragment (``configs/trainer/deepspeed_zero2/3.yaml``) instead of
its CPU twin; every other override is unchanged (tiny stand-ins, offline samples, the HF engine,
capped lengths, ...). The dry run test is skipped, with the reason, where CUDA is not available.
``scripts/gpu_check.sh`` runs this mode on a lent GPU (``LIT_RLHF_DRY_RUN_DEVICE=gpu python -m
pytest -q tests/test_preset_dry_run.py::test_preset_dry_run``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
import yaml

from tests.dry_run import check_lr, compose, dry_run, expected_lr, vllm_old_log_probs, warmup_steps
from tests.recipes import RECIPES, check_table, load_recipes

REPO = Path(__file__).parents[1]
CONFIG_DIR = REPO / "configs"
SAMPLES = "lit_rlhf/data/samples"
MODEL_KEYS = ("model", "tokenizer", "compressor", "decoder", "critic_model", "embedder")
MAX_NEW_TOKENS, MAX_PROMPT, MAX_LENGTH, MAX_CONTEXT, MAX_CONTINUATION = 16, 768, 1024, 64, 16
MAX_BATCH, MAX_ROWS, STANDIN_TOTAL = 1, 16, 100
DEVICE_VARIABLE = "LIT_RLHF_DRY_RUN_DEVICE"  # cpu (default) or gpu: where the dry run runs
Device = Literal["cpu", "gpu"]
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
    for preset in PRESETS:  # a CPU config's header never says GPU
        trainer = (yaml.safe_load(preset.read_text()) or {}).get("trainer") or {}
        assert trainer.get("accelerator") != "cpu", preset


@pytest.mark.parametrize(
    ("schedule", "count", "factor"),
    [
        ({}, 7, 1.0),  # constant, no warmup
        ({"lr_warmup_ratio": 0.1}, 0, 0.0),  # a warmup starts at 0 (verl, transformers)
        ({"lr_warmup_ratio": 0.1}, 5, 0.5),  # int(0.1 x 100) = 10 warmup steps
        ({"lr_warmup_steps": 10, "lr_schedule": "linear"}, 55, 0.5),  # 45 of 90 decay steps
        ({"lr_warmup_steps": 10, "lr_schedule": "linear"}, 100, 0.0),
        ({"lr_warmup_steps": 10, "lr_schedule": "cosine", "min_lr_ratio": 0.1}, 55, 0.55),
        ({"lr_schedule": "cosine", "min_lr_ratio": 0.1}, 100, 0.1),
    ],
)
def test_expected_lr_hand_computed(schedule, count, factor):
    args = {"lr": 2.0e-5, **schedule}
    assert math.isclose(expected_lr(args, count, 100), 2.0e-5 * factor, abs_tol=1e-15)


def test_vllm_presets_with_several_steps_recompute_old_log_probs():
    config = {
        "model": {
            "init_args": {
                "engine": {"class_path": "lit_rlhf.rollout.VLLMGenerationEngine"},
                "rollout": {"samples_per_prompt": 8},
                "update": {"mini_batch_size": 512},
                "mismatch": {"correction": "none"},
            }
        },
        "data": {"init_args": {"batch_size": 512}},
    }
    assert "8 optimizer steps per rollout" in vllm_old_log_probs(config)[0]
    update = config["model"]["init_args"]["update"]
    update["recompute_old_log_probs"] = True
    assert vllm_old_log_probs(config) == []
    update.update(recompute_old_log_probs=False, mini_batch_size=4096)
    assert vllm_old_log_probs(config) == []  # one step: the engine's log-probs are not read
    config["model"]["init_args"]["mismatch"]["correction"] = "auto"
    assert "pins model.init_args.mismatch.correction" in vllm_old_log_probs(config)[0]


def test_small_batches_turn_global_sizes_into_per_process_ones(tmp_path):
    """TRE's 512 prompts in mini-batches of 64 (8 samples each): one prompt a rollout and
    mini-batches of 1 sequence keep 8 optimizer steps per rollout on the dry run's one process."""
    composed = {
        "trainer": {"accelerator": "gpu", "devices": 8},
        "model": {"init_args": {"rollout": {"samples_per_prompt": 8}, "optim": {"lr": 1.0e-6},
                                "update": {"global_mini_batch_size": 64}}},
        "data": {"init_args": {"global_batch_size": 512}},
    }  # fmt: skip
    config = dry_run_config(composed, Context(tmp_path, None, 1))
    assert config["data"]["init_args"] == {"batch_size": 1}
    assert config["model"]["init_args"]["update"] == {"mini_batch_size": 1}
    assert "8 optimizer steps per rollout" in vllm_old_log_probs(
        {**composed, "model": {"init_args": {**composed["model"]["init_args"], "engine": {
            "class_path": "lit_rlhf.rollout.VLLMGenerationEngine"}, "mismatch": {
            "correction": "none"}}}}
    )[0]  # fmt: skip


# ------------------------------------------------------------------ composing
# ------------------------------------------------------------------ the overrides
@dataclass(frozen=True)
class Context:
    root: Path  # the test's temp folder
    dry_fragment: str | None  # the fragment run: the header's CPU twin (cpu) or its own (gpu)
    batches: int  # training batches to run
    device: Device = "cpu"  # the trainer's accelerator


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


def run_on_device(config: dict[str, Any], ctx: Context) -> None:
    """One process on ``ctx.device`` (CPU, or one GPU in GPU mode); ddp -> one plain process.
    The fragment (CPU twin or the preset's own) is chosen by :func:`dry_fragment`."""
    trainer = config["trainer"]
    trainer.update(accelerator=ctx.device, devices=1, num_nodes=1)
    if trainer.get("strategy") in ("ddp", "ddp_spawn"):  # a DeepSpeed fragment's is a class
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
        _cap(node, "overlong_buffer", MAX_NEW_TOKENS // 4)  # DAPO's penalty inside the cap


def small_batches(config: dict[str, Any], ctx: Context) -> None:
    """data.batch_size <= MAX_BATCH; mini_batch_size scaled alike (same steps per rollout). The
    global sizes (prompts across all processes) become these per-process ones first: the dry run
    is one process, and a global mini-batch of a fraction of a prompt cannot be written."""
    data = config["data"]["init_args"]
    update = config["model"]["init_args"].get("update") or {}  # PPO's and GRM's group
    if data.get("global_batch_size") is not None:
        data["batch_size"] = data.pop("global_batch_size")
    if update.get("global_mini_batch_size") is not None:
        g = (config["model"]["init_args"].get("rollout") or {}).get("samples_per_prompt", 4)
        update["mini_batch_size"] = update.pop("global_mini_batch_size") * g
    batch = data.get("batch_size")
    if not batch or batch <= MAX_BATCH:
        return
    data["batch_size"] = MAX_BATCH
    mini = update.get("mini_batch_size")
    if mini is not None:
        update["mini_batch_size"] = max(1, round(mini * MAX_BATCH / batch))


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
    twice a warmup of more steps than that: a total must leave room after the warmup). A warmup
    of steps before a constant lr (no total to set) becomes one step: the dry run's two batches
    could not hold the preset's."""
    args = config["model"]["init_args"]["optim"]  # every module's optimisation group
    needs = args.get("lr_warmup_ratio", 0) > 0 or args.get("lr_schedule", "constant") != "constant"
    if needs and args.get("lr_total_steps") is None:
        args["lr_total_steps"] = max(STANDIN_TOTAL, 2 * int(args.get("lr_warmup_steps", 0)))
    elif not needs and int(args.get("lr_warmup_steps") or 0) > 1:
        args["lr_warmup_steps"] = 1


def unseeded_memory(config: dict[str, Any], ctx: Context) -> None:
    """ConsistRM's answer reward without its seeded memory -> ``unseeded: true`` (the seed is
    the full-size judge's votes, written by scripts/data/seed_consistrm_memory.py)."""
    for args in _classes(config, ".ConsistencyAnswerReward"):
        if args.get("initial_memory") is None and args.get("use_memory", True):
            args["unseeded"] = True


Override = Callable[[dict[str, Any], Context], None]
OVERRIDES: tuple[Override, ...] = (
    run_on_device,
    tiny_models,
    offline_data,
    hf_engine,
    cap_lengths,
    small_batches,
    run_length,
    standin_total,
    unseeded_memory,
)


def dry_run_config(composed: dict[str, Any], ctx: Context) -> dict[str, Any]:
    config = yaml.safe_load(yaml.safe_dump(composed))  # a deep copy
    for key in set(config) - {"seed_everything", "trainer", "model", "data"}:
        del config[key]  # fit's own arguments (ckpt_path, ...): the dry run calls Trainer.fit
    for override in OVERRIDES:
        override(config, ctx)
    return config


# ------------------------------------------------------------------ the test
RECIPE_TABLES = load_recipes()


@pytest.mark.parametrize(
    ("value", "device"),
    [(None, "cpu"), ("", "cpu"), ("cpu", "cpu"), ("gpu", "gpu"), ("GPU", "gpu")],
)
def test_the_device_variable_picks_the_mode(monkeypatch, value, device):
    if value is None:
        monkeypatch.delenv(DEVICE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DEVICE_VARIABLE, value)
    assert dry_run_device() == device


def test_an_unknown_device_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv(DEVICE_VARIABLE, "tpu")
    with pytest.raises(ValueError, match=r"LIT_RLHF_DRY_RUN_DEVICE='tpu'\. Fix: cpu .* or gpu"):
        dry_run_device()


DEEPSPEED = {"class_path": "lit_rlhf.strategies.DeepSpeedStrategy", "init_args": {"stage": 3}}


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize(
    ("fragment", "strategy", "cpu_fragment"),
    [
        (
            "configs/trainer/deepspeed_zero3.yaml",
            DEEPSPEED,
            "configs/trainer/cpu_deepspeed_zero3.yaml",
        ),
        (
            "configs/trainer/deepspeed_zero2.yaml",
            DEEPSPEED,
            "configs/trainer/cpu_deepspeed_zero2.yaml",
        ),
        ("configs/trainer/ddp.yaml", "ddp", None),
        (None, "auto", None),
    ],
)
def test_each_mode_picks_its_fragment_and_accelerator(
    tmp_path, device, fragment, strategy, cpu_fragment
):
    """CPU: the DeepSpeed fragment's CPU twin; GPU: the preset's own; both one process on one
    device with the other overrides alike (here: the stand-in model and the batch)."""
    ctx = Context(tmp_path, dry_fragment(fragment, device), 1, device)
    assert ctx.dry_fragment == (fragment if device == "gpu" else cpu_fragment)
    composed = {
        "trainer": {
            "accelerator": "gpu",
            "devices": 8,
            "num_nodes": 2,
            "precision": "bf16-mixed",
            "strategy": strategy,
        },
        "model": {"init_args": {"model": "Qwen/Qwen3-8B", "optim": {"lr": 1.0e-6}}},
        "data": {"init_args": {"batch_size": 64}},
    }
    config = dry_run_config(composed, ctx)
    trainer = config["trainer"]
    assert (trainer["accelerator"], trainer["devices"], trainer["num_nodes"]) == (device, 1, 1)
    assert trainer["precision"] == "bf16-mixed"  # as parsed, in both modes
    assert trainer["strategy"] == ("auto" if strategy == "ddp" else strategy)
    assert config["model"]["init_args"]["model"] == "builtin:tiny-qwen2"
    assert config["data"]["init_args"]["batch_size"] == 1
    assert composed["trainer"]["accelerator"] == "gpu"  # the composed config is not changed


def test_each_mode_composes_its_deepspeed_strategy(tmp_path):
    """A ZeRO-3 preset as each mode runs it: the CPU twin's class, or the header's own on GPU."""
    preset = next(p for p in PRESETS if str(_header_fragment(p)).endswith("deepspeed_zero3.yaml"))
    fragment = _header_fragment(preset)
    for device, strategy in (("cpu", "CPUDeepSpeedStrategy"), ("gpu", "DeepSpeedStrategy")):
        ctx = Context(tmp_path, dry_fragment(fragment, device), 1, device)
        trainer = dry_run_config(compose(preset, ctx.dry_fragment), ctx)["trainer"]
        assert trainer["strategy"]["class_path"] == f"lit_rlhf.strategies.{strategy}"
        assert trainer["strategy"]["init_args"]["stage"] == 3
        assert (trainer["accelerator"], trainer["devices"]) == (device, 1)
        assert trainer["precision"] == "bf16-mixed"


def test_gpu_mode_is_skipped_without_cuda(monkeypatch, tmp_path):
    monkeypatch.setenv(DEVICE_VARIABLE, "gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(pytest.skip.Exception, match="CUDA is not available"):
        test_preset_dry_run(PRESETS[0], tmp_path)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_table_check_runs_before_any_skip(monkeypatch, tmp_path, device):
    """A wrong table row fails even where the dry run would be skipped (an extra not installed,
    GPU mode without CUDA)."""
    preset = next(p for p in PRESETS if p.stem == "consistrm_qwen3-8b")  # DeepSpeed: _needs skips
    rel = str(preset.relative_to(REPO))
    table = RECIPE_TABLES[rel]
    row = next(r for r in table.rows if r.setting == "trainer.max_epochs")
    wrong = dataclasses.replace(row, ours=row.ours + 1)
    rows = tuple(wrong if r is row else r for r in table.rows)
    monkeypatch.setitem(RECIPE_TABLES, rel, dataclasses.replace(table, rows=rows))
    monkeypatch.setenv(DEVICE_VARIABLE, device)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def skip(*args: Any, **kwargs: Any) -> None:
        pytest.skip("an extra is missing")

    monkeypatch.setattr(pytest, "importorskip", skip)
    with pytest.raises(AssertionError, match=r"trainer\.max_epochs`: the config holds 4"):
        test_preset_dry_run(preset, tmp_path)


def test_a_consistrm_preset_without_memory_runs_unseeded(tmp_path):
    ctx = Context(tmp_path, None, 1)
    callbacks = [
        {"class_path": "lit_rlhf.callbacks.ConsistencyAnswerReward", "init_args": {}},
        {"class_path": "x.ConsistencyAnswerReward", "init_args": {"initial_memory": "m.jsonl"}},
        {"class_path": "x.ConsistencyAnswerReward", "init_args": {"use_memory": False}},
    ]
    config: dict[str, Any] = {"trainer": {"callbacks": callbacks}}
    unseeded_memory(config, ctx)
    assert [c["init_args"].get("unseeded") for c in callbacks] == [True, None, None]


def dry_run_device() -> Device:
    """Where the dry run runs: ``$LIT_RLHF_DRY_RUN_DEVICE`` (``cpu`` when unset or empty)."""
    value = os.environ.get(DEVICE_VARIABLE, "").strip().lower() or "cpu"
    if value not in ("cpu", "gpu"):
        raise ValueError(f"{DEVICE_VARIABLE}={value!r}. Fix: cpu (the default) or gpu.")
    return "gpu" if value == "gpu" else "cpu"


def dry_fragment(fragment: str | None, device: Device) -> str | None:
    """The trainer fragment the dry run composes: on a GPU the header's own; on CPU the CPU
    twin of a DeepSpeed fragment (same stage, one process), else none (ddp -> one process)."""
    if device == "gpu":
        return fragment
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
    problems += vllm_old_log_probs(composed)
    # the table is held first: no skip below (device, DeepSpeed, peft, if-verifiable) hides it
    assert not problems, "\n".join([f"{rel} against {RECIPES.name}:", *problems])

    device = dry_run_device()
    if device == "gpu" and not torch.cuda.is_available():
        pytest.skip(f"{DEVICE_VARIABLE}=gpu, and CUDA is not available here")
    args = composed["model"]["init_args"]["optim"]
    batches = 2 if warmup_steps(args, args.get("lr_total_steps") or STANDIN_TOTAL) > 0 else 1
    ctx = Context(tmp_path, dry_fragment(fragment, device), batches, device)
    recompose = ctx.dry_fragment not in (None, fragment)  # the CPU twin instead of the header's
    base = compose(preset, ctx.dry_fragment) if recompose else composed
    config = dry_run_config(base, ctx)
    _needs(config)
    _, probe = dry_run(config, ctx.root)
    probe.check_state()
    check_lr(config["model"]["init_args"]["optim"], probe, batches)  # every module has it
