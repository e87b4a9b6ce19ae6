"""A Python code tool for RL rollouts: model-written code runs in a limited subprocess.

:func:`run_python` runs the code with ``python -I -S -B`` (no environment variables, no site
packages, no bytecode writes) in a fresh scratch folder, under these layers:

- OS layers (:mod:`lit_rlhf.envs.sandbox_layers`), where the kernel allows them (root or
  CAP_SYS_ADMIN): no network (an empty network namespace), no other process in sight (a PID
  namespace), a read-only file system except the scratch folder, no capabilities;
- resource limits, always: CPU seconds, address space (memory), file size, open files;
- an audit hook, always (:mod:`lit_rlhf.envs.sandbox_boot`): it refuses sockets, new
  processes, signals, ``ctypes`` and writes outside the scratch folder;
- a wall-clock timeout that kills the whole process group.

Every outcome comes back as a :class:`SandboxResult` (never an exception that would end a run),
and :class:`PythonTool` turns it into an observation text. ``SandboxResult.layers`` says which
layers held. What is not protected against: kernel exploits and interpreter bugs (this is a
guard for model-written code, not a boundary against a determined attacker); reading files
(the code can read whatever the parent can, e.g. the training data); without the OS layers
(non-root, or a kernel without namespaces) the audit hook alone guards the network and the
file system, and only Python-level operations (a C extension the code could load would pass it;
``ctypes`` is refused). Threads are allowed. ``preexec_fn`` runs between fork and exec, which
CPython calls unsafe in a process with threads: it makes only system calls, holding no lock.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from typing import IO, Literal

from lit_rlhf.envs import sandbox_boot
from lit_rlhf.envs.sandbox_layers import CPU_LIMIT_EXIT, SandboxLimits, enter_sandbox

ExitReason = Literal["ok", "timeout", "memory", "error", "blocked"]
_BOOT_SCRIPT = sandbox_boot.__file__


@dataclass(frozen=True)
class SandboxResult:
    """What one run of the code tool gave."""

    stdout: str
    """The code's standard output, its first ``max_output_chars`` characters."""
    stderr: str
    """The last ``max_output_chars`` characters of its standard error (e.g. the traceback)."""
    reason: ExitReason
    """ok; timeout (wall clock or CPU); memory (over the memory limit); error (an exception or
    a non-zero exit); blocked (the sandbox refused an operation, e.g. a socket or a write)."""
    returncode: int | None
    """The process exit status (negative: killed by that signal); None if it never started."""
    wall_s: float
    """Seconds from start to exit."""
    layers: tuple[str, ...]
    """Layers that held: rlimits, audit_hook, netns, pidns, readonly_fs, no_capabilities."""

    def observation(self, max_chars: int = 4000) -> str:
        """The result as the text an agent reads, at most ``max_chars`` characters."""
        parts = [f"exit: {self.reason}"]
        if self.stdout:
            parts.append(f"stdout:\n{self.stdout}")
        if self.stderr and self.reason != "ok":
            parts.append(f"stderr:\n{self.stderr}")
        return _head("\n".join(parts), max_chars)


