"""Architectures, parameter counts on the meta device (hand-checked against the formulas and
the model cards), model states by strategy (DeepSpeed's own estimators where deepspeed
imports), phases and sizes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lit_rlhf.plan.architectures import TABLE, architecture
from lit_rlhf.plan.memory import (
    Item,
    Strategy,
    deepspeed_gpu_bytes,
    model_state_items,
    phase_bytes,
    zero_gpu_bytes,
)
from lit_rlhf.plan.params import counts, lora_parameter_count, parameter_count
from lit_rlhf.plan.report import parse_memory


def qwen2_formula(h: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> int:
    """Qwen2 by hand: embeddings (tied head), per layer q/k/v with biases, o, the gated MLP
    and two RMSNorms, and the final norm."""
    d = h // heads
    attention = (h * h + h) + 2 * (h * kv * d + kv * d) + h * h
    return vocab * h + layers * (attention + 3 * h * inter + 2 * h) + h


def test_qwen2_5_1_5b_instruct_has_the_model_cards_parameter_count() -> None:
    arch = architecture("Qwen/Qwen2.5-1.5B-Instruct")
    assert arch.source.startswith(
        "https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct/blob/main/config.json (numbers"
    )
    # the model card: 1.54B parameters (1.31B non-embedding), tied word embeddings
    assert parameter_count(arch) == 1_543_714_304 == qwen2_formula(1536, 28, 12, 2, 8960, 151936)
    assert parameter_count(arch) - 151936 * 1536 == 1_310_340_608
    assert parameter_count(arch, "critic") == parameter_count(arch) + 1536 + 1
    assert parameter_count(arch, "sequence_classification") == parameter_count(arch) + 1536


@pytest.mark.parametrize(
    ("name", "billions"),
    [("Qwen/Qwen2.5-7B", 7.62), ("Qwen/Qwen3-8B", 8.19), ("Qwen/Qwen3-4B", 4.02),
     ("Qwen/Qwen2.5-0.5B", 0.49), ("Skywork/Skywork-Reward-V2-Llama-3.1-8B", 8.03)],
)  # fmt: skip
def test_table_rows_give_the_model_cards_sizes(name: str, billions: float) -> None:
    arch = TABLE[name]
    assert arch.source.startswith(f"https://huggingface.co/{name}/blob/main/config.json")
    assert round(parameter_count(arch) / 1e9, 2) == billions


def test_untied_heads_count_twice_and_zero3_sees_the_largest_layer() -> None:
    qwen7b = TABLE["Qwen/Qwen2.5-7B"]
    assert parameter_count(qwen7b) == qwen2_formula(3584, 28, 28, 4, 18944, 152064) + (
        152064 * 3584
    )
    assert counts(qwen7b).largest_layer == 152064 * 3584
    tied = replace(qwen7b, tie_word_embeddings=True)
    assert parameter_count(qwen7b) - parameter_count(tied) == 152064 * 3584


def test_builtin_models_are_read_from_their_specifications() -> None:
    mid = architecture("builtin:mid-llama")
    assert (mid.hidden_size, mid.num_hidden_layers, mid.vocab_size) == (512, 8, 2048)
    assert round(parameter_count(mid) / 1e6, 1) == 22.0  # builtin.py: "random 22.0M parameters"
    assert architecture("builtin:tiny-llama-agent").hidden_size == 64


def test_unknown_paths_are_refused_with_the_arch_fix_and_mapped_or_read(tmp_path: Path) -> None:
    folder = tmp_path / "rm"
    with pytest.raises(ValueError, match=r"--arch .*rm=HUB_ID.*Fix|Fix: pass --arch"):
        architecture(str(folder))
    mapped = architecture(str(folder), {str(folder): "Qwen/Qwen2.5-1.5B-Instruct"})
    assert parameter_count(mapped) == 1_543_714_304 and "--arch" in mapped.source
    folder.mkdir()
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    read = architecture(str(folder))
    assert read.num_key_value_heads == 4 and not read.tie_word_embeddings


def test_lora_counts_rank_times_in_plus_out_per_adapted_matrix() -> None:
    arch = TABLE["Qwen/Qwen2.5-1.5B"]
    # q: 1536 -> 1536, v: 1536 -> 256 (2 KV heads of 128), rank 128, 28 layers
    expected = 28 * 128 * ((1536 + 1536) + (1536 + 256))
    assert lora_parameter_count(arch, 128, ["q_proj", "v_proj"]) == expected


def test_ddp_bf16_mixed_holds_sixteen_bytes_per_float32_parameter() -> None:
    items = model_state_items("policy", 10**9, 0, dtype="float32", strategy=Strategy("ddp"),
                              world=8)  # fmt: skip
    assert sum(i.bytes for i in items) == 16 * 10**9
    assert all(i.phase == "both" for i in items)


@pytest.mark.parametrize(
    ("stage", "offload_optimizer", "offload_parameters"),
    [(2, False, False), (2, True, False), (3, False, False), (3, True, False), (3, True, True)],
)
def test_zero_formulas_agree_with_deepspeeds_estimators(
    stage: int, offload_optimizer: bool, offload_parameters: bool
) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    params, largest, world = 7_615_616_512, 152064 * 3584, 8
    ours = zero_gpu_bytes(params, largest, world, stage, offload_optimizer=offload_optimizer,
                          offload_parameters=offload_parameters)  # fmt: skip
    if stage == 2:
        _, theirs = estimate_zero2_model_states_mem_needs(
            params, num_gpus_per_node=world, cpu_offload=offload_optimizer
        )
    else:
        _, theirs, _ = estimate_zero3_model_states_mem_needs(
            params, largest, num_gpus_per_node=world, cpu_offload=offload_optimizer,
            cpu_offload_params=offload_parameters,
        )  # fmt: skip
    assert ours == theirs
    strategy = Strategy("deepspeed", stage, offload_optimizer, offload_parameters)
    assert deepspeed_gpu_bytes(params, largest, world, strategy) == theirs
    items = model_state_items("policy", params, largest, dtype="bfloat16", strategy=strategy,
                              world=world)  # fmt: skip
    assert sum(i.bytes for i in items) == theirs


def test_a_phase_holds_its_items_and_only_its_largest_step() -> None:
    items = [
        Item("weights", 10, "both", "state"),
        Item("vllm", 5, "rollout", "engine"),
        Item("micro-batch", 7, "update", "activations", transient=True),
        Item("no-grad forward", 3, "update", "activations", transient=True),
    ]
    assert phase_bytes(items, "rollout") == 15
    assert phase_bytes(items, "update") == 17
    assert phase_bytes(items, "update", fixed_only=True) == 10


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", 80 * 2**30), ("141GB", 141 * 10**9), ("80 GiB", 80 * 2**30), ("1024", 1024),
     ("0.5TiB", 2**39)],
)  # fmt: skip
def test_memory_sizes_parse_decimal_and_binary_units(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


def test_a_bad_memory_size_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="Fix: write it as 80GiB"):
        parse_memory("lots")


def test_fsdp2_divides_the_states_by_the_world_and_gathers_one_layer() -> None:
    from lit_rlhf.plan.inputs import strategy

    node = {"class_path": "lit_rlhf.strategies.FSDP2Strategy"}
    fsdp2 = strategy({"trainer": {"strategy": node, "precision": "bf16-mixed"}})
    assert fsdp2.kind == "fsdp"
    items = model_state_items("policy", 8 * 10**9, 10**8, dtype="float32", strategy=fsdp2,
                              world=8)  # fmt: skip
    # 16 bytes per float32 parameter over 8 ranks, plus one float32 layer gathered whole
    assert sum(i.bytes for i in items) == 16 * 10**9 + 4 * 10**8
    assert "FSDP shard" in items[0].note


def test_zero3_counts_what_the_reuse_distance_keeps_gathered() -> None:
    """Under the default stage3_max_reuse_distance (1e9) a model under 5e8 parameters stays
    gathered whole from forward to backward (the CPU measurement of ZeRO-3 saw all of mid-llama's
    weights live); a 7B model keeps its largest layer, as DeepSpeed's estimator says; a config's
    own distance is read."""
    from lit_rlhf.plan.inputs import deepspeed_strategy

    params, largest, world = 400_000_000, 50_000_000, 8
    default = Strategy("deepspeed", 3)
    assert default.gathered(params, largest) == params
    assert default.gathered(7_615_616_512, 152064 * 3584) == 152064 * 3584
    items = model_state_items("policy", params, largest, dtype="bfloat16", strategy=default,
                              world=world)  # fmt: skip
    estimator = deepspeed_gpu_bytes(params, largest, world, default)
    assert sum(i.bytes for i in items) == estimator + 2 * (params - largest)

    tight = deepspeed_strategy({"config": {"zero_optimization": {
        "stage": 3, "stage3_max_reuse_distance": 1e7}}}, "deepspeed", True)  # fmt: skip
    assert tight.max_reuse == 10_000_000 and tight.gathered(params, largest) == largest
    items = model_state_items("policy", params, largest, dtype="bfloat16", strategy=tight,
                              world=world)  # fmt: skip
    assert sum(i.bytes for i in items) == estimator
    fp32 = model_state_items("policy", params, largest, dtype="float32",
                             strategy=replace(default, half=False), world=world)  # fmt: skip
    assert fp32[0].bytes == 4 * params // world + 4 * params
