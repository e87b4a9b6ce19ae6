"""PPO under DDP and DeepSpeed ZeRO-2/3 on 2 CPU processes (``pytest -m distributed``; about
3 minutes on 2 cores). Each run is a subprocess (tests/distributed/run_ppo.py, or the CLI).

Weights after 2 epochs x 2 rollouts x 2 PPO epochs = 8 optimizer steps must match a single
process that sees the same rollouts (run_ppo.py explains why they are the same): measured max
|difference| 1.2e-6 (ZeRO-3) and 1.4e-6 (ZeRO-2; DDP 7.5e-7), while training moved every weight
tensor by 6e-3 to 2e-2 (max |change| per tensor).
``ATOL`` = 1e-5 leaves room for float summation order and is still far below what any real
difference did here: gradients of only the last micro-batch gave 3e-2, an uninitialised value
head 1e-1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.launch import fit_with_fragment, run_python

pytestmark = pytest.mark.distributed

ATOL = 1e-5
STEPS, EPOCHS = 2, 2  # rollouts per epoch, epochs


def run_ppo(tmp: Path, name: str, kind: str, devices: int, *flags: str) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    run_python("-m", "tests.distributed.run_ppo", kind, str(devices), str(STEPS), str(out), *flags)
    summary = json.loads(out.read_text())
    summary["weights"] = lambda tag, rank=0: torch.load(f"{out}.{tag}.rank{rank}.pt")
    return summary


def assert_weights_close(actual: dict, expected: dict, atol: float = ATOL) -> None:
    assert actual.keys() == expected.keys()
    worst = max((float((actual[k] - expected[k]).abs().max()), k) for k in expected)
    assert worst[0] <= atol, f"max |difference| {worst[0]:.3g} in {worst[1]} (atol {atol})"


@pytest.fixture(scope="module")
def single_process(tmp_path_factory, tiny_model_dir) -> dict[str, Any]:
    """The reference: one process, no strategy, all prompts of each rollout at once."""
    tmp = tmp_path_factory.mktemp("single")
    ref = run_ppo(tmp, "single", "plain", 1, "--epochs", str(EPOCHS))
    start, end = ref["weights"]("init"), ref["weights"](f"epoch{EPOCHS - 1}")
    # every trainable tensor moved, by far more than the tolerance
    assert all(float((end[k] - start[k]).abs().max()) > 100 * ATOL for k in start)
    return ref


@pytest.mark.parametrize(
    "kind", [pytest.param("zero2", marks=pytest.mark.slow), "zero3"]
)  # ZeRO-2's case, 31 s, in -m slow
def test_save_and_resume_continue_like_one_uninterrupted_process(single_process, tmp_path, kind):
    """Two processes under ZeRO match one process epoch by epoch, and a sharded checkpoint
    resumes into the run one uninterrupted process makes (ZeRO-3 here; ZeRO-2 in -m slow)."""
    ckpt = tmp_path / "epoch0.ckpt"
    first = run_ppo(tmp_path, "first", kind, 2, "--epochs", "1", "--save-checkpoint", str(ckpt))
    assert ckpt.is_dir()  # DeepSpeed's sharded checkpoint folder
    assert_only_trained_weights_saved(ckpt)
    assert (first["global_step"], first["rollout_step"], first["tre_steps"]) == (4, 2, 4)
    assert_weights_close(first["weights"]("epoch0"), single_process["weights"]("epoch0"))
    # both ranks gather the same full weights; DeepSpeed's pre-clip norm of the averaged
    # gradient = torch's on the single process
    assert_weights_close(first["weights"]("epoch0", 1), first["weights"]("epoch0"), atol=0.0)
    assert first["grad_norms"] == pytest.approx(single_process["grad_norms"][:STEPS], rel=1e-4)
    assert first["strategy"] == "CPUDeepSpeedStrategy" and first["world_size"] == 2

    flags = ("--epochs", str(EPOCHS), "--resume", str(ckpt))
    resumed = run_ppo(tmp_path, "resumed", kind, 2, *flags)
    # weights come back exactly; the optimizer step, rollout and TRE schedule counters continue
    assert_weights_close(resumed["weights"]("init"), first["weights"]("epoch0"), atol=0.0)
    assert (resumed["global_step"], resumed["rollout_step"], resumed["tre_steps"]) == (8, 4, 8)
    # and so does AdamW's state: the second epoch ends where the uninterrupted run's does
    last = f"epoch{EPOCHS - 1}"
    assert_weights_close(resumed["weights"](last), single_process["weights"](last))
    assert resumed["grad_norms"] == pytest.approx(single_process["grad_norms"][STEPS:], rel=1e-4)

    if kind == "zero3":
        return  # partitioned tensors have no shape to compare: DeepSpeed's own error there
    # the folder of another policy size is refused before any optimizer state is read
    out = tmp_path / "other.json"
    args = (
        kind,
        "2",
        str(STEPS),
        str(out),
        "--resume",
        str(ckpt),
        "--model",
        "builtin:small-llama",
    )
    printed = run_python("-m", "tests.distributed.run_ppo", *args, expect_failure=True)
    assert "are not this module's networks (model: checkpoint " in printed
    assert "tiny-llama" in printed and "small-llama" in printed and "of another shape" in printed


def assert_only_trained_weights_saved(folder: Path) -> None:
    """lit-rlhf's DeepSpeed strategy leaves the frozen reference (kl_coef > 0) out of the folder:
    the model-states file holds the policy and critic, no ``ref_policy.`` key and no frozen
    fragments; the resume above rebuilds the reference from its source."""
    files = sorted(folder.glob("checkpoint/*model_states.pt"))
    assert files, f"no model-states file in {folder}"
    state = torch.load(files[0], map_location="cpu", weights_only=False)  # DeepSpeed's own file
    keys = list(state["module"])
    assert any(k.startswith("policy.") for k in keys) and any(k.startswith("critic.") for k in keys)
    assert not [k for k in keys if k.startswith("ref_policy.")]
    assert not state.get("frozen_param_fragments")


@pytest.mark.parametrize("fragment", ["cpu_deepspeed_zero2", "cpu_deepspeed_zero3", "ddp"])
def test_trainer_fragment_runs_on_two_processes(fragment, tiny_model_dir, tmp_path):
    # the tiny Countdown config with HF generate: sampled responses of different lengths per
    # rank (ZeRO-3: generation in lock-step, synced_gpus), validation (MetricsPlot writes nothing
    # under fast_dev_run)
    output = fit_with_fragment(fragment, tmp_path)
    assert "MEMBER: 2/2" in output
