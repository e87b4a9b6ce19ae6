"""MGS under DDP and DeepSpeed ZeRO-1/2 (2 CPU processes, gloo): per-domain gradients reduced
across ranks per domain before surgery give exactly the single-process result on the union of
both ranks' data, although each rank lacks one domain; averaging across ranks before splitting by
domain (the authors' order) gives a different step on the same data; ZeRO-3 is refused at setup
with the fix (``pytest -m distributed``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.launch import fit_with_fragment, run_python

pytestmark = pytest.mark.distributed


def _run(mode: str, granularity: str, tmp: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = tmp / f"{mode}-{granularity}"
    run_python("-m", "tests.distributed.run_mgs", mode, granularity, str(out), timeout=180)
    return {p.name: torch.load(p) for p in sorted(tmp.glob(f"{out.name}*.rank*.pt"))}


def _assert_equal_on_both_ranks(
    mode: str, granularity: str, tmp_path: Path
) -> dict[str, torch.Tensor]:
    """Both ranks of ``mode`` end with the single-process weights; returns those."""
    (single,) = _run("single", granularity, tmp_path).values()
    ranks = list(_run(mode, granularity, tmp_path).values())
    assert len(ranks) == 2
    for rank in ranks:  # both ranks step with the identical projected gradient
        for name, value in single.items():
            torch.testing.assert_close(rank[name], value, atol=1e-6, rtol=0)
    return single


@pytest.mark.parametrize(
    "granularity", ["tensor", pytest.param("global", marks=pytest.mark.slow)]
)  # the global case, 20 s, in -m slow
def test_ddp_surgery_equals_one_process_on_all_data(granularity: str, tmp_path: Path) -> None:
    single = _assert_equal_on_both_ranks("ddp", granularity, tmp_path)
    authors = list(_run("authors", granularity, tmp_path).values())
    worst = max(float((authors[0][n] - single[n]).abs().max()) for n in single)
    assert worst > 1e-3, f"averaging before splitting should change the step (max diff {worst})"


def test_fsdp2_surgery_on_gradient_shards_equals_one_process_on_all_data(tmp_path: Path) -> None:
    # each rank holds half of every parameter and of every domain's gradient, and one domain
    # fewer than the other: PCGrad's inner products are summed over the ranks, the padding
    # backwards keep the collectives in step
    _assert_equal_on_both_ranks("fsdp2", "module", tmp_path)


@pytest.mark.parametrize(  # ZeRO-1's case (18 s) in -m slow: ZeRO-2 partitions the gradients too
    "mode", [pytest.param("zero1", marks=pytest.mark.slow), "zero2"]
)
def test_deepspeed_surgery_equals_one_process_on_all_data(mode: str, tmp_path: Path) -> None:
    _assert_equal_on_both_ranks(mode, "module", tmp_path)


def test_deepspeed_zero3_is_refused_with_the_fix(tmp_path: Path) -> None:
    run_python("-m", "tests.distributed.run_mgs", "zero3", "module", str(tmp_path / "z3"),
               timeout=180)  # fmt: skip
    message = (tmp_path / "z3.refused").read_text()
    assert "ZeRO-3" in message and "Fix: use ZeRO stage 1 or 2" in message


def test_multidomain_ppo_with_mgs_runs_under_zero2(tmp_path: Path) -> None:
    output = fit_with_fragment(
        "cpu_deepspeed_zero2", tmp_path, config="configs/ppo/multidomain_tiny.yaml"
    )
    assert "`Trainer.fit` stopped: `max_steps=1` reached." in output
