"""scripts/bench/grm.py runs on a CPU: its trainer precision fits the CPU (issue 21: bf16
autocast on a CPU without native bf16 is several times slower than float32)."""

from __future__ import annotations

import pytest

from scripts.bench import grm


@pytest.mark.parametrize(
    ("flags", "asked", "expected"),
    [
        (frozenset({"avx2", "fma"}), "auto", "32-true"),  # no native bf16: float32
        (frozenset({"avx2", "avx512_bf16"}), "auto", "bf16-mixed"),
        (frozenset({"amx_bf16"}), "auto", "bf16-mixed"),
        (frozenset({"avx2"}), "bf16-mixed", "bf16-mixed"),  # an explicit value is kept
    ],
)
def test_precision_fits_the_cpu(monkeypatch, flags, asked, expected):
    monkeypatch.setattr("lit_rlhf.training.precision.cpu_flags", lambda: flags)
    assert grm.trainer_precision(asked) == expected
