"""What the plan reads from a composed config (``lit-rlhf fit --config ... --print_config``: keys
``trainer``, ``model``, ``data``): the world size, the strategy, the precision, the sequence
lengths, the micro-batch and the batch figures. Nothing is instantiated."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from lit_rlhf.plan.memory import Strategy

Config = Mapping[str, Any]
HALF_PRECISIONS = ("bf16-mixed", "bf16-true", "16-mixed", "16-true", "bf16", "16", "auto")


def init_args(node: Any) -> dict[str, Any]:
    """``node``'s ``init_args`` (a class node) or ``node`` itself (a plain dict), else {}."""
    if not isinstance(node, Mapping):
        return {}
    args = node.get("init_args") if "class_path" in node else node
    return dict(args) if isinstance(args, Mapping) else {}


def class_name(node: Any) -> str:
    if isinstance(node, str):
        return node.rsplit(".", 1)[-1]
    if isinstance(node, Mapping):
        return str(node.get("class_path") or "").rsplit(".", 1)[-1]
    return ""


def find_classes(tree: Any, name: str) -> Iterator[dict[str, Any]]:
    """The ``init_args`` of every class node named ``name`` in ``tree``, depth first."""
    if isinstance(tree, Mapping):
        if class_name(tree) == name:
            yield init_args(tree)
        for value in tree.values():
            yield from find_classes(value, name)
    elif isinstance(tree, list | tuple):
        for value in tree:
            yield from find_classes(value, name)


def section(config: Config, key: str) -> dict[str, Any]:
    return dict(config.get(key) or {})


def module_args(config: Config) -> dict[str, Any]:
    return init_args(config.get("model") or {})


def data_args(config: Config) -> dict[str, Any]:
    return init_args(config.get("data") or {})


def group(config: Config, name: str) -> dict[str, Any]:
    """A settings group of the module (``model.init_args.<name>``) as a dict."""
    return dict(module_args(config).get(name) or {})


def world_size(config: Config, gpus: int | None) -> tuple[int, str]:
    """(processes, where the number came from): ``gpus`` when given, else the trainer's
    ``devices`` x ``num_nodes`` (``auto`` / -1 / a list: counted as 1 with a note)."""
    trainer = section(config, "trainer")
    nodes = int(trainer.get("num_nodes") or 1)
    if gpus is not None:
        return gpus * nodes, f"--gpus {gpus}" + (f" x {nodes} nodes" if nodes > 1 else "")
    devices = trainer.get("devices", "auto")
    if isinstance(devices, list | tuple):
        return len(devices) * nodes, "trainer.devices (a list)"
    if isinstance(devices, int) and devices > 0:
        return devices * nodes, f"trainer.devices={devices}" + (f" x {nodes}" if nodes > 1 else "")
    if isinstance(devices, str) and devices.isdigit() and int(devices) > 0:
        return int(devices) * nodes, f"trainer.devices={devices}"
    return nodes, f"trainer.devices={devices!r} counted as 1 per node (pass --gpus N)"


def precision_name(config: Config) -> str:
    return str(section(config, "trainer").get("precision") or "32-true")


def compute_bytes(config: Config) -> int:
    """Bytes per activation element: 2 under 16-bit autocast / weights, else 4."""
    return 2 if precision_name(config) in HALF_PRECISIONS else 4


def strategy(config: Config) -> Strategy:
    """The trainer's strategy (a name or a class node, e.g. ``lit_rlhf.strategies.
    DeepSpeedStrategy`` with ``stage``, ``offload_optimizer``, ``offload_parameters`` or a
    DeepSpeed ``config`` dict)."""
    node = section(config, "trainer").get("strategy") or "auto"
    half = precision_name(config) in HALF_PRECISIONS
    name = class_name(node).lower() if isinstance(node, Mapping) else str(node).lower()
    if "deepspeed" in name:
        return deepspeed_strategy(init_args(node) if isinstance(node, Mapping) else {},
                                  name, half)  # fmt: skip
    if "fsdp" in name or "modelparallel" in name:
        return Strategy("fsdp", half=half)
    world, _ = world_size(config, None)
    return Strategy("ddp" if "ddp" in name or world > 1 else "single", half=half)


