"""The memory plan at a module's ``setup("fit")``, before any weights load: the same plan as
``lit-rlhf plan`` (:func:`~lit_rlhf.plan.report.plan_from_config`), read from the module's
hyperparameters, its engine and rewards, the trainer (world size, strategy, precision,
callbacks), the data (per-process batch, longest prompt, domains) and the GPU's memory.

``precision.memory_check``: ``refuse`` (default) refuses a run whose lower bound exceeds the GPU
and warns when only the estimate does; ``warn`` only warns; ``off`` skips the plan. It runs on
CUDA only; :func:`check_memory` takes the device's bytes for a test on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_rlhf.plan.build import gib
from lit_rlhf.plan.report import Plan, plan_from_config

_FIX = (
    "Fix: shrink the largest items: engine snapshot_device: cpu, enable_sleep_mode: true or a "
    "lower gpu_memory_utilization, a higher ZeRO stage or more GPUs, a smaller micro-batch or "
    "shorter sequences, or GPUs with more memory; lit-rlhf plan --config ... prints the whole "
    "plan (precision.memory_check: warn starts the run anyway)."
)


def largest_items(plan: Plan, count: int = 5) -> str:
    items = sorted(plan.items, key=lambda i: i.bytes, reverse=True)[:count]
    return ", ".join(f"{i.name} {gib(i.bytes)} ({i.phase})" for i in items)


def enforce(plan: Plan, mode: str) -> None:
    """Refuse (``refuse`` and the lower bound above the GPU), warn (the estimate above it) or
    log the plan's peak."""
    if mode == "off":
        return
    bounds = ", ".join(f"{p} {gib(b)}" for p, b in plan.lower_bounds.items())
    head = (
        f"memory plan ({plan.module}, {plan.world} GPU(s), {plan.strategy}): per GPU the "
        f"estimate is {gib(plan.peak)} and the lower bound {gib(plan.lower_bound)} ({bounds}) "
        f"of the GPU's {gib(plan.gpu_memory)}; largest items: {largest_items(plan)}"
    )
    if plan.refused and mode == "refuse":
        raise ValueError(f"{head}. Even the lower bound does not fit. {_FIX}")
    if plan.refused:  # precision.memory_check: warn
        rank_zero_warn(f"{head}. Even the lower bound does not fit (memory_check: warn). {_FIX}")
        return
    if not plan.fits:
        rank_zero_warn(f"{head}. It may not fit. {_FIX}")
        return
    rank_zero_info(f"{head}.")


def describe(obj: Any, fields: Mapping[str, str]) -> dict[str, Any]:
    """A config node for a live object: its class path and ``fields`` ({argument: attribute},
    dotted attributes allowed) read from it."""
    args = {}
    for arg, attribute in fields.items():
        value: Any = obj
        for part in attribute.split("."):
            value = getattr(value, part, None)
        as_text = arg in ("snapshot_device", "device")  # torch.device -> "cuda:0"
        args[arg] = None if value is None else str(value) if as_text else value
    return {"class_path": f"{type(obj).__module__}.{type(obj).__name__}", "init_args": args}


_FIELDS = {
    "VLLMGenerationEngine": {
        "max_new_tokens": "max_new_tokens", "gpu_memory_utilization": "gpu_memory_utilization",
        "kv_cache_memory_bytes": "kv_cache_memory_bytes", "dtype": "dtype",
        "enable_sleep_mode": "enable_sleep_mode", "snapshot_device": "snapshot.device",
        "push_bucket_bytes": "push_bucket_bytes", "tensor_parallel_size": "tensor_parallel_size",
    },
    "ScalarRMReward": {"model": "name", "dtype": "dtype", "device": "device"},
    "JudgeReward": {"model": "name", "dtype": "dtype", "device": "device"},
    "CritiqueConsistencyReward": {"embedder": "embedder.model_name", "dtype": "embedder.dtype"},
}  # fmt: skip


