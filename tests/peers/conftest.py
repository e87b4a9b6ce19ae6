"""The parity suite against peers' own code (TRL 1.16, OpenRLHF's formulas): runs in the vLLM venv
(``make test-vllm``, marker ``vllm``; ``-m peers`` selects it alone). The default venv has no TRL:
its run deselects these tests by marker, and nothing here imports TRL at collection.

A missing TRL fails every case that needs it (the ``trl`` fixture raises), never skips: the
suite must not pass vacuously. The terminal summary prints the case count."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
_outcomes: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """The cases are tiny matmuls: one intra-op thread is ~10x faster than two fighting over a
    busy CI machine's cores. Restored after the module (other vllm tests share the process)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def trl() -> Any:
    """TRL itself (``trl==1.16.0`` in ``.venv-vllm``): an ImportError fails the case."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        import trl as trl_module
    except ImportError as error:
        pytest.fail(
            f"tests/peers needs TRL ({error}); it is installed in .venv-vllm by `make venv-vllm` "
            "(trl==1.16.0). Run the suite with `make test-vllm`.",
            pytrace=False,
        )
    version = trl_module.__version__
    assert version == "1.16.0", f"the parity cases pin TRL 1.16.0 (the Makefile's), found {version}"
    return trl_module


def _in_peers(nodeid: str) -> bool:
    return nodeid.replace("\\", "/").startswith("tests/peers/")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _in_peers(report.nodeid):
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if hasattr(report, "wasxfail") and report.passed:
            outcome = "xpassed"
        _outcomes[outcome] += 1


def pytest_terminal_summary(terminalreporter: Any) -> None:
    total = sum(_outcomes.values())
    if total:
        parts = ", ".join(f"{n} {k}" for k, n in sorted(_outcomes.items()))
        terminalreporter.write_line(f"tests/peers: {total} parity cases ({parts})")
        from tests.peers.test_trl_parity import CASES, uncovered_rows

        rows, uncovered = uncovered_rows()
        terminalreporter.write_line(
            f"tests/peers: {len(rows) - len(uncovered)} of {len(rows)} rows of docs/algorithms.md's"
            f" TRL table have a case ({len(CASES)} TRL cases with the combinations)"
        )