def deepspeed_strategy(args: Mapping[str, Any], name: str, half: bool) -> Strategy:
    zero = dict((args.get("config") or {}).get("zero_optimization") or {})
    stage = int(zero.get("stage", args.get("stage", 2)))
    for part in name.split("_"):  # Lightning's registered names: deepspeed_stage_3_offload
        if part.isdigit():
            stage = int(part)
    offload_opt = bool(args.get("offload_optimizer") or offloads(zero.get("offload_optimizer"))
                       or "offload" in name)  # fmt: skip
    offload_params = bool(args.get("offload_parameters") or offloads(zero.get("offload_param")))
    bucket = int(float(zero.get("reduce_bucket_size", args.get("reduce_bucket_size", 2e8))))
    if not zero.get("contiguous_gradients", args.get("contiguous_gradients", True)):
        bucket = 0  # no preallocated bucket
    overlap = bool(zero.get("overlap_comm", args.get("overlap_comm", True)))
    reuse = int(float(zero.get("stage3_max_reuse_distance", 1e9)))
    return Strategy("deepspeed", stage, offload_opt, offload_params, half, bucket, overlap, reuse)


def offloads(section: Any) -> bool:
    """A DeepSpeed ``offload_optimizer`` / ``offload_param`` section that moves to a device."""
    if isinstance(section, Mapping):
        return str(section.get("device", "none")).lower() not in ("none", "")
    return bool(section)


@dataclass(frozen=True)
class Shapes:
    """The sequence lengths and the micro-batch of the update."""

    seq_len: int  # prompt + response tokens of the longest row
    response_len: int  # scored tokens of it
    micro_sequences: int  # rows per forward/backward
    logits_chunk: int | None  # the packed path's LM-head chunk; None: the padded path
    note: str
    # distinct prompts per micro-batch where the update's forward shares them (the padded path
    # without checkpointing or a value head, several samples per prompt); None: rows in full
    shared_prompt_rows: int | None = None
    accumulating: bool = True  # micro-batches after the first of an optimizer step exist


@dataclass(frozen=True)
class BatchFigures:
    world: int
    unit: str  # what a batch counts: prompts, pairs, rows
    per_rank: int  # per process
    global_batch: int  # all processes
    samples_per_prompt: int  # 1 outside the RL modules
    mini_batch_per_rank: int  # sequences per optimizer step per process
    steps_per_batch: int  # optimizer steps per training batch (per rollout)
    batches_per_epoch: int | None
    epochs: int | None
    total_steps: int | None
    note: str

    @property
    def global_sequences(self) -> int:
        return self.global_batch * self.samples_per_prompt


def per_rank_batch(config: Config, world: int) -> int:
    data = data_args(config)
    total = data.get("global_batch_size")
    if total:
        return max(1, int(total) // world)
    return int(data.get("batch_size") or 8)


def dataset_rows(config: Config) -> int | None:
    """Training rows where the config says how many (``num_examples``, ``max_examples``)."""
    train = init_args(data_args(config).get("train") or {})
    for key in ("num_examples", "max_examples", "max_chunks"):
        if isinstance(train.get(key), int):
            return int(train[key])
    return None


def batch_figures(config: Config, world: int, *, unit: str, samples: int, mini: int | None,
                  epochs_of_updates: int = 1) -> BatchFigures:  # fmt: skip
    """The batch, mini-batch and step counts (``mini``: sequences per optimizer step per
    process, None: the whole batch; ``epochs_of_updates``: PPO epochs over one rollout)."""
    trainer = section(config, "trainer")
    per = per_rank_batch(config, world)
    rollout = per * samples
    mini = min(mini or rollout, rollout)
    steps = epochs_of_updates * math.ceil(rollout / mini)
    rows, limit = dataset_rows(config), trainer.get("limit_train_batches")
    batches = None if rows is None else rows // (per * world) or 1
    if isinstance(limit, int) and not isinstance(limit, bool):
        batches = limit if batches is None else min(limit, batches)
    elif isinstance(limit, float) and batches is not None:
        batches = max(1, int(batches * limit))
    max_steps, max_epochs = int(trainer.get("max_steps") or -1), trainer.get("max_epochs")
    epochs = max_epochs if max_epochs is not None else (1000 if max_steps < 0 else None)
    total = None if batches is None or epochs is None else epochs * batches * steps
    if max_steps > 0:
        total = max_steps if total is None else min(total, max_steps)
    note = "" if batches is not None else "batches per epoch need the dataset size"
    return BatchFigures(world, unit, per, per * world, samples, mini, steps, batches, epochs,
                        total, note)  # fmt: skip
