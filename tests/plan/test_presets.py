"""The memory plan of every GPU preset, composed as ``lit-rlhf fit`` composes it (with its
header's trainer fragment), on 80 GiB GPUs: the table and the verdict are printed (``pytest
-s``) and asserted. The single-GPU TRE presets fit one GPU with the weight-sync snapshot in host
memory and vLLM asleep in the update; ConsistRM / RFT (Qwen3-8B) are refused with the snapshot
and vLLM kept on the GPU through the update (as the issue found them) and fit as the presets
now run; MGS (Qwen2.5-7B) is refused by the setup check with the plan's numbers, on 141 GB
H200s too."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from lit_rlhf.plan.architectures import exported_models
from lit_rlhf.plan.check import enforce
from lit_rlhf.plan.memory import GiB
from lit_rlhf.plan.report import Plan, format_plan, parse_memory, plan_from_config
from tests.dry_run import compose
from tests.test_preset_dry_run import PRESETS, _header_fragment

GPU = 80 * GiB
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter")
_COMPOSED: dict[str, dict[str, Any]] = {}


def preset_path(name: str) -> Path:
    return next(p for p in PRESETS if p.stem == name)


def composed(name: str) -> dict[str, Any]:
    """The preset ``name`` (a file stem) composed with its header's fragment (cached)."""
    if name not in _COMPOSED:
        path = preset_path(name)
        _COMPOSED[name] = compose(path, _header_fragment(path))
    return copy.deepcopy(_COMPOSED[name])


def preset_plan(config: dict[str, Any], memory: int = GPU) -> Plan:
    devices = config["trainer"].get("devices")
    gpus = None if isinstance(devices, int) and devices > 0 else 8  # a fragment's devices: auto
    # a folder another preset exports (the HH reward model) is that preset's model
    exports = exported_models([PRESETS[0]])
    return plan_from_config(config, gpus=gpus, gpu_memory=memory, arch_map=exports)


def engine_args(config: dict[str, Any]) -> dict[str, Any]:
    return config["model"]["init_args"]["engine"]["init_args"]


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_every_gpu_preset_has_a_plan(preset: str) -> None:
    config = composed(preset)
    plan = preset_plan(config)
    text = format_plan(plan)
    print(f"\n{preset}\n{text}")
    assert plan.world == (config["trainer"]["devices"] if plan.world_source.startswith(
        "trainer") else 8)  # fmt: skip
    states = [i for i in plan.items if i.kind == "state"]
    assert states and all(i.bytes > 0 for i in states), "no trained network in the plan"
    assert all(i.bytes >= 0 for i in plan.items)
    for phase in ("rollout", "update"):
        assert plan.lower_bounds[phase] <= plan.peaks[phase] + plan.floor
    assert plan.lower_bound <= plan.peak, "the lower bound above the estimate"
    assert f"verdict: {plan.verdict}" in text and "global batch:" in text
    assert plan.batch.global_batch == plan.batch.per_rank * plan.world
    assert plan.batch.steps_per_batch >= 1
    engine = (config["model"]["init_args"].get("engine") or {}).get("class_path", "")
    if engine.endswith("VLLMGenerationEngine"):
        assert any(i.kind == "engine" for i in plan.items) and "vLLM" in text
        assert any(i.kind == "snapshot" for i in plan.items)


def n2_fixed(preset: str) -> dict[str, Any]:
    """The preset as it runs, with the N2 fix: the snapshot on the CPU, vLLM asleep in the
    update (level 1)."""
    config = composed(preset)
    assert config["trainer"]["devices"] == 1
    args = engine_args(config)
    assert args["snapshot_device"] == "cpu" and args["enable_sleep_mode"] is True
    return config


def test_countdown_tre_fits_one_gpu_with_the_snapshot_on_cpu_and_vllm_asleep() -> None:
    plan = preset_plan(n2_fixed("countdown_tre"))
    print(f"\ncountdown_tre (snapshot_device: cpu, enable_sleep_mode: true)\n{format_plan(plan)}")
    assert plan.fits and not plan.refused, format_plan(plan)
    vllm = next(i for i in plan.items if i.kind == "engine")
    assert vllm.phase == "rollout" and vllm.bytes == int(0.3 * GPU)
    assert next(i for i in plan.items if i.kind == "snapshot").bytes == 0
    # two float32 networks of 1,543,714,304 (policy) and 1,543,715,841 (critic) parameters:
    # weights, gradients and Adam moments, 16 bytes each
    states = sum(i.bytes for i in plan.items if i.kind == "state")
    assert states == 16 * (1_543_714_304 + 1_543_715_841)
    assert plan.peaks["rollout"] == states + int(0.3 * GPU)


