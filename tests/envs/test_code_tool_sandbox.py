"""The code tool's sandbox: each limit holds, and every failure comes back as a record."""

from __future__ import annotations

import dis
import functools
import logging
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lit_rlhf.envs import sandbox_hook, sandbox_layers, sandbox_seccomp
from lit_rlhf.envs.sandbox import PythonTool, SandboxResult, WeakSandboxError, run_python
from lit_rlhf.envs.sandbox_boot import STRONG_LAYERS
from lit_rlhf.envs.sandbox_layers import SandboxLimits, enter_sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")


@functools.cache
def layers_here() -> frozenset[str]:
    return frozenset(run_python("pass").layers)


def require_layers(*layers: str) -> None:
    """Skips where the kernel or the privileges refuse an OS layer (e.g. non-root CI)."""
    missing = set(layers) - layers_here()
    if missing:
        pytest.skip(f"this machine does not give the sandbox layers {sorted(missing)}")


def test_normal_code_returns_stdout_and_may_use_its_scratch_folder() -> None:
    code = "open('notes.txt', 'w').write('4')\nprint(sum(range(10)), open('notes.txt').read())"
    code += "\nimport os\nopen(os.devnull, 'w').write('discarded')"
    result = run_python(code)
    assert (result.reason, result.returncode, result.stdout) == ("ok", 0, "45 4\n")
    assert {"rlimits", "audit_hook"} <= set(result.layers)
    assert "sandbox-layers" not in result.stderr


@pytest.mark.parametrize(
    "connect",
    [
        "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=2)",
        "import _socket\ns = _socket.socket()\ns.connect(('127.0.0.1', PORT))",
        "import importlib\nsock = importlib.import_module('socket')\n"
        "sock.create_connection(('127.0.0.1', PORT))",
    ],
)
def test_the_code_cannot_open_a_socket(connect: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.5)
        port = server.getsockname()[1]
        # Even when the code swallows the refusal, the run is reported as blocked.
        code = f"try:\n    {connect.replace(chr(10), chr(10) + '    ')}\n    print('connected')\n"
        code += "except Exception as exc:\n    print(type(exc).__name__)\n"
        result = run_python(code.replace("PORT", str(port)))
        assert result.reason == "blocked" and "connected" not in result.stdout
        with pytest.raises(TimeoutError):  # nothing reached the server
            server.accept()


