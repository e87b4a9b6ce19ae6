"""Per module family, the networks it builds, its shapes and its batch figures: the RL modules
(PPO, the generative reward model), the supervised ones (reward model, SFT, DPO) and the
compressor-decoder."""

from __future__ import annotations

from typing import Any

from lit_rlhf.plan import inputs as cfg
from lit_rlhf.plan.build import (
    CHUNK_TOKENS,
    Context,
    activation_item,
    add_engine,
    add_frozen,
    add_reward_models,
    add_surgery,
    add_teacher,
    add_trained,
    ceil_div,
    floor_bytes,
    surgery_tasks,
)
from lit_rlhf.plan.memory import Item

Result = tuple[cfg.BatchFigures, cfg.Shapes, float | None]


def rl_mini_batch(ctx: Context, samples: int) -> int | None:
    update = cfg.group(ctx.config, "update")
    if update.get("global_mini_batch_size"):
        return max(1, int(update["global_mini_batch_size"]) // ctx.world) * samples
    return update.get("mini_batch_size")


def rl_shapes(ctx: Context, mini: int) -> cfg.Shapes:
    data, update = cfg.data_args(ctx.config), cfg.group(ctx.config, "update")
    engine = cfg.init_args(cfg.module_args(ctx.config).get("engine") or {})
    response = int(engine.get("max_new_tokens") or 64)
    seq = int(data.get("max_prompt_length") or 512) + response
    tokens = update.get("micro_batch_tokens")
    if tokens:
        return cfg.Shapes(seq, response, max(1, int(tokens) // seq), CHUNK_TOKENS,
                          f"packed: update.micro_batch_tokens={tokens}")  # fmt: skip
    micro = cfg.group(ctx.config, "optim").get("micro_batch_size") or mini
    rows = min(int(micro), mini)
    per_domain = max(1, mini // domains(ctx))  # each domain's backward starts from no gradient
    return cfg.Shapes(seq, response, rows, None, f"optim.micro_batch_size={micro} sequences",
                      shared_prompt_rows=shared_prompts(ctx, rows, per_domain),
                      accumulating=per_domain > rows)  # fmt: skip


def shared_prompts(ctx: Context, rows: int, mini: int) -> int | None:
    """Distinct prompts in a micro-batch of ``rows`` drawn from a shuffled mini-batch of ``mini``
    sequences, where the update's forward runs each prompt once
    (``lit_rlhf.models.forward.forward_response``: not with gradient checkpointing, which turns
    the KV cache off, nor with a value head, which needs every row's hidden states)."""
    samples = int(cfg.group(ctx.config, "rollout").get("samples_per_prompt") or 4)
    checkpointing = cfg.group(ctx.config, "precision").get("gradient_checkpointing")
    gae = cfg.group(ctx.config, "advantage").get("estimator", "grpo") == "gae"
    value_head = gae and cfg.group(ctx.config, "critic").get("kind") == "value_head"
    if samples < 2 or checkpointing or value_head:
        return None
    return min(rows, -(-mini // samples))


def domains(ctx: Context) -> int:
    """Gradient surgery runs backward domain by domain, each micro-batch of one domain's rows
    (1 without it)."""
    callbacks = cfg.section(ctx.config, "trainer").get("callbacks") or []
    if not list(cfg.find_classes(callbacks, "ModularGradientSurgery")):
        return 1
    return ctx.tasks or surgery_tasks(ctx.config) or 2


def step_flops(arch: Any, tokens: int, seq_len: int, logit_tokens: int, *, lm_head: bool = True,
               trainable: bool = True) -> float:  # fmt: skip
    from lit_rlhf.plan.flops import step_flops as flops

    return flops(arch, tokens=tokens, seq_len=seq_len, trainable=trainable,
                 logit_tokens=logit_tokens, lm_head=lm_head)  # fmt: skip


def rl_plan(ctx: Context) -> Result:
    args = cfg.module_args(ctx.config)
    samples = int(cfg.group(ctx.config, "rollout").get("samples_per_prompt") or 4)
    update = cfg.group(ctx.config, "update")
    batch = cfg.batch_figures(ctx.config, ctx.world, unit="prompts", samples=samples,
                              mini=rl_mini_batch(ctx, samples),
                              epochs_of_updates=int(update.get("ppo_epochs") or 1))  # fmt: skip
    shapes = rl_shapes(ctx, batch.mini_batch_per_rank)
    model = str(args.get("model") or "builtin:tiny-llama")
    dtype = str(cfg.group(ctx.config, "precision").get("dtype") or "float32")
    policy, trainable = add_trained(ctx, "policy", model)
    critic_arch = None
    advantage = cfg.group(ctx.config, "advantage")
    is_ppo = cfg.class_name(ctx.config.get("model") or {}) == "PPOModule"
    if is_ppo and advantage.get("estimator", "grpo") == "gae":
        critic = cfg.group(ctx.config, "critic")
        if critic.get("kind", "separate") == "separate":
            critic_arch, _ = add_trained(ctx, "critic", str(critic.get("model") or model),
                                         head="critic")  # fmt: skip
        else:
            ctx.add(Item("value head", 16 * (policy.hidden_size + 1), "both", "state"))
    lora = int(cfg.group(ctx.config, "lora").get("rank") or 0)
    if float(cfg.group(ctx.config, "kl").get("coef") or 0) > 0 and lora == 0:
        ref = cfg.group(ctx.config, "precision").get("reference_dtype") or dtype
        add_frozen(ctx, "reference", model, str(ref), note="kl.coef > 0")
    add_teacher(ctx, dtype)
    add_reward_models(ctx)
    add_engine(ctx, policy, trainable, dtype, shapes, batch.per_rank)
    add_surgery(ctx, trainable)
    add_update_activations(ctx, policy, critic_arch, shapes)
    tokens = batch.mini_batch_per_rank * shapes.seq_len
    logit_tokens = batch.mini_batch_per_rank * shapes.response_len
    flops = step_flops(policy, tokens, shapes.seq_len, logit_tokens)
    if critic_arch is not None:
        flops += step_flops(critic_arch, tokens, shapes.seq_len, 0, lm_head=False)
    return batch, shapes, flops


def add_update_activations(ctx: Context, policy: Any, critic: Any, shapes: cfg.Shapes) -> None:
    """The update's micro-batch (policy and critic in one backward) and the no-grad forward of
    the old log-probs / reference, each alone in its step."""
    train = activation_item(ctx, "policy", policy, shapes)
    ctx.floor = floor_bytes(ctx, policy, shapes, logits=True)
    if critic is not None:
        train += activation_item(ctx, "critic", critic, shapes, logits=False)
        ctx.floor += floor_bytes(ctx, critic, shapes, logits=False)
    who = "policy + critic" if critic is not None else "policy"
    ctx.add(
        Item(
            f"activations + logits, one micro-batch ({who})",
            train,
            "update",
            "activations",
            shapes.note + f" x {shapes.seq_len} tokens",
            transient=True,
        )
    )
    no_grad = activation_item(ctx, "policy", policy, shapes, trainable=False)
    ctx.add(Item("no-grad forward, one micro-batch (old log-probs, reference)", no_grad,
                 "update", "activations", transient=True))  # fmt: skip


def supervised_plan(ctx: Context) -> Result:
    """Reward model (pairs, a scalar head), SFT (rows), DPO (pairs and a reference)."""
    name = cfg.class_name(ctx.config.get("model") or {})
    args = cfg.module_args(ctx.config)
    pairs = name in ("RewardModelModule", "DPOModule")
    batch = cfg.batch_figures(ctx.config, ctx.world, unit="pairs" if pairs else "rows",
                              samples=1, mini=None)  # fmt: skip
    model = str(args.get("model") or "builtin:tiny-llama")
    head = "sequence_classification" if name == "RewardModelModule" else "causal_lm"
    arch, _ = add_trained(ctx, "model", model, head=head)  # type: ignore[arg-type]
    data = cfg.data_args(ctx.config)  # SFTDataModule: max_length; pairs: the module's
    seq = int(args.get("max_length") or data.get("max_length") or data.get("max_prompt_length")
              or 1024)  # fmt: skip
    micro = int(cfg.group(ctx.config, "optim").get("micro_batch_size") or batch.per_rank)
    rows = min(micro, batch.per_rank) * (2 if pairs else 1)
    scored = 0 if head != "causal_lm" else seq
    shapes = cfg.Shapes(seq, scored, rows, None, f"{rows} sequences of max_length {seq}")
    if name == "DPOModule":
        loss = cfg.group(ctx.config, "loss")
        lora = int(cfg.group(ctx.config, "lora").get("rank") or 0)
        if not loss.get("reference_free") and loss.get("kind") != "simpo" and lora == 0:
            dtype = str(
                cfg.group(ctx.config, "precision").get("reference_dtype")
                or cfg.group(ctx.config, "precision").get("dtype")
                or "float32"
            )
            add_frozen(ctx, "reference", str(args.get("reference_model") or model), dtype)
    act = activation_item(ctx, "model", arch, shapes, logits=head == "causal_lm")
    ctx.add(Item("activations + logits, one micro-batch", act, "update", "activations",
                 shapes.note, transient=True))  # fmt: skip
    ctx.floor = floor_bytes(ctx, arch, shapes, logits=head == "causal_lm")
    tokens = batch.per_rank * (2 if pairs else 1) * seq
    return batch, shapes, step_flops(arch, tokens, seq, tokens if scored else 0,
                                     lm_head=head == "causal_lm")  # fmt: skip


def compressor_plan(ctx: Context) -> Result:
    """The compressor (trained, or its LoRA adapters) and the frozen decoder, through which the
    gradient still flows back to the memory tokens."""
    args = cfg.module_args(ctx.config)
    batch = cfg.batch_figures(ctx.config, ctx.world, unit="rows", samples=1, mini=None)
    context = int(args.get("context_tokens") or 64)
    rate = args.get("compression_rate")
    memory = int(args.get("num_memory_tokens") or ceil_div(context, int(rate or 4)))
    train = cfg.init_args(cfg.data_args(ctx.config).get("train") or {})
    continuation = int(train.get("continuation_tokens") or 0)
    compressor, _ = add_trained(ctx, "compressor", str(args.get("compressor")),
                                layers=args.get("compressor_layers"))  # fmt: skip
    decoder = add_frozen(ctx, "decoder", str(args.get("decoder")),
                         str(args.get("decoder_dtype") or "float32"))  # fmt: skip
    micro = min(int(cfg.group(ctx.config, "optim").get("micro_batch_size") or 8), batch.per_rank)
    enc = cfg.Shapes(context + memory, 0, micro, None, f"{micro} rows")
    dec = cfg.Shapes(memory + continuation + context, continuation + context, micro, None, "")
    act = activation_item(ctx, "compressor", compressor, enc, logits=False)
    ctx.floor = floor_bytes(ctx, compressor, enc, logits=False)
    act += activation_item(ctx, "decoder", decoder, dec)
    ctx.floor += floor_bytes(ctx, decoder, dec, logits=True)
    ctx.add(Item("activations + logits, one micro-batch (compressor + decoder)", act, "update",
                 "activations", f"{micro} rows: {context} context + {memory} memory tokens, "
                 f"{continuation} continuation", transient=True))  # fmt: skip
    return batch, enc, step_flops(compressor, batch.per_rank * enc.seq_len, enc.seq_len, 0,
                                  lm_head=False)  # fmt: skip


def family(class_name: str) -> Any:
    if class_name in ("PPOModule", "GenerativeRewardModule"):
        return rl_plan
    if class_name in ("RewardModelModule", "SFTModule", "DPOModule"):
        return supervised_plan
    if class_name == "CompressorDecoderModule":
        return compressor_plan
    raise ValueError(
        f"the plan knows PPOModule, GenerativeRewardModule, RewardModelModule, SFTModule, "
        f"DPOModule and CompressorDecoderModule, not {class_name or 'a config without model'}. "
        "Fix: pass the config of one of those (model.class_path)."
    )