def test_math_tre_fits_one_gpu_with_the_fix_and_two_sequences_per_micro_batch() -> None:
    plan = preset_plan(n2_fixed("math_tre"))
    print(f"\nmath_tre (the N2 fix, optim.micro_batch_size: 2)\n{format_plan(plan)}")
    assert composed("math_tre")["model"]["init_args"]["optim"]["micro_batch_size"] == 2
    assert plan.fits, format_plan(plan)
    config = n2_fixed("math_tre")
    config["model"]["init_args"]["optim"]["micro_batch_size"] = 4  # the preset before the plan
    # 4 sequences of 1,024 + 8,192 tokens per micro-batch: the lower bound fits (the setup
    # check warns, does not refuse), the estimate of the update does not
    doubled = preset_plan(config)
    assert not doubled.refused and not doubled.fits
    assert doubled.peaks["update"] > GPU > doubled.peaks["rollout"]
    with pytest.warns(UserWarning, match="It may not fit"):
        enforce(doubled, "refuse")  # a warning, not a refusal


def test_countdown_tre_without_the_fix_holds_a_float32_snapshot_and_vllm_in_the_update() -> None:
    config = composed("countdown_tre")
    args = engine_args(config)
    # as the issue found it (N2), with the push of then (a full copy to find what changed)
    args.update(snapshot_device=None, enable_sleep_mode=False, push_bucket_bytes=0)
    plan = preset_plan(config)
    snapshot = next(i for i in plan.items if i.kind == "snapshot")
    assert snapshot.bytes == 4 * 1_543_714_304 and snapshot.phase == "both"
    assert next(i for i in plan.items if i.kind == "engine").phase == "both"
    assert plan.lower_bounds["update"] > plan.lower_bounds["rollout"]
    assert not plan.fits


@pytest.mark.parametrize("preset", ["consistrm_qwen3-8b", "rft_qwen3-8b"])
def test_qwen3_8b_judges_are_refused_on_8_x_80_gb_with_the_snapshot_and_vllm_resident(
    preset: str,
) -> None:
    """N3 as the issue found it: a full bf16 snapshot on every GPU and vLLM's 0.4 kept through
    the update, next to ZeRO-3 states (and ConsistRM's 4B embedder): refused at setup."""
    config = composed(preset)
    engine_args(config).update(snapshot_device=None, enable_sleep_mode=False, push_bucket_bytes=0)
    plan = preset_plan(config)
    assert plan.world == 8 and plan.strategy == "DeepSpeed ZeRO-3"
    assert plan.refused, format_plan(plan)
    names = " ".join(i.name for i in plan.items)
    assert "vLLM" in names and "weight-sync snapshot (16-bit)" in names
    snapshot = next(i for i in plan.items if i.kind == "snapshot")
    assert snapshot.bytes == 2 * 8_190_735_360  # a full bf16 copy on every GPU
    if preset.startswith("consistrm"):
        assert "embedder: Qwen/Qwen3-Embedding-4B (float16)" in names
    with pytest.raises(ValueError, match=r"lower bound .* of the GPU's 80\.0 GiB.*Fix:") as err:
        enforce(plan, "refuse")
    assert "vLLM: weights + KV cache 32.0 GiB (both)" in str(err.value)
    enforce(plan, "off")
    with pytest.warns(UserWarning, match="Even the lower bound does not fit"):
        enforce(plan, "warn")


@pytest.mark.parametrize("preset", ["consistrm_qwen3-8b", "rft_qwen3-8b"])
def test_qwen3_8b_judges_fit_8_x_80_gb_as_the_presets_now_run(preset: str) -> None:
    """With the snapshot in host memory and vLLM asleep in the update (the presets' settings),
    the plan's peak is the rollout's: ZeRO-3 states, the reference partition (and the embedder)
    beside vLLM's 32 GiB."""
    config = composed(preset)
    assert engine_args(config)["snapshot_device"] == "cpu"
    assert engine_args(config)["enable_sleep_mode"] is True
    plan = preset_plan(config)
    print(f"\n{preset}\n{format_plan(plan)}")
    assert plan.fits and not plan.refused
    assert plan.peaks["rollout"] >= plan.peaks["update"]


@pytest.mark.parametrize("memory", ["80GiB", "141GB", "140GiB"])
def test_mgs_7b_is_refused_on_80_and_141_gb_gpus(memory: str) -> None:
    plan = preset_plan(composed("multidomain_mgs_qwen2.5-7b"), parse_memory(memory))
    assert plan.strategy == "DeepSpeed ZeRO-2" and plan.world == 8
    # the domains' gradients held through the last backward and the rest of the combination
    surgery = sum(i.bytes for i in plan.items if i.kind == "buffer")
    assert surgery == (3 + 1) * 4 * 7_615_616_512  # 121.8 GB, as the old guard counted
    names = " ".join(i.name for i in plan.items)
    for part in ("reference: Qwen/Qwen2.5-7B", "reward model: Skywork/Skywork-Reward-V2-Llama",
                 "weight-sync snapshot", "gradients, float32 masters, Adam"):  # fmt: skip
        assert part in names
    # the old guard's sum (buffers + bf16 weights) stays under an H200; the plan's does not
    assert surgery + 2 * 7_615_616_512 < parse_memory("140GiB") < plan.lower_bound
    with pytest.raises(ValueError, match="Even the lower bound does not fit"):
        enforce(plan, "refuse")