def live_node(obj: Any, depth: int = 0) -> Any:
    """The config node of a live engine, reward (nested rewards walked) or callback."""
    name = type(obj).__name__
    if name in _FIELDS:
        return describe(obj, _FIELDS[name])
    if name == "ModularGradientSurgery":
        return {"class_path": f"{type(obj).__module__}.{name}", "init_args": {}}
    if hasattr(obj, "max_new_tokens"):  # another engine (HF generate, a server)
        return describe(obj, {"max_new_tokens": "max_new_tokens"})
    if depth > 4:
        return None
    if isinstance(obj, Mapping):
        return {k: live_node(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [live_node(v, depth + 1) for v in obj]
    nested = [getattr(obj, a, None) for a in ("rewards", "reward", "fn")]
    return [live_node(v, depth + 1) for v in nested if v is not None and v is not obj]


def live_config(module: Any) -> dict[str, Any]:
    """The config the plan reads, from a module in ``setup`` (its trainer attached)."""
    trainer = module.trainer
    hp = {k: v for k, v in dict(module.hparams).items() if not k.startswith("_")}
    hp["engine"] = live_node(getattr(module, "engine", None))
    rollouts = getattr(module, "rollouts", None) or getattr(getattr(module, "rl", None),
                                                            "rollouts", None)  # fmt: skip
    hp["reward"] = live_node(getattr(rollouts, "reward", None) or getattr(module, "reward", None))
    strategy = trainer.strategy
    ds_config = getattr(strategy, "config", None)
    strategy_node: Any = "ddp" if trainer.world_size > 1 else "auto"
    if ds_config is not None and "DeepSpeed" in type(strategy).__name__:
        strategy_node = {"class_path": "DeepSpeedStrategy", "init_args": {"config": ds_config}}
    dm = getattr(trainer, "datamodule", None)
    longest = int(getattr(dm, "longest_prompt", 0) or 0)
    cap = getattr(dm, "max_prompt_length", None)
    data = {
        "batch_size": getattr(dm, "batch_size", None),
        "max_length": getattr(dm, "max_length", None),  # SFTDataModule
        "max_prompt_length": min(longest, cap or longest) if longest else cap,
    }
    return {
        "trainer": {
            "devices": trainer.world_size, "num_nodes": 1, "strategy": strategy_node,
            "precision": str(trainer.precision), "max_epochs": trainer.max_epochs,
            "max_steps": trainer.max_steps, "limit_train_batches": trainer.limit_train_batches,
            "callbacks": [live_node(c) for c in trainer.callbacks],
        },
        "model": {"class_path": f"{type(module).__module__}.{type(module).__name__}",
                  "init_args": hp},
        "data": {"class_path": "PromptDataModule", "init_args": data},
    }  # fmt: skip


def training_tasks(module: Any) -> int | None:
    data = getattr(getattr(module.trainer, "datamodule", None), "train_data", None)
    if data is None or "task" not in getattr(data, "column_names", ()):
        return None
    return len(set(data["task"]))


def device_memory(module: Any) -> int | None:
    """The total bytes of the module's CUDA device, or None off CUDA."""
    import torch

    device = getattr(module.trainer.strategy, "root_device", None)
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def check_memory(module: Any, device_bytes: int | None = None) -> Plan | None:
    """In ``setup("fit")``: the module's plan on its GPU (``device_bytes``: that GPU's memory,
    default the CUDA device's; off CUDA nothing runs), enforced by ``precision.memory_check``.
    Returns the plan (None when skipped)."""
    mode = module.precision.memory_check
    device_bytes = device_bytes if device_bytes is not None else device_memory(module)
    if mode == "off" or device_bytes is None:
        return None
    try:
        plan = plan_from_config(live_config(module), gpu_memory=device_bytes,
                                tasks=training_tasks(module), allow_hub=True)  # fmt: skip
    except ValueError as err:  # an architecture neither known nor readable: no plan, no refusal
        rank_zero_warn(f"memory plan skipped: {err}")
        return None
    enforce(plan, mode)
    return plan
