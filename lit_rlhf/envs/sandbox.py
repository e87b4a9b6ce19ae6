"""A Python code tool for RL rollouts: model-written code runs in a limited subprocess.

:func:`run_python` runs the code with ``python -I -S -B`` (no environment variables, no site
packages, no bytecode writes) in a fresh scratch folder, under these layers:

- OS layers (:mod:`lit_rlhf.envs.sandbox_layers`): no network (an empty network namespace), no
  other process in sight (a PID namespace with its own procfs), a read-only file system except
  the scratch folder, no capabilities (as root directly; otherwise inside a user namespace),
  and a seccomp filter (:mod:`lit_rlhf.envs.sandbox_seccomp`: no ``mknod``, pidfds, signals to
  others, new processes, sockets or mounts);
- resource limits: CPU seconds, address space (memory), file size, open files;
- an audit hook (:mod:`lit_rlhf.envs.sandbox_hook`, installed by
  :mod:`lit_rlhf.envs.sandbox_boot`) whose verdict the code cannot reach: it refuses sockets,
  new processes, signals, ``ctypes``, ``sqlite3``, tracing and writes outside the scratch folder;
- a wall-clock timeout that kills the whole process group.

The layers that held are measured inside the child before the code runs and sent on a pipe
the code never sees (``SandboxResult.layers``). Without every OS layer
(:data:`~lit_rlhf.envs.sandbox_boot.STRONG_LAYERS`: e.g. a non-root trainer on a host that
blocks unprivileged user namespaces) the code does not run and :class:`WeakSandboxError` is
raised, unless ``allow_weak_sandbox=True``, which runs it under what held and logs a warning.

Every outcome of the code comes back as a :class:`SandboxResult` (never an exception that
would end a run), and :class:`PythonTool` turns it into an observation text. What is not
protected against: kernel exploits and interpreter bugs (crafted bytecode, e.g. through
``marshal``); reading files (the code can read whatever the parent can, e.g. the training
data). Threads are allowed. ``preexec_fn`` runs between fork and exec, which CPython calls
unsafe in a process with threads: it makes only system calls, holding no lock.
"""

from __future__ import annotations

import contextlib
import logging
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
_LOG = logging.getLogger(__name__)
_WARNED: set[tuple[str, ...]] = set()