_HEADER_FIGURE = re.compile(
    r"lit-rlhf plan`?(?: \([^)]*\)| on \d+ x \d+ GB)?[^0-9]{0,60}?(\d+\.\d) GiB"
)


@pytest.mark.parametrize("preset", [p.stem for p in PRESETS])
def test_every_gpu_preset_header_gives_the_plans_peak(preset: str) -> None:
    """The memory figure a preset's header states is the plan's peak per GPU (0.1 GiB)."""
    path = preset_path(preset)
    header = " ".join(
        line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")
    )
    found = _HEADER_FIGURE.search(header)
    assert found, f"{path}: the header gives no 'lit-rlhf plan: <GiB>' figure"
    plan = preset_plan(composed(preset))
    assert float(found.group(1)) == round(plan.peak / GiB, 1), format_plan(plan)


def test_full_fine_tuning_keeps_no_snapshot_with_the_bucketed_push() -> None:
    """The bucketed push (the default) sends every weight of a fully trained policy, so no copy
    is kept wherever ``snapshot_device`` says; LoRA keeps its copy."""
    config = composed("countdown_tre")
    engine_args(config).update(snapshot_device=None)
    snapshot = next(i for i in preset_plan(config).items if i.kind == "snapshot")
    assert (snapshot.name, snapshot.bytes) == ("weight-sync snapshot (none)", 0)
    config["model"]["init_args"]["lora"] = {"rank": 8}
    snapshot = next(i for i in preset_plan(config).items if i.kind == "snapshot")
    assert snapshot.bytes == 4 * 1_543_714_304  # LoRA: the merged weights' float32 copy


def test_a_server_engine_takes_vllm_off_the_training_gpus() -> None:
    """With generation in ``vllm serve`` processes on other GPUs, a training GPU holds no vLLM
    reservation, no snapshot and no KV cache: the ConsistRM judge preset's rollout peak falls
    to its training states (``push: nccl`` adds one bucket while it is broadcast)."""
    config = composed("consistrm_qwen3-8b")
    colocated = preset_plan(config)
    config["model"]["init_args"]["engine"] = {
        "class_path": "lit_rlhf.rollout.VLLMServerEngine",
        "init_args": {"urls": ["http://rollout-node:8000"], "push_bucket_bytes": 1 << 30},
    }
    served = preset_plan(config)
    kinds = {i.kind for i in served.items}
    assert "engine" not in kinds and not any("KV cache" in i.name for i in served.items)
    vllm = sum(i.bytes for i in colocated.items if i.kind == "engine")
    assert vllm > 0 and served.peaks["rollout"] <= colocated.peaks["rollout"] - vllm
    engine_args(config)["push"] = "nccl"
    pushed = preset_plan(config)
    assert pushed.peaks["rollout"] == served.peaks["rollout"] + (1 << 30)


def test_tensor_parallel_vllm_holds_a_share_of_the_weights_per_gpu() -> None:
    """A tensor-parallel colocated engine (``tensor_parallel_size: 2``: two ranks are one vLLM)
    holds half of the served weights on each GPU, beside its own KV cache."""
    config = composed("consistrm_qwen3-8b")
    engine_args(config)["kv_cache_memory_bytes"] = 8 * GiB
    alone = preset_plan(config)
    engine_args(config)["tensor_parallel_size"] = 2
    shared = preset_plan(config)
    vllm = [sum(i.bytes for i in p.items if i.kind == "engine") for p in (alone, shared)]
    weights = vllm[0] - 8 * GiB  # the bf16 policy, as vLLM serves it
    assert weights > 15 * GiB and vllm[1] == 8 * GiB + weights // 2
    assert any("tensor_parallel_size 2" in i.note for i in shared.items)


def test_mgs_7b_fits_8_x_80_gb_under_fsdp2_with_the_domain_gradients_sharded() -> None:
    """Under FSDP2 every rank keeps 1/world of each domain's gradient (PCGrad on the shards),
    and the weights, gradients and Adam states are sharded too: the preset ZeRO-2 cannot hold
    fits 80 GB GPUs."""
    config = compose(preset_path("multidomain_mgs_qwen2.5-7b"), "configs/trainer/fsdp2.yaml")
    plan = preset_plan(config)
    assert plan.world == 8
    surgery = sum(i.bytes for i in plan.items if i.kind == "buffer")
    assert surgery == (3 + 1) * 4 * 7_615_616_512 // 8
    assert plan.fits and not plan.refused
    print(f"\nmultidomain_mgs_qwen2.5-7b + fsdp2.yaml\n{format_plan(plan)}")
