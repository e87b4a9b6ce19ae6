"""The items of a composed config, per GPU: the networks each module family builds (trained,
frozen), the engine, the buffers and the activation estimate of one micro-batch."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from lit_rlhf.plan import inputs as cfg
from lit_rlhf.plan.architectures import Architecture, architecture
from lit_rlhf.plan.memory import (
    DTYPE_BYTES,
    GiB,
    Item,
    Strategy,
    deepspeed_bucket_items,
    model_state_items,
)
from lit_rlhf.plan.params import Head, counts, lora_parameter_count

RL_MODULES = ("PPOModule", "GenerativeRewardModule")
CHUNK_TOKENS = 1024  # lit_rlhf.models.chunked.CHUNK_TOKENS: response positions per LM-head chunk


@dataclass
class Context:
    """What every part of the plan reads: the config, the world, the device, the archs."""

    config: Mapping[str, Any]
    world: int
    gpu_memory: int
    arch_map: Mapping[str, str]
    strategy: Strategy
    items: list[Item] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    floor: int = 0  # tensors a micro-batch at the maximum lengths must hold (lower bound)
    trained: list[tuple[str, Architecture]] = field(default_factory=list)
    tasks: int | None = None  # gradient-surgery domains, where the data said (setup)
    allow_hub: bool = False  # unknown ids through transformers' AutoConfig (setup)

    def arch(self, name: str) -> Architecture:
        return architecture(name, self.arch_map, allow_hub=self.allow_hub)

    def add(self, *items: Item) -> None:
        self.items.extend(items)


def weight_bytes(ctx: Context, dtype: str) -> int:
    """Bytes per weight of a network inside the module: DeepSpeed's bf16 / fp16 engine casts the
    whole module (frozen parts too) to 16 bits."""
    if ctx.strategy.kind == "deepspeed" and ctx.strategy.half:
        return 2
    return DTYPE_BYTES[dtype]


def add_trained(ctx: Context, role: str, name: str, *, head: Head = "causal_lm",
                layers: int | None = None) -> tuple[Architecture, int]:  # fmt: skip
    """A trained network's states (LoRA: the adapters, and the frozen base beside them);
    returns its architecture and trainable parameter count."""
    arch = ctx.arch(name)
    if layers is not None:
        arch = replace(arch, num_hidden_layers=min(layers, arch.num_hidden_layers))
    dtype = str(cfg.group(ctx.config, "precision").get("dtype") or "float32")
    lora = cfg.group(ctx.config, "lora")
    total = counts(arch, head)
    trainable = total.total
    if int(lora.get("rank") or 0) > 0:
        trainable = lora_parameter_count(arch, int(lora["rank"]),
                                         lora.get("target_modules") or "all-linear")  # fmt: skip
        four_bit = lora.get("quantize") is not None
        size = 0.5 if four_bit else weight_bytes(ctx, dtype)
        base = int(total.total * size) // (ctx.world if ctx.strategy.stage == 3 else 1)
        ctx.add(Item(f"{role}: frozen base ({'4-bit' if four_bit else dtype})", base, "both",
                     "frozen", "under LoRA adapters"))  # fmt: skip
    largest = total.largest_layer if trainable == total.total else 0
    if not ctx.trained:  # one DeepSpeed engine holds every trained network
        ctx.add(*deepspeed_bucket_items(ctx.strategy, weight_bytes(ctx, dtype), trainable))
    ctx.add(*model_state_items(role, trainable, largest, dtype=dtype, strategy=ctx.strategy,
                               world=ctx.world))  # fmt: skip
    ctx.trained.append((role, arch))
    return arch, trainable


def add_frozen(ctx: Context, role: str, name: str, dtype: str, *, head: Head = "causal_lm",
               in_module: bool = True, note: str = "") -> Architecture:  # fmt: skip
    """A frozen network; ``in_module``: built inside the LightningModule (ZeRO-3 partitions it,
    DeepSpeed's 16-bit engine casts it), else loaded beside it (a reward model, an embedder)."""
    arch = ctx.arch(name)
    size = weight_bytes(ctx, dtype) if in_module else DTYPE_BYTES[dtype]
    shard = ctx.world if in_module and ctx.strategy.stage == 3 else 1
    label = "16-bit" if in_module and size == 2 and dtype == "float32" else dtype
    where = " (ZeRO-3 partition)" if shard > 1 else ""
    ctx.add(Item(f"{role}: {name} ({label}){where}", counts(arch, head).total * size // shard,
                 "both", "frozen", note))  # fmt: skip
    return arch


def add_engine(ctx: Context, policy: Architecture, policy_params: int, dtype: str,
               shapes: cfg.Shapes, prompts: int) -> None:  # fmt: skip
    """vLLM's reservation and the weight-sync snapshot, or the HF engine's KV cache."""
    node = cfg.module_args(ctx.config).get("engine") or {}
    args, name = cfg.init_args(node), cfg.class_name(node)
    if name == "VLLMServerEngine":  # generation on other GPUs: only the push's buckets here
        nccl = str(args.get("push") or "disk") == "nccl"
        bucket = int(args.get("push_bucket_bytes") or 512 << 20) if nccl else 0
        ctx.add(Item("push buckets (VLLMServerEngine)", bucket, "both", "snapshot",
                     "push: nccl: one bucket on the GPU while it is broadcast" if nccl else
                     "generation runs in the vllm serve processes; push: disk writes buckets "
                     "from host memory", transient=True))  # fmt: skip
        return
    if name != "VLLMGenerationEngine":
        samples = int(cfg.group(ctx.config, "rollout").get("samples_per_prompt") or 4)
        kv = (
            prompts
            * samples
            * shapes.seq_len
            * policy.num_hidden_layers
            * 2
            * policy.num_key_value_heads
            * policy.head_size
            * cfg.compute_bytes(ctx.config)
        )
        ctx.add(Item("rollout: KV cache of generate", kv, "rollout", "activations",
                     f"{name or 'HFGenerationEngine'}: every sequence at full length",
                     transient=True))  # fmt: skip
        return
    sleep = bool(args.get("enable_sleep_mode"))
    kv_bytes = args.get("kv_cache_memory_bytes")
    engine_dtype = str(args.get("dtype") or "auto")
    engine_size = 2 if engine_dtype in ("auto", "bfloat16", "float16") else 4
    tp = int(args.get("tensor_parallel_size") or 1)  # each GPU of a group holds 1/tp
    if kv_bytes:
        reserved, how = (
            int(kv_bytes) + policy_params * engine_size // tp,
            "weights"
            + (f" / tensor_parallel_size {tp}" if tp > 1 else "")
            + " + kv_cache_memory_bytes",
        )
    else:
        util = float(args.get("gpu_memory_utilization", 0.3))
        reserved, how = int(util * ctx.gpu_memory), f"gpu_memory_utilization {util} of the GPU"
    note = how + ("; level-1 sleep frees it in the update" if sleep else "; no sleep mode")
    ctx.add(Item("vLLM: weights + KV cache", reserved, "rollout" if sleep else "both", "engine",
                 note))  # fmt: skip
    lora = int(cfg.group(ctx.config, "lora").get("rank") or 0) > 0
    if not lora and args.get("push_bucket_bytes", 1) != 0:  # the bucketed push of every weight
        note = "full fine-tuning: the bucketed push sends every weight, no copy kept"
        ctx.add(Item("weight-sync snapshot (none)", 0, "both", "snapshot", note))
        return
    on_cpu = str(args.get("snapshot_device", "cpu") or "").lower() == "cpu"
    size = weight_bytes(ctx, dtype)
    snapshot = 0 if on_cpu else counts(policy).total * size
    ctx.add(Item(f"weight-sync snapshot ({'cpu' if on_cpu else f'{size * 8}-bit'})", snapshot,
                 "both", "snapshot",
                 "snapshot_device: cpu" if on_cpu else "a full copy of the policy for change "
                 "detection (snapshot_device: cpu moves it off the GPU)"))  # fmt: skip


def add_teacher(ctx: Context, dtype: str) -> None:
    """On-policy distillation's teacher: frozen in the module, in the reference's dtype
    (``precision.reference_dtype``, else ``precision.dtype``); none here when
    ``distill.teacher_urls`` serves it from other processes."""
    distill = cfg.group(ctx.config, "distill")
    teacher = distill.get("teacher")
    if not teacher:
        return
    if distill.get("teacher_urls"):
        ctx.add(Item(f"distillation teacher: {teacher}", 0, "both", "frozen",
                     "served at distill.teacher_urls"))  # fmt: skip
        return
    ref = cfg.group(ctx.config, "precision").get("reference_dtype") or dtype
    add_frozen(ctx, "distillation teacher", str(teacher), str(ref), note="distill.teacher")


def add_reward_models(ctx: Context) -> None:
    """Scalar reward models, judges and embedders, each loaded whole on every GPU."""
    args = cfg.module_args(ctx.config)
    tree = [args.get("reward"), args.get("reward_fn"), args.get("rewards")]
    for kind, role, head in (("ScalarRMReward", "reward model", "sequence_classification"),
                             ("JudgeReward", "judge", "causal_lm")):  # fmt: skip
        for rm in cfg.find_classes(tree, kind):
            if str(rm.get("device") or "").startswith("cpu"):
                ctx.add(Item(f"{role}: {rm['model']}", 0, "both", "frozen", "device: cpu"))
                continue
            add_frozen(ctx, role, str(rm["model"]), str(rm.get("dtype") or "float32"),
                       head=head, in_module=False)  # type: ignore[arg-type]  # fmt: skip
    callbacks = cfg.section(ctx.config, "trainer").get("callbacks") or []
    for cb in cfg.find_classes(callbacks, "CritiqueConsistencyReward"):
        name = str(cb.get("embedder") or "builtin:all-minilm-l6-v2")
        if name.startswith("builtin:all-minilm"):
            ctx.add(Item(f"embedder: {name}", 0, "both", "frozen", "about 23M parameters"))
            continue
        add_frozen(ctx, "embedder", name, str(cb.get("dtype") or "float32"), head="trunk",
                   in_module=False)  # fmt: skip


def surgery_tasks(config: Mapping[str, Any]) -> int | None:
    """Domains of the training prompts (a mixture's sources' tasks), where the config says."""
    train = cfg.data_args(config).get("train") or {}
    if cfg.class_name(train) != "MixturePrompts":
        return None
    sources = cfg.init_args(train).get("sources") or []
    tasks = {cfg.init_args(s).get("task") for s in sources}
    return len(tasks) if None not in tasks else len(sources)


def add_surgery(ctx: Context, trainable: int) -> None:
    callbacks = cfg.section(ctx.config, "trainer").get("callbacks") or []
    if not list(cfg.find_classes(callbacks, "ModularGradientSurgery")):
        return
    tasks = ctx.tasks or surgery_tasks(ctx.config)
    if tasks is None:
        ctx.notes.append("ModularGradientSurgery: the number of domains is unknown; counted as 2")
    n = tasks or 2
    # lit_rlhf/training/task_backward.py: the earlier domains' flat copies are held while the
    # last domain runs backward (under DeepSpeed its own float32 sum too: autograd.grad); the
    # rest of the combination (the last copy and the sum) comes after it, once the activations
    # are freed: a transient beside the micro-batch's
    held = n if ctx.strategy.kind == "deepspeed" else n - 1
    # FSDP2: each rank keeps its shard of every domain's gradient (PCGrad on the shards)
    share = ctx.world if ctx.strategy.kind == "fsdp" else 1
    where = ("1/world on every GPU (FSDP2 shards)" if share > 1
             else "full on every GPU, not sharded (docs/multidomain.md)")  # fmt: skip
    ctx.add(Item(f"gradient surgery: {n} domain gradients, {held} held through the last "
                 "backward (float32)", held * 4 * trainable // share, "update", "buffer", where),
            Item("gradient surgery: the rest of the combination (float32)",
                 (n + 1 - held) * 4 * trainable // share, "update", "buffer",
                 "after the last backward, with the domains' sum", transient=True))  # fmt: skip


def activation_item(ctx: Context, role: str, arch: Architecture, shapes: cfg.Shapes, *,
                    trainable: bool = True, logits: bool = True) -> int:  # fmt: skip
    """The estimate of one micro-batch (lit_rlhf.plan.activations); returns its bytes."""
    from lit_rlhf.plan.activations import micro_batch_peak_bytes

    peak = micro_batch_peak_bytes(
        arch, sequences=shapes.micro_sequences, seq_len=shapes.seq_len,
        response_len=shapes.response_len if logits else 0,
        compute_dtype_bytes=cfg.compute_bytes(ctx.config),
        gradient_checkpointing=bool(cfg.group(ctx.config, "precision")
                                    .get("gradient_checkpointing")),
        trainable=trainable, logits_chunk=shapes.logits_chunk,
        # the policy's update forward shares prompts (a separate critic's does not)
        shared_prompt_rows=shapes.shared_prompt_rows if logits else None,
        accumulating=shapes.accumulating,
    )  # fmt: skip
    return peak["activations"] + (peak["logits"] if logits else 0)


def floor_bytes(ctx: Context, arch: Architecture, shapes: cfg.Shapes, *, logits: bool) -> int:
    """What a micro-batch at the maximum lengths must hold whatever the kernels: one 16-bit
    layer input per layer and token (checkpointed or not) and its 16-bit logits (a chunk of
    them on the packed path)."""
    d = cfg.compute_bytes(ctx.config)
    tokens = shapes.micro_sequences * shapes.seq_len
    inputs = tokens * arch.hidden_size * d * arch.num_hidden_layers
    rows = shapes.micro_sequences * shapes.response_len
    if shapes.logits_chunk is not None:
        rows = min(rows, shapes.logits_chunk)
    return inputs + (rows * arch.vocab_size * d if logits else 0)


def gib(n: float) -> str:
    """A size in GiB (MiB below 1 GiB)."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def ceil_div(a: int, b: int) -> int:
    return math.ceil(a / b)
