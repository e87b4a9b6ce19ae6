"""VLLMServerEngine without vLLM: its settings are refused when built, and a server that is
missing, not set up for training or answering errors is named in one line with the fix (a small
HTTP server stands in for ``vllm serve``; the real one is tested in test_vllm_server.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lit_rlhf.rollout import VLLMServerEngine
from lit_rlhf.rollout.server import preflight
from lit_rlhf.rollout.server_client import ServerClient, ServerError
from lit_rlhf.rollout.server_launch import free_port


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"urls": []}, "non-empty list"),
        ({"urls": "http://127.0.0.1:8000"}, "non-empty list"),
        ({"urls": ["127.0.0.1:8000"]}, "http://"),
        ({"temperature": 2.5}, "temperature <= 2"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"sync_timeout_s": float("nan")}, "sync_timeout_s"),
        ({"push": "ipc"}, "push: disk or nccl"),
        ({"push_bucket_bytes": 0}, "push_bucket_bytes"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"dtype": "float8"}, "dtype"),
    ],
)
def test_settings_that_cannot_work_are_refused_when_built(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        VLLMServerEngine(**{"urls": ["http://127.0.0.1:8000"], **kwargs})


class FakeServer(BaseHTTPRequestHandler):
    """Answers like a vllm serve without VLLM_SERVER_DEV_MODE and without --enable-scale-out."""

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        replies = {"/v1/models": {"data": [{"id": "served-model", "max_model_len": 512}]},
                   "/version": {"version": "0.32.0"}}  # fmt: skip
        self._send(200, replies[self.path]) if self.path in replies else self._send(404, {})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/inference/v1/generate":
            self._send(403, {"error": {"message": "Scale-out endpoints are disabled."}})
        else:
            self._send(404, {})

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_server_without_the_rl_endpoints_or_another_model_is_named_with_the_fix(fake_url):
    client = ServerClient(fake_url, 5)
    with pytest.raises(ServerError, match="serves \\['served-model'\\], not 'other'"):
        preflight(client, "other")
    with pytest.raises(ServerError, match="VLLM_SERVER_DEV_MODE=1") as caught:
        preflight(client, "served-model")
    line = caught.value.one_line()
    assert line.startswith("model.init_args.engine.init_args.urls: ") and "\n" not in line
    with pytest.raises(ServerError, match="--enable-scale-out"):
        client.generate([1, 2], {"max_tokens": 1})


def test_a_server_nobody_listens_on_ends_the_first_generate_with_one_line(tiny_policy):
    policy, tokenizer = tiny_policy
    url = f"http://127.0.0.1:{free_port()}"
    engine = VLLMServerEngine([url], request_timeout_s=5)
    batch = tokenizer(["hello"], return_tensors="pt")
    with pytest.raises(ServerError) as caught:
        engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer)
    line = caught.value.one_line()
    assert url in line and "cannot be reached" in line and "Fix: start it" in line
    assert not engine.started


@pytest.fixture
def tiny_policy():
    from lit_rlhf.models import load_causal_lm, load_tokenizer

    return load_causal_lm("builtin:tiny-llama"), load_tokenizer("builtin:tiny-llama")