@pytest.mark.parametrize(
    "write",
    [
        "open(TARGET, 'w').write('x')",
        "import os\nos.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))",
        "import pathlib\npathlib.Path(TARGET).write_text('x')",
        "import os\nos.symlink(TARGET, 'link')\nopen('link', 'w').write('x')",
        "import os\nd = os.open(os.path.dirname(TARGET), os.O_RDONLY)\n"
        "os.open(os.path.basename(TARGET), os.O_WRONLY | os.O_CREAT, dir_fd=d)",
        "import shutil\nopen('f', 'w').write('x')\nshutil.move('f', TARGET)",
    ],
    ids=["open", "os.open", "pathlib", "symlink", "dir_fd", "move"],
)
def test_the_code_cannot_write_outside_its_scratch_folder(write: str, tmp_path: Path) -> None:
    target = tmp_path / "outside.txt"
    result = run_python(write.replace("TARGET", repr(str(target))))
    assert result.reason == "blocked", result
    assert not target.exists()


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(60)"])
def test_the_code_cannot_outlive_its_time_limit(code: str) -> None:
    start = time.monotonic()
    result = run_python(code, timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert result.reason == "timeout"
    assert 1.0 <= elapsed < 1.0 + 2.0  # margin: interpreter start and a busy CI machine


def test_the_cpu_limit_stops_busy_code_before_the_wall_clock() -> None:
    result = run_python("while True:\n    pass", timeout_s=60.0, cpu_s=1)
    assert result.reason == "timeout" and result.wall_s < 20.0  # loose: a busy CI machine


def test_the_code_cannot_exceed_its_memory_limit() -> None:
    result = run_python("block = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert result.reason == "memory" and result.stdout == ""
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize(
    ("code", "reason", "text"),
    [
        ("raise ValueError('bad input')", "error", "ValueError: bad input"),
        ("import sys\nsys.exit(3)", "error", ""),
        ("import os\nos.system('echo hi')", "blocked", "os.system"),
        ("import subprocess\nsubprocess.run(['true'])", "blocked", "subprocess"),
        ("import ctypes", "blocked", "import of ctypes"),
        ("def f(): f()\nf()", "error", "RecursionError"),
        ("print(", "error", "SyntaxError"),
    ],
)
def test_every_failure_is_a_record(code: str, reason: str, text: str) -> None:
    result = run_python(code)
    assert result.reason == reason and text in result.stderr
    if reason == "error":  # the traceback starts at the tool's code, not the bootstrap
        assert "sandbox_boot" not in result.stderr


def test_output_is_truncated_to_the_configured_length() -> None:
    result = run_python(
        "print('x' * 100_000)\nraise ValueError('y' * 100_000)", max_output_chars=50
    )
    assert result.reason == "error"
    assert result.stdout.startswith("x" * 50) and len(result.stdout) < 50 + 30
    assert result.stderr.endswith("y" * 40 + "\n") and len(result.stderr) < 50 + 30


def test_python_tool_gives_observation_text_and_never_raises() -> None:
    tool = PythonTool(timeout_s=1.0, max_output_chars=100)
    assert tool("print(6 * 7)") == "exit: ok\nstdout:\n42\n"
    for code, reason in [("while True: pass", "timeout"), ("import socket", "blocked")]:
        text = tool(code)
        assert text.startswith(f"exit: {reason}") and len(text) <= 400
    with pytest.raises(ValueError, match="positive"):
        PythonTool(timeout_s=0)


def test_observation_of_a_record() -> None:
    result = SandboxResult("1\n", "KeyError: 2\n", "error", 1, 0.1, ())
    assert result.observation() == "exit: error\nstdout:\n1\n\nstderr:\nKeyError: 2\n"
    assert result.observation(max_chars=8) == "exit: er\n[... truncated]"


def test_the_os_layers_hold_without_the_audit_hook(tmp_path: Path) -> None:
    require_layers("netns", "readonly_fs")
    # A plain interpreter (no audit hook) inside enter_sandbox: the kernel refuses both.
    scratch, target = tmp_path / "scratch", tmp_path / "outside.txt"
    scratch.mkdir()
    code = (
        "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
        "except OSError as exc:\n    print('net', exc.errno)\n"
        f"try:\n    open({str(target)!r}, 'w')\n"
        "except OSError as exc:\n    print('fs', exc.errno)\n"
        "open('inside.txt', 'w').write('ok')\n"
    )
    limits = SandboxLimits(cpu_s=5, memory_bytes=256 * 2**20, file_bytes=2**20)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        preexec_fn=lambda: enter_sandbox(str(scratch), limits),
        capture_output=True,
        text=True,
        timeout=10,
    )
    # EPERM: seccomp refuses the socket (behind it the empty network namespace); EROFS.
    assert done.stdout.split("\n")[:2] == ["net 1", "fs 30"], done
    assert not target.exists() and (scratch / "inside.txt").read_text() == "ok"


def test_without_the_os_layers_the_sandbox_refuses_unless_weak_is_allowed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_layers, "_LIBC", None)  # no namespaces, no seccomp
    target = tmp_path / "outside.txt"
    with pytest.raises(WeakSandboxError, match="allow_weak_sandbox: true"):
        run_python(f"open({str(target)!r}, 'w')")
    fix = "CAP_SYS_ADMIN" if os.getuid() == 0 else "apparmor_restrict_unprivileged_userns"
    with pytest.raises(WeakSandboxError, match=fix):
        PythonTool()
    assert not target.exists()  # the code never ran
    with caplog.at_level(logging.WARNING, logger="lit_rlhf.envs.sandbox"):
        tool = PythonTool(allow_weak_sandbox=True)
        assert tool.run("print('up')").layers == ("rlimits", "audit_hook")
    assert "WEAK CODE SANDBOX" in caplog.text
    # The audit hook alone still refuses what it sees.
    assert run_python(f"open({str(target)!r}, 'w')", allow_weak_sandbox=True).reason == "blocked"
    assert run_python("import socket", allow_weak_sandbox=True).reason == "blocked"
    assert not target.exists()