class WeakSandboxError(RuntimeError):
    """The OS layers of the sandbox cannot be had here and a weak sandbox was not allowed."""


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
    """Layers that held: rlimits, audit_hook, userns, netns, pidns, fresh_proc, readonly_fs,
    noexec_scratch, no_capabilities, seccomp."""

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
    allow_weak_sandbox: bool = False,
) -> SandboxResult:
    """Runs ``code`` in the sandbox and waits at most ``timeout_s`` seconds of wall clock.

    Args:
        code: Python source, run as ``__main__``; its stdin is empty.
        timeout_s: wall-clock limit; the process group is killed after it.
        memory_mb: address-space limit (the interpreter itself takes about 20 MiB of it).
        cpu_s: CPU-seconds limit, rounded up; default ``timeout_s`` rounded up.
        max_output_chars: the most characters kept of stdout (head) and of stderr (tail).
        max_file_mb: the largest file, stdout and stderr included, the code may write.
        allow_weak_sandbox: run the code even where an OS layer cannot be had (logged as a
            warning); by default such a call raises :class:`WeakSandboxError` before the code
            runs.

    Raises:
        ValueError: a limit that is not positive (a caller's error, not the code's).
        WeakSandboxError: an OS layer is missing and ``allow_weak_sandbox`` is False.
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
        child = _Child(source, scratch, limits, out, err, allow_weak_sandbox)
        try:
            returncode, timed_out, layers = child.run(timeout_s)
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult("", f"the sandbox did not start: {exc}", "error", None, 0.0, ())
        wall_s = time.monotonic() - start
        stdout, stderr = _read_head(out, max_output_chars), _read_tail(err, max_output_chars)
    _check_layers(layers, allow_weak_sandbox, refused=returncode == sandbox_boot.WEAK_EXIT)
    reason = _exit_reason(returncode, timed_out)
    return SandboxResult(stdout, stderr, reason, returncode, wall_s, layers)


def _check_layers(layers: tuple[str, ...], allow_weak: bool, refused: bool) -> None:
    """Raises when the bootstrap refused to run the code for a missing OS layer; warns once per
    process when a weak sandbox is allowed and used."""
    missing = tuple(name for name in sandbox_boot.STRONG_LAYERS if name not in layers)
    if not missing or not layers:  # no report: the interpreter did not get that far
        return
    if not allow_weak and refused:
        raise WeakSandboxError(
            f"the code sandbox cannot isolate tool code here (missing layers: "
            f"{', '.join(missing)}; uid {os.getuid()}). Fix: {_namespace_fix()}, or accept a "
            "weak sandbox with allow_weak_sandbox: true (the environment's init_args: "
            "PythonCodeEnv; or PythonTool(allow_weak_sandbox=True))"
        )
    if allow_weak and missing not in _WARNED:
        _WARNED.add(missing)
        _LOG.warning(
            "WEAK CODE SANDBOX: tool code runs without the OS layers %s (allow_weak_sandbox "
            "is true); only %s hold", ", ".join(missing), ", ".join(layers),
        )  # fmt: skip


def _namespace_fix() -> str:
    if os.getuid() == 0:  # root without the capability, e.g. in a container
        return (
            "give the trainer CAP_SYS_ADMIN or user namespaces (in a container: a seccomp and "
            "AppArmor profile that allows unshare and mount)"
        )
    return (
        "let unprivileged users create user namespaces (Ubuntu: sysctl "
        "kernel.apparmor_restrict_unprivileged_userns=0), or run the trainer as root"
    )


def probe_sandbox(allow_weak_sandbox: bool = False) -> tuple[str, ...]:
    """The layers the sandbox holds on this machine (one empty run).

    Raises:
        WeakSandboxError: an OS layer is missing and ``allow_weak_sandbox`` is False.
    """
    result = run_python("pass", allow_weak_sandbox=allow_weak_sandbox)
    if result.reason != "ok":
        raise WeakSandboxError(f"the code sandbox does not start here: {result.stderr.strip()}")
    return result.layers


@dataclass
class _Child:
    """One sandboxed interpreter: the bootstrap on the code file ``source``."""

    source: str
    scratch: str
    limits: SandboxLimits
    out: IO[bytes]
    err: IO[bytes]
    allow_weak: bool

    def run(self, timeout_s: float) -> tuple[int, bool, tuple[str, ...]]:
        """Runs it; (exit status, whether it timed out, the layers it reported)."""
        report_r, report_w = os.pipe()
        try:
            returncode, timed_out = self._wait(report_w, timeout_s)
        finally:
            os.close(report_w)  # also when Popen failed
            with os.fdopen(report_r, "rb") as report:
                os.set_blocking(report.fileno(), False)
                line = (report.read(4096) or b"").decode("ascii", "replace")
        layers = tuple(name for name in line.strip().split(",") if name)
        return returncode, timed_out, layers

    def _wait(self, report_w: int, timeout_s: float) -> tuple[int, bool]:
        args = [_own_ns("net"), _own_ns("user"), self.source, str(report_w)]
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-X", "utf8", _BOOT_SCRIPT, *args,
             "1" if self.allow_weak else "0"],
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=self.err,
            cwd=self.scratch,
            env={"HOME": self.scratch, "TMPDIR": self.scratch, "PATH": "/usr/bin:/bin",
                 "LANG": "C.UTF-8"},
            start_new_session=True,  # its own process group, killed as one
            pass_fds=(report_w,),
            preexec_fn=partial(enter_sandbox, self.scratch, self.limits),
        )  # fmt: skip
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


def _own_ns(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
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


def _read_head(stream: IO[bytes], max_chars: int) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    text = stream.read(4 * max_chars + 4).decode("utf-8", "replace")
    return _head(text, max_chars, omitted_bytes=max(0, size - 4 * max_chars - 4))


def _read_tail(stream: IO[bytes], max_chars: int) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - 4 * max_chars - 4))
    text = stream.read().decode("utf-8", "replace")
    if len(text) > max_chars:
        text = f"[... truncated]\n{text[-max_chars:]}"
    return text


def _head(text: str, max_chars: int, omitted_bytes: int = 0) -> str:
    if len(text) <= max_chars and not omitted_bytes:
        return text
    return f"{text[:max_chars]}\n[... truncated]"


@dataclass(frozen=True)
class PythonTool:
    """The code tool of a multi-turn environment: code in, observation text out.

    ``PythonTool()("print(6 * 7)")`` gives ``"exit: ok\\nstdout:\\n42\\n"``. It never raises
    for the code's faults: a timeout, a memory error or a refused operation is in the text.
    Constructing it probes the sandbox once (:func:`probe_sandbox`): without every OS layer it
    raises :class:`WeakSandboxError` unless ``allow_weak_sandbox``.
    """

    timeout_s: float = 5.0
    """Wall-clock limit of one call."""
    memory_mb: int = 256
    """Address-space limit of one call."""
    max_output_chars: int = 2000
    """The most characters kept of stdout and of stderr each."""
    name: str = "python"
    """The tool's name in a tool call."""
    allow_weak_sandbox: bool = False
    """Run the code even where an OS layer cannot be had (logged as a warning)."""

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.memory_mb, self.max_output_chars) <= 0:
            raise ValueError(f"PythonTool: limits must be positive, got {self}")
        probe_sandbox(self.allow_weak_sandbox)

    def run(self, code: str) -> SandboxResult:
        """The full record of one call."""
        return run_python(
            code,
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_output_chars=self.max_output_chars,
            allow_weak_sandbox=self.allow_weak_sandbox,
        )

    def __call__(self, code: str) -> str:
        return self.run(code).observation(max_chars=2 * self.max_output_chars + 200)
