"""MGS under DDP (2 CPU processes, gloo): per-domain gradients reduced across ranks per domain
before surgery give exactly the single-process result on the union of both ranks' data, although
each rank lacks one domain; averaging across ranks before splitting by domain (the authors'
order) gives a different step on the same data (``pytest -m distributed``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed


def _run(mode: str, granularity: str, tmp: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = tmp / f"{mode}-{granularity}"
    run_python("-m", "tests.distributed.run_mgs", mode, granularity, str(out), timeout=180)
    return {p.name: torch.load(p) for p in sorted(tmp.glob(f"{out.name}*.rank*.pt"))}


@pytest.mark.parametrize("granularity", ["tensor", "global"])
def test_ddp_surgery_equals_one_process_on_all_data(granularity: str, tmp_path: Path) -> None:
    (single,) = _run("single", granularity, tmp_path).values()
    ddp = list(_run("ddp", granularity, tmp_path).values())
    assert len(ddp) == 2
    for rank in ddp:  # both ranks step with the identical projected gradient
        for name, value in single.items():
            torch.testing.assert_close(rank[name], value, atol=1e-6, rtol=0)
    authors = list(_run("authors", granularity, tmp_path).values())
    worst = max(float((authors[0][n] - single[n]).abs().max()) for n in single)
    assert worst > 1e-3, f"averaging before splitting should change the step (max diff {worst})"