def run_python(
    code: str,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    cpu_s: float | None = None,
    max_output_chars: int = 2000,
    max_file_mb: int = 16,
) -> SandboxResult:
    """Runs ``code`` in the sandbox and waits at most ``timeout_s`` seconds of wall clock.

    Args:
        code: Python source, run as ``__main__``; its stdin is empty.
        timeout_s: wall-clock limit; the process group is killed after it.
        memory_mb: address-space limit (the interpreter itself takes about 20 MiB of it).
        cpu_s: CPU-seconds limit, rounded up; default ``timeout_s`` rounded up.
        max_output_chars: the most characters kept of stdout (head) and of stderr (tail).
        max_file_mb: the largest file, stdout and stderr included, the code may write.

    Raises:
        ValueError: a limit that is not positive (a caller's error, not the code's).
    """
    if min(timeout_s, memory_mb, max_output_chars, max_file_mb, cpu_s or 1) <= 0:
        raise ValueError("run_python: every limit must be positive")
    limits = SandboxLimits(
        cpu_s=math.ceil(cpu_s if cpu_s is not None else timeout_s),
        memory_bytes=memory_mb * 2**20,
        file_bytes=max_file_mb * 2**20,
    )
    with (
        tempfile.TemporaryDirectory(prefix="lit_rlhf_sandbox_", ignore_cleanup_errors=True) as tmp,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        scratch = os.path.join(os.path.realpath(tmp), "scratch")  # the code's only writable place
        os.mkdir(scratch)
        source = os.path.join(os.path.realpath(tmp), "tool.py")  # beside it: read, not listed
        with open(source, "w", encoding="utf-8", errors="replace") as file:
            file.write(code)
        start = time.monotonic()
        try:
            returncode, timed_out = _run_child(source, scratch, limits, out, err, timeout_s)
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult("", f"the sandbox did not start: {exc}", "error", None, 0.0, ())
        wall_s = time.monotonic() - start
        stdout, stderr = _read_head(out, max_output_chars), _read_tail(err, max_output_chars)
    layers, stderr = _split_layers(stderr)
    reason = _exit_reason(returncode, timed_out)
    return SandboxResult(stdout, stderr, reason, returncode, wall_s, layers)


def _run_child(
    source: str, scratch: str, limits: SandboxLimits, out: IO[bytes], err: IO[bytes],
    timeout_s: float,
) -> tuple[int, bool]:  # fmt: skip
    """Starts the bootstrap on the code file ``source``; returns (exit status, whether it timed
    out)."""
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", "-X", "utf8", _BOOT_SCRIPT, _own_net_ns(), source],
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        cwd=scratch,
        env={"HOME": scratch, "TMPDIR": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        start_new_session=True,  # its own process group, killed as one
        preexec_fn=partial(enter_sandbox, scratch, limits),
    )
    timed_out = False
    try:
        proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.returncode is None or timed_out:
            _kill_group(proc.pid)
        proc.wait()
    return proc.returncode, timed_out


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _own_net_ns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def _exit_reason(returncode: int, timed_out: bool) -> ExitReason:
    if timed_out or returncode in (-signal.SIGXCPU, CPU_LIMIT_EXIT):
        return "timeout"
    if returncode == sandbox_boot.MEMORY_EXIT:
        return "memory"
    if returncode == sandbox_boot.BLOCKED_EXIT:
        return "blocked"
    return "ok" if returncode == 0 else "error"


def _split_layers(stderr: str) -> tuple[tuple[str, ...], str]:
    """Takes the bootstrap's layer report (its first stderr line) off the code's stderr."""
    header = sandbox_boot.LAYERS_HEADER
    start = stderr.find(header)
    if start < 0:
        return (), stderr
    end = stderr.find("\n", start)
    end = len(stderr) if end < 0 else end
    layers = tuple(name for name in stderr[start + len(header) : end].split(",") if name)
    return layers, stderr[:start] + stderr[end + 1 :]


def _read_head(stream: IO[bytes], max_chars: int) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    text = stream.read(4 * max_chars + 4).decode("utf-8", "replace")
    return _head(text, max_chars, omitted_bytes=max(0, size - 4 * max_chars - 4))


def _read_tail(stream: IO[bytes], max_chars: int) -> str:
    # The layer header comes first; keep it when the tail would cut it off.
    stream.seek(0)
    header = stream.readline(200).decode("utf-8", "replace")
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(len(header), size - 4 * max_chars - 4))
    text = stream.read().decode("utf-8", "replace")
    if len(text) > max_chars:
        text = f"[... truncated]\n{text[-max_chars:]}"
    return header + text


def _head(text: str, max_chars: int, omitted_bytes: int = 0) -> str:
    if len(text) <= max_chars and not omitted_bytes:
        return text
    return f"{text[:max_chars]}\n[... truncated]"


@dataclass(frozen=True)
class PythonTool:
    """The code tool of a multi-turn environment: code in, observation text out.

    ``PythonTool()("print(6 * 7)")`` gives ``"exit: ok\\nstdout:\\n42\\n"``. It never raises
    for the code's faults: a timeout, a memory error or a refused operation is in the text.
    """

    timeout_s: float = 5.0
    """Wall-clock limit of one call."""
    memory_mb: int = 256
    """Address-space limit of one call."""
    max_output_chars: int = 2000
    """The most characters kept of stdout and of stderr each."""
    name: str = "python"
    """The tool's name in a tool call."""

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.memory_mb, self.max_output_chars) <= 0:
            raise ValueError(f"PythonTool: limits must be positive, got {self}")

    def run(self, code: str) -> SandboxResult:
        """The full record of one call."""
        return run_python(
            code,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_output_chars=self.max_output_chars,
        )

    def __call__(self, code: str) -> str:
        return self.run(code).observation(max_chars=2 * self.max_output_chars + 200)
