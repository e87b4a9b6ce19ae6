"""scripts/bench: the shared runner (machine description, JSON, Markdown table) and every
benchmark's ``--smoke`` run that the default venv can run (tiny sizes, one repeat). The slower
smoke runs (fresh child processes per arm) are marked slow; the peer benchmark runs in the vLLM
venv (TRL is there); a benchmark that cannot run here is skipped with the reason."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from scripts.bench import machine, runner
from scripts.bench.__main__ import NAMES, main

ROOT = Path(__file__).resolve().parents[2]

FLAGS = "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
SLOW = {"exploration", "mgs", "packing", "lora_memory", "overlap"}
SKIP: dict[str, str] = {}  # name -> why its smoke run cannot run here


def test_machine_description_has_the_bf16_flags_and_both_gemm_rates() -> None:
    model, bf16 = machine.cpu("model name\t: Some CPU\n" + FLAGS)
    assert model == "Some CPU" and bf16 == ["avx512_bf16", "amx_bf16"]
    assert machine.cpu("model name\t: Old CPU\nflags\t\t: fpu avx2\n") == ("Old CPU", [])
    probe = machine.Machine(smoke=True)
    info = probe.close()
    assert isinstance(info["native_bf16"], list) and info["threads"] == torch.get_num_threads()
    assert set(info["gemm_start"]) == set(info["gemm_end"]) == {"fp32", "bf16"}
    assert 0 <= info["other_cpu_share"] <= 1
    assert "native bf16:" in probe.header() and probe.footer()[0].startswith("GEMM rates")


def test_disturbed_run_says_so() -> None:
    probe = machine.Machine(smoke=True)
    probe.info |= {"other_cpu_share": 0.5, "gemm_end": probe.info["gemm_start"]}
    assert probe.footer()[-1].startswith("DISTURBED")
    probe.info["other_cpu_share"] = 0.0
    assert not any(line.startswith("DISTURBED") for line in probe.footer())


def test_table_spread_and_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    report = runner.Report()
    report.table(["arm", "step"], [("a", 1), ("b", 2)])
    assert capsys.readouterr().out == "| arm | step |\n|---|---|\n| a | 1 |\n| b | 2 |\n"
    assert runner.spread([3.0, 1.0, 2.0], ".1f", unit=" s") == "2.0 s (1.0-3.0)"
    assert runner.ratio([2.0, 3.0, 1.0], [1.0, 1.0, 1.0]) == "2.000x (1.000-3.000)"
    assert runner.order(["A", "B"], 1) == ["B", "A"]


def _smoke(name: str, tmp_path, capsys, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main([name, "--smoke", "--json", str(out), *extra]) == 0
    printed = capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["benchmark"] == name and record["results"]
    assert "native_bf16" in record["machine"] and "other_cpu_share" in record["machine"]
    assert "| " in printed and "GEMM rates" in printed
    return record


def _marks(name: str) -> list[pytest.MarkDecorator]:
    if name == "peer_trl":  # TRL lives in .venv-vllm: make test-vllm
        return [pytest.mark.vllm]
    if name in SKIP:
        return [pytest.mark.skip(reason=SKIP[name])]
    return [pytest.mark.slow] if name in SLOW else []


@pytest.fixture
def global_logging() -> Iterator[None]:
    """A benchmark is a program of its own and quiets Lightning's logger and transformers'
    progress bars for its tables; run in this process, that is undone after it."""
    from transformers.utils import logging as hf_logging

    logger = logging.getLogger("lightning.pytorch")
    level, bars_off = logger.level, hf_logging.is_progress_bar_enabled() is False
    yield
    logger.setLevel(level)
    if not bars_off:
        hf_logging.enable_progress_bar()


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in NAMES])
@pytest.mark.usefixtures("global_logging")
def test_smoke(name: str, tmp_path, capsys) -> None:
    extra = ("--out", str(tmp_path / "runs")) if name == "precision" else ()
    extra = ("--profile",) if name == "peer_trl" else extra
    if name == "lora_memory" and importlib.util.find_spec("peft") is None:
        pytest.skip("needs peft (the [lora] extra)")
    record = _smoke(name, tmp_path, capsys, *extra)
    if name == "compressor":
        assert "same work: OK" in "\n".join(record["table"])
    if name == "peer_trl":  # both frameworks timed and profiled; matmuls outside generation
        for kind in ("decode", "trl"):
            profile = record["results"][f"profile/tiny/beta=0/{kind}"]
            assert profile["steps"] == 1 and profile["categories"]["GEMM"]["rest"] > 0
        assert {row["kind"] for row in record["results"]["tiny/beta=0"]} == {"decode", "trl"}


def test_cli_lists_the_benchmarks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in NAMES)
    assert main(["no-such-bench"]) == 2


def test_a_smoke_run_from_the_command_line_writes_its_json(tmp_path) -> None:
    """As a user runs it: ``python -m scripts.bench NAME --smoke --json PATH`` in a subprocess."""
    out = tmp_path / "grm.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench", "grm", "--smoke", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert "native bf16:" in done.stdout and record["machine"]["threads"] >= 1
