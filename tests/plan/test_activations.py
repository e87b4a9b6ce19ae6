"""The activation estimate (lit_rlhf.plan.activations) against a measured forward and backward of
``builtin:mid-llama`` on CPU, and the live-bytes tracker (lit_rlhf.plan.tracking) on known
allocations."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.models.builtin import resolve_builtin
from lit_rlhf.models.forward import forward_response
from lit_rlhf.plan.activations import micro_batch_peak_bytes
from lit_rlhf.plan.architectures import architecture
from lit_rlhf.plan.tracking import LiveTensorBytes

MB = 1_000_000


def test_tracker_reads_peaks_by_phase_and_leaves_out_earlier_blocks() -> None:
    before = torch.ones(MB // 4)  # allocated before the tracked stretch: not counted
    tracker = LiveTensorBytes()
    with tracker:
        with tracker.phase("first"):
            a = torch.ones(2 * MB // 4)
            b = torch.ones(3 * MB // 4)
            del a, b
        del before
        with tracker.phase("second"):
            c = torch.ones(MB // 4)
    assert tracker.peak("first") == pytest.approx(5 * MB, abs=4096)
    assert tracker.peak("second") == pytest.approx(MB, abs=4096)
    assert tracker.peak() == pytest.approx(5 * MB, abs=4096)
    assert tracker.at_start("second") == pytest.approx(0, abs=4096)
    assert tracker.untracked_bytes([c]) == 0  # allocated inside
    assert tracker.untracked_bytes([torch.ones(10)]) == 40  # allocated after: outside
    with pytest.raises(ValueError, match="no phase 'third'"):
        tracker.peak("third")


def _measured(dtype: torch.dtype, checkpointing: bool, share: bool, b: int, s: int, r: int) -> int:
    """Peak live bytes of one forward + backward of the update's forward, above the weights and
    their (already allocated) gradients."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_builtin("builtin:mid-llama"), dtype=dtype
    ).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(6, 2048, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, :5] = False  # one left-padded row
    if share:  # two prompts, each row's prompt one of them
        rows = torch.arange(b) % 2
        ids[:, : s - r], mask[:, : s - r] = ids[rows, : s - r], mask[rows, : s - r]

    def loss() -> torch.Tensor:
        out = forward_response(model, ids, mask, ids[:, -r:], temperature=0.7, share_prompts=share)
        return out.log_probs.sum()

    loss().backward()  # the gradients exist, as for every micro-batch after a step's first
    for p in model.parameters():
        assert p.grad is not None
        p.grad.zero_()
    tracker = LiveTensorBytes()
    with tracker:
        loss().backward()
    return tracker.peak()


@pytest.mark.parametrize(
    ("dtype", "checkpointing", "share"),
    [
        (torch.float32, False, False),
        (torch.float32, True, False),
        (torch.float32, False, True),
    ],
    ids=["fp32", "fp32-checkpointing", "fp32-shared-prompts"],
)
def test_estimate_within_15_percent_of_a_measured_step(
    dtype: torch.dtype, checkpointing: bool, share: bool
) -> None:
    b, s, r = 4, 96, 16
    measured = _measured(dtype, checkpointing, share, b, s, r)
    peak = micro_batch_peak_bytes(
        architecture("builtin:mid-llama"), sequences=b, seq_len=s, response_len=r,
        compute_dtype_bytes=2 if dtype == torch.bfloat16 else 4,
        gradient_checkpointing=checkpointing, shared_prompt_rows=2 if share else None,
    )  # fmt: skip
    predicted = peak["activations"] + peak["logits"]
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured)


def test_checkpointing_keeps_less_and_logits_chunking_bounds_the_logits() -> None:
    arch = architecture("builtin:mid-llama")
    kw = {"sequences": 8, "seq_len": 4096, "response_len": 2048, "compute_dtype_bytes": 2}
    full = micro_batch_peak_bytes(arch, gradient_checkpointing=False, **kw)
    ckpt = micro_batch_peak_bytes(arch, gradient_checkpointing=True, **kw)
    chunked = micro_batch_peak_bytes(arch, gradient_checkpointing=True, logits_chunk=1024, **kw)
    assert ckpt["activations"] < full["activations"] / 3
    assert chunked["logits"] < ckpt["logits"] / 2
    no_grad = micro_batch_peak_bytes(arch, gradient_checkpointing=False, trainable=False, **kw)
    assert no_grad["activations"] < ckpt["activations"]


def test_bad_shapes_are_refused_with_the_fix() -> None:
    arch = architecture("builtin:mid-llama")
    with pytest.raises(ValueError, match=r"response_len=20 .* Fix"):
        micro_batch_peak_bytes(
            arch, sequences=1, seq_len=10, response_len=20, compute_dtype_bytes=2,
            gradient_checkpointing=False,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"attention='flash'\. Fix"):
        micro_batch_peak_bytes(
            arch, sequences=1, seq_len=10, response_len=5, compute_dtype_bytes=2,
            gradient_checkpointing=False, attention="flash",
        )  # fmt: skip
