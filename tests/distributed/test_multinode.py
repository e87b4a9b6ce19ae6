"""Multi-node as users launch it, on localhost: two torchrun launches (one per node rank, 1
process each) train and resume; two processes started as ``srun`` would start them (simulated
``SLURM_*`` variables) run under Lightning's SLURMEnvironment with the right ranks; the
preflight ends a run whose node rank 1 never starts within its deadline, with one line naming the
missing rank (lit_rlhf/strategies/preflight.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy

from lit_rlhf.strategies.preflight import PreflightError, preflight_timeout, run_preflight
from tests.distributed.launch import REPO, run_python

pytestmark = pytest.mark.distributed

_FIT = ["-m", "lit_rlhf.cli", "fit", "--config", "configs/ppo/countdown_tiny.yaml",
        "--trainer.num_nodes=2", "--trainer.devices=1", "--trainer.strategy=ddp",
        "--trainer.logger=false", "--trainer.callbacks=null",
        "--trainer.limit_val_batches=0"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def _slurm(rank: int, port: int, **extra: str) -> dict[str, str]:
    """The variables srun gives task ``rank`` of 2 tasks, one per node, both on localhost."""
    return _env(
        SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_PROCID=str(rank),
        SLURM_LOCALID="0", SLURM_NODEID=str(rank), SLURM_JOB_NODELIST="localhost",
        SLURM_NODELIST="localhost", SLURM_JOB_NAME="multinode", SLURM_JOB_ID="4242",
        MASTER_PORT=str(port), **extra,
    )  # fmt: skip


def _run_all(commands: list[tuple[list[str], dict[str, str]]], timeout: float) -> list[str]:
    """Start every command at once, wait for all; each must exit 0. Returns their outputs."""
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for cmd, env in commands
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0].decode())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-4000:]
    return outputs


def _torchrun(node_rank: int, port: int, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
            "--rdzv-conf=timeout=60", *_FIT, f"--trainer.default_root_dir={root}",
            *extra]  # fmt: skip


@pytest.mark.slow
def test_torchrun_two_nodes_train_and_resume(tmp_path: Path) -> None:
    """Node ranks 0 and 1, each its own torchrun, train 2 steps and save; the same two launches
    resume from that checkpoint to step 3 (in epoch 1: max_steps ended epoch 0 at the save)."""
    port = _free_port()
    outputs = _run_all(
        [(_torchrun(r, port, tmp_path, "--trainer.max_steps=2"), _env()) for r in (0, 1)], 240
    )
    assert "preflight: 2 of 2 ranks met at 127.0.0.1:" in outputs[0]
    assert "(TorchElasticEnvironment): rank 0 node 0 local 0" in outputs[0]
    ckpt = tmp_path / "checkpoints" / "last.ckpt"  # the config's PeriodicCheckpoint
    assert torch.load(ckpt, weights_only=True)["global_step"] == 2
    port = _free_port()
    resumed = tmp_path / "resumed"
    more = ["--trainer.max_steps=3", "--trainer.max_epochs=2"]  # the save ended epoch 0
    _run_all(
        [(_torchrun(r, port, resumed, *more, f"--ckpt_path={ckpt}"), _env())
         for r in (0, 1)],
        240,
    )  # fmt: skip
    last = resumed / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 3


@pytest.mark.slow  # 32 s: make test-slow (make test stays near its budget)
def test_slurm_two_tasks_detect_slurm_and_their_ranks(tmp_path: Path) -> None:
    """Two processes with the variables srun gives its tasks: Lightning picks SLURMEnvironment,
    SLURM_PROCID / SLURM_NODEID become global and node ranks, and the run trains and saves."""
    port = _free_port()
    cmd = [sys.executable, *_FIT, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=2"]
    outputs = _run_all([(cmd, _slurm(r, port)) for r in (0, 1)], 240)
    line = next(li for li in outputs[0].splitlines() if li.startswith("preflight:"))
    assert f"2 of 2 ranks met at localhost:{port}" in line
    assert "(SLURMEnvironment): rank 0 node 0 local 0" in line
    assert "; rank 1 node 1 local 0" in line
    assert "preflight:" not in outputs[1]  # rank 0 reports
    ckpt = tmp_path / "checkpoints" / "last.ckpt"  # the config's PeriodicCheckpoint
    assert torch.load(ckpt, weights_only=True)["global_step"] == 2


def test_preflight_names_the_rank_that_never_arrives(tmp_path: Path) -> None:
    """Node rank 1 is never started: rank 0 ends within the 10 s deadline (plus start-up) with
    exit code 1 and one line naming rank 1, the rendezvous and the fix, not a 30-minute hang."""
    port = _free_port()
    cmd = [sys.executable, *_FIT, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=2"]
    start = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=REPO, env=_slurm(0, port, LIT_RLHF_PREFLIGHT_TIMEOUT_S="10"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [li for li in (proc.stdout + proc.stderr).splitlines() if "preflight" in li]
    assert len(lines) == 1, lines
    assert lines[0].startswith("lit-rlhf: error: preflight: rank(s) 1 of 2 did not arrive")
    assert f"within 10 s at the rendezvous localhost:{port}" in lines[0]
    assert "Fix: start the launch of every node" in lines[0]
    assert 10 <= elapsed < 70, elapsed
    assert not list(tmp_path.glob("checkpoints/*.ckpt"))


def _rank_of_two(monkeypatch: pytest.MonkeyPatch, node_rank: int, address: str) -> DDPStrategy:
    """Lightning's DDP strategy for node rank ``node_rank`` of 2 (1 process each), rendezvous at
    ``address``; its process group is not created."""
    monkeypatch.setenv("NODE_RANK", str(node_rank))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", address)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("LIT_RLHF_PREFLIGHT_TIMEOUT_S", "2")
    strategy = DDPStrategy(
        cluster_environment=LightningEnvironment(), parallel_devices=[torch.device("cpu")]
    )
    strategy.num_nodes = 2  # as the Trainer sets it from trainer.num_nodes
    return strategy


def test_rendezvous_unreachable_fails_within_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 with nobody listening at MASTER_ADDR:MASTER_PORT, and with a host name that does
    not resolve; rank 0 on a port already taken: a PreflightError naming the address and the
    fix, within the 2 s deadline."""
    start = time.monotonic()
    with pytest.raises(PreflightError, match=r"rank 1 of 2 could not reach the rendezvous 127"):
        run_preflight(_rank_of_two(monkeypatch, 1, "127.0.0.1"))
    assert time.monotonic() - start < 10
    with pytest.raises(PreflightError, match=r"'no-such-host\.invalid' does not resolve.*Fix:"):
        run_preflight(_rank_of_two(monkeypatch, 1, "no-such-host.invalid"))
    with socket.socket() as busy:  # rank 0 cannot host it on a port another process holds
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        strategy = _rank_of_two(monkeypatch, 0, "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        with pytest.raises(PreflightError, match=r"cannot host .* port is in use.*MASTER_PORT"):
            run_preflight(strategy)


def test_preflight_timeout_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIT_RLHF_PREFLIGHT_TIMEOUT_S", raising=False)
    assert preflight_timeout() == 60.0
    monkeypatch.setenv("LIT_RLHF_PREFLIGHT_TIMEOUT_S", "7.5")
    assert preflight_timeout() == 7.5
    for bad in ("0", "-3", "soon", "inf"):
        monkeypatch.setenv("LIT_RLHF_PREFLIGHT_TIMEOUT_S", bad)
        with pytest.raises(PreflightError, match=r"not a positive number of seconds\. Fix:"):
            preflight_timeout()


def test_an_engine_that_fails_to_start_on_one_rank_stops_every_rank_at_once(tmp_path):
    # rank 1's start raises; rank 0's succeeds and would otherwise wait in the next collective
    out = tmp_path / "agree"
    run_python("-m", "tests.distributed.run_agreement", str(out), timeout=120)
    for rank in (0, 1):
        seconds, got = (tmp_path / f"agree.rank{rank}.txt").read_text().split("\n", 1)
        assert float(seconds) < 10
        assert got.startswith("EngineStartError: the engine's start failed on rank(s) 1 of 2")
        assert f"this is rank {rank}" in got and "no model folder /models/missing" in got
    assert "[cause: FileNotFoundError]" in (tmp_path / "agree.rank1.txt").read_text()
