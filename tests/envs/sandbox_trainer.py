"""A trainer stand-in for tests/envs/test_sandbox_escapes.py: it runs programs in the code
sandbox from its own process, so that its environment holds a secret, its pid can be signalled
(SIGUSR1 and SIGIO are counted) and it can run as another user, and reports what happened as
JSON on stdout.

Usage: ``python tests/envs/sandbox_trainer.py REPO [--no-userns] [--no-hook]`` with a JSON
request on stdin: ``{"programs": [code, ...], "allow_weak": bool, "timeout_s": float}``;
``TRAINER_PID`` in a program becomes this process's pid. ``--no-userns`` makes ``unshare``
fail as on a host that blocks (unprivileged) namespaces; ``--no-hook`` runs each program in a
plain interpreter under the OS layers alone (``enter_sandbox``), as if the audit hook were
switched off. It needs only the standard library: ``lit_rlhf.envs`` is stubbed so that its
``__init__`` (the training stack) is not imported.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types


class _NoNamespaces:
    """The C library, but ``unshare`` fails (EPERM), as where namespaces are blocked."""

    def __init__(self, libc: object) -> None:
        self._libc = libc

    def unshare(self, flags: int) -> int:
        return -1

    def __getattr__(self, name: str) -> object:
        return getattr(self._libc, name)


def _without_hook(code: str, timeout_s: float) -> dict[str, object]:
    """Runs ``code`` in ``python -I -S`` under the OS layers only (no bootstrap, no hook)."""
    import subprocess
    import tempfile
    from functools import partial

    from lit_rlhf.envs.sandbox_layers import SandboxLimits, enter_sandbox

    limits = SandboxLimits(cpu_s=5, memory_bytes=512 * 2**20, file_bytes=2**20)
    with tempfile.TemporaryDirectory() as tmp:
        scratch, source = (os.path.join(os.path.realpath(tmp), n) for n in ("scratch", "tool.py"))
        os.mkdir(scratch)
        with open(source, "w") as file:
            file.write(code)
        done = subprocess.run(
            [sys.executable, "-I", "-S", source],
            preexec_fn=partial(enter_sandbox, scratch, limits),
            cwd=scratch, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
            timeout=timeout_s, start_new_session=True,
        )  # fmt: skip
    return {"reason": "bare", "stdout": done.stdout, "stderr": done.stderr, "layers": []}


def main() -> None:
    repo = sys.argv[1]
    sys.path.insert(0, repo)
    package = types.ModuleType("lit_rlhf.envs")
    package.__path__ = [os.path.join(repo, "lit_rlhf", "envs")]
    sys.modules["lit_rlhf.envs"] = package
    from lit_rlhf.envs import sandbox_layers
    from lit_rlhf.envs.sandbox import WeakSandboxError, run_python

    if "--no-userns" in sys.argv:
        sandbox_layers._LIBC = _NoNamespaces(sandbox_layers._LIBC)  # type: ignore[assignment]
    received: list[int] = []
    for signum in (signal.SIGUSR1, signal.SIGIO):
        signal.signal(signum, lambda signum, frame: received.append(signum))
    request = json.load(sys.stdin)
    results = []
    for program in request["programs"]:
        code = program.replace("TRAINER_PID", str(os.getpid()))
        try:
            if "--no-hook" in sys.argv:
                results.append(_without_hook(code, request["timeout_s"]))
                results[-1]["signals"] = len(received)
                continue
            result = run_python(
                code, timeout_s=request["timeout_s"], allow_weak_sandbox=request["allow_weak"]
            )
            record = {
                "reason": result.reason,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "layers": list(result.layers),
                "wall_s": result.wall_s,
            }
        except WeakSandboxError as err:
            record = {"weak": str(err)}
        time.sleep(0.05)  # a signal sent to this process is handled by now
        record["signals"] = len(received)
        received.clear()
        results.append(record)
    json.dump({"uid": os.getuid(), "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