def test_every_os_layer_holds_here_as_root() -> None:
    if os.getuid() != 0:
        pytest.skip("root only; tests/envs/test_sandbox_escapes.py covers other users")
    assert set(STRONG_LAYERS) <= set(run_python("pass").layers)


def test_the_hook_reads_no_global_or_builtin_name() -> None:
    # What a frame in reach shows (f_globals, f_builtins) cannot change a verdict.
    functions = [value for name, value in vars(sandbox_hook).items()
                 if callable(value) and getattr(value, "__module__", "") == sandbox_hook.__name__
                 and name != "build"]  # fmt: skip
    assert len(functions) == 6
    for function in functions:
        names = [i.argval for i in dis.get_instructions(function) if "GLOBAL" in i.opname
                 or i.opname in ("LOAD_NAME", "LOAD_DEREF", "LOAD_CLOSURE")]  # fmt: skip
        assert names == [], (function.__name__, names)
    built = sandbox_hook.build(str(os.path.realpath(".")), [])
    assert built.__globals__ == {"__builtins__": {}}
    assert all(not isinstance(value, (list, dict, set)) for value in built.__defaults__[:1])


def test_a_failing_call_returns_its_traceback_after_a_frame_walk() -> None:
    code = (
        "import sys\nframe = sys._getframe()\nwhile frame.f_back is not None:\n"
        "    frame = frame.f_back\n    frame.f_globals.clear()\n"
        "def deep():\n    raise ValueError('still traced')\ndeep()\n"
    )
    result = run_python(code)
    assert result.reason == "error"
    assert 'tool.py", line 7, in deep' in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: still traced")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_filter_is_built_per_architecture(machine: str) -> None:
    program = sandbox_seccomp.filter_program(machine)
    assert program is not None and len(program) % 8 == 0 and len(program) // 8 < 4096
    assert sandbox_seccomp.filter_program("sparc") is None


def test_concurrent_runs_each_get_their_own_scratch_folder() -> None:
    code = (
        "import os, tempfile\nwith tempfile.NamedTemporaryFile('w') as f:\n    f.write('x')\n"
        "print(len(os.listdir('.')))"
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(run_python, [code] * 4))
    assert [(r.reason, r.stdout) for r in results] == [("ok", "0\n")] * 4


def test_the_code_cannot_signal_the_trainer() -> None:
    require_layers("pidns", "seccomp")
    # pidfd_send_signal raises no audit event: seccomp refuses pidfd_open (and the PID
    # namespace hides this process).
    code = f"import os, signal\nsignal.pidfd_send_signal(os.pidfd_open({os.getpid()}), 0)\n"
    result = run_python(code + "print('reached')")
    assert result.reason == "error" and "reached" not in result.stdout
    assert "PermissionError: [Errno 1]" in result.stderr


def test_the_seccomp_filter_names_only_numbers_it_knows() -> None:
    # Every refused call has a number on each architecture that has it (x86_64's fork and
    # vfork and mknod have no aarch64 twin).
    numbers = {machine: table for machine, (_, _, table) in sandbox_seccomp._ARCHES.items()}
    for name in sandbox_seccomp._DENIED:
        assert name in numbers["x86_64"], name
        assert name in numbers["aarch64"] or name in ("fork", "vfork", "mknod"), name
    assert len(set(numbers["x86_64"].values())) == len(numbers["x86_64"])
    assert len(set(numbers["aarch64"].values())) == len(numbers["aarch64"])


def test_the_code_cannot_change_other_processes_scheduling() -> None:
    require_layers("seccomp")
    code = "import os\nos.sched_setaffinity(0, {0})\nprint('reached')"
    result = run_python(code)
    assert result.reason == "error" and "reached" not in result.stdout
    assert "PermissionError: [Errno 1]" in result.stderr
