"""Hostile tool code against the code sandbox: one program per escape of issue 35, each run
from a trainer process (``sandbox_trainer.py``: a secret in its environment, a SIGUSR1 counter)
as the user the tests run as, and, where the tests run as root, again without capabilities
(``setpriv --bounding-set=-all``), as ``nobody``, and as ``nobody`` on a host that refuses
namespaces (weak: refused unless ``allow_weak_sandbox``, then run under what holds).

Every program first tries to switch the audit hook off (the frame walk: every frame in reach,
the boot script's and the hook's own from a refused event's traceback, gets its functions
replaced by one that allows everything, their code and defaults swapped and its containers
emptied), then tries its escape. Each test asserts the escape failed (the program never
prints ``ESCAPED``) and the effect on the trainer's side did not happen: no file in the
test's folder, no connection at the test's server, no process left, no secret in the output,
no signal received. Each program touches only the test's folder and is bounded (one fork,
5 s per call, 4 s sleeps).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lit_rlhf.envs.sandbox_boot import STRONG_LAYERS

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox targets Linux")

REPO = Path(__file__).resolve().parents[2]
TRAINER = Path(__file__).with_name("sandbox_trainer.py")
SECRET = f"trainer-secret-{uuid.uuid4().hex}"
TOKEN = f"left-alive-{uuid.uuid4().hex}"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
NO_CAPS = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]

DISABLE_THE_HOOK = """
import builtins, sys

def _allow(*args, **kwargs):
    return None

def _frames_in_reach():
    frames, frame = [], sys._getframe()
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    try:
        open("/nonexistent-sandbox-folder/x", "w")  # refused: its traceback holds the hook
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
    return frames

def _poison(space):
    for key, value in list(space.items()):
        if key.startswith("__"):
            continue
        if callable(value) and not isinstance(value, type):
            for attr, new in (("__code__", _allow.__code__), ("__defaults__", None)):
                try:
                    setattr(value, attr, new)
                except BaseException:
                    pass
            try:
                space[key] = _allow
            except BaseException:
                pass
        elif isinstance(value, (list, dict, set)) and value is not globals():
            value.clear()

reached = set()
for frame in _frames_in_reach():
    if frame.f_code.co_filename == __file__:
        continue
    reached.add(frame.f_code.co_filename.rsplit("/", 1)[-1])
    for space in (frame.f_globals, frame.f_locals, vars(sys.modules["__main__"])):
        if space is not globals():
            _poison(space)
    if frame.f_builtins is not vars(builtins):
        for name in ("type", "len", "str", "bytes", "int", "isinstance", "OSError"):
            frame.f_builtins[name] = _allow
print("reached:", ",".join(sorted(reached)))
"""


def _attempts(*attempts: tuple[str, str]) -> str:
    """Code that runs each (name, statements) attempt and prints ESCAPED when it succeeded."""
    lines = []
    for name, statements in attempts:
        body = "\n".join("    " + line for line in statements.strip().splitlines())
        lines += [
            f"try:\n{body}\n    print('ESCAPED {name}')",
            f"except BaseException as exc:\n    print('refused {name}:', type(exc).__name__, exc)",
        ]
    return "\n".join(lines) + "\n"


SLEEPER = f"[sys.executable, '-c', 'import time; time.sleep(4)', '{TOKEN}']"
PROGRAMS = {
    "frame_walk": _attempts(
        ("write after the walk", "open(OUT + '/frame_walk.txt', 'w').write('x')")
    ),
    "write_outside": _attempts(
        ("open", "open(OUT + '/open.txt', 'w').write('x')"),
        ("os.open", "import os\nos.close(os.open(OUT + '/os_open.txt', os.O_WRONLY | os.O_CREAT))"),
        (
            "symlink",
            "import os\nos.symlink(OUT + '/link.txt', 'link')\nopen('link', 'w').write('x')",
        ),
        ("rename", "import os\nopen('f', 'w').write('x')\nos.rename('f', OUT + '/renamed.txt')"),
    ),
    "connect": _attempts(
        ("socket", "import socket\nsocket.create_connection(('127.0.0.1', PORT), timeout=1)"),
        (
            "_socket",
            "import _socket\ns = _socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', PORT))",
        ),
    ),
    "setsid_child": _attempts(
        (
            "fork",
            "import os, sys\npid = os.fork()\nif pid == 0:\n    try:\n        os.setsid()\n"
            f"        os.execv(sys.executable, {SLEEPER})\n    finally:\n        os._exit(0)",
        ),
        ("popen", f"import subprocess, sys\nsubprocess.Popen({SLEEPER}, start_new_session=True)"),
        ("posix_spawn", f"import os, sys\nos.posix_spawn(sys.executable, {SLEEPER}, {{}})"),
    ),
    "proc_environ": "import os\n"
    + _attempts(
        ("trainer", "print(open('/proc/TRAINER_PID/environ', 'rb').read())"),
        ("parent", "print(open(f'/proc/{os.getppid()}/environ', 'rb').read())"),
        (
            "every process",
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()][:300]:\n"
            "    try:\n        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError:\n        pass\nraise OSError('nothing to show')",
        ),
    ),
    "pidfd_signal": _attempts(
        (
            "pidfd_send_signal",
            "import os, signal\n"
            "signal.pidfd_send_signal(os.pidfd_open(TRAINER_PID), signal.SIGUSR1)",
        ),
        ("kill", "import os, signal\nos.kill(TRAINER_PID, signal.SIGUSR1)"),
    ),
    "sigio_owner": _attempts(
        (
            "SIGUSR1 by fcntl F_SETOWN/F_SETSIG on a pipe",
            "import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, fcntl.F_SETOWN, TRAINER_PID)\n"
            "fcntl.fcntl(r, fcntl.F_SETSIG, 10)\n"
            "fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)\nos.write(w, b'x')",
        ),
    ),
    "sqlite3": _attempts(
        (
            "sqlite3.connect",
            "import sqlite3\nsqlite3.connect(OUT + '/db.sqlite').execute('create table t (x)')",
        ),
    ),
    "mkfifo": _attempts(
        ("outside", "import os\nos.mkfifo(OUT + '/escape.fifo')"),
        ("inside", "import os\nos.mkfifo('inside.fifo')"),
    ),
    "mknod": _attempts(
        ("mknod", "import os, stat\nos.mknod(OUT + '/escape.node', 0o600 | stat.S_IFREG)")
    ),
    "native_code": "import importlib.machinery, importlib.util, os, shutil, sys\n"
    + "so = [os.path.join(d, f) for d in sys.path if os.path.isdir(d) for f in os.listdir(d)]\n"
    + _attempts(
        (
            "_ctypes loaded as evil._ctypes, libc called",
            "path = [f for f in so if f.rsplit('/', 1)[-1].startswith('_ctypes.')][0]\n"
            "loader = importlib.machinery.ExtensionFileLoader('evil._ctypes', path)\n"
            "spec = importlib.util.spec_from_file_location('evil._ctypes', path, loader=loader)\n"
            "sys.modules['_ctypes'] = importlib.util.module_from_spec(spec)\n"
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            "fd = libc.open((OUT + '/native.txt').encode(), os.O_WRONLY | os.O_CREAT, 0o600)\n"
            "fifo = libc.mkfifo((OUT + '/native.fifo').encode(), 0o600)\n"
            "sig = libc.kill(TRAINER_PID, 10)  # SIGUSR1\n"
            "assert fd >= 0 or fifo == 0 or sig == 0, (fd, fifo, sig)",
        ),
        (
            "an extension module copied into the scratch folder",
            "path = [f for f in so if f.rsplit('/', 1)[-1].startswith('math.')][0]\n"
            "shutil.copyfile(path, 'copy.so')\n"
            "loader = importlib.machinery.ExtensionFileLoader('math', 'copy.so')\n"
            "spec = importlib.util.spec_from_file_location('math', 'copy.so', loader=loader)\n"
            "importlib.util.module_from_spec(spec)",
        ),
    ),
    "readline": _attempts(
        ("write_history_file", "import readline\nreadline.write_history_file(OUT + '/history')"),
    ),
}


@pytest.fixture(scope="module")
def out_dir() -> Iterator[Path]:
    """The test's folder, writable by every user, so that only the sandbox stands between a
    program and a file in it."""
    path = Path(tempfile.mkdtemp(prefix="sandbox_escapes_"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        yield listening


def _interpreter_for(prefix: list[str]) -> str | None:
    """An interpreter (>= 3.10; the trainer stand-in needs only the standard library) the user
    of ``prefix`` may start again from itself, as the sandbox does: this one, else the
    system's."""
    again = "import os, sys; os.execv(sys.executable, [sys.executable, '-c', 'pass'])"
    for python in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(python):
            continue
        if subprocess.run([*prefix, python, "-c", again], capture_output=True).returncode == 0:
            return python
    return None


@functools.cache
def _variant(name: str) -> tuple[list[str], list[str]] | None:
    """(command prefix, trainer flags) of a way to run the trainer; None where not possible."""
    if name.startswith("as_is"):
        return [], [f"--{flag.replace('_', '-')}" for flag in name.split("+")[1:]]
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        return None
    user, *flags = name.split("+")
    prefix = {"no_capabilities": NO_CAPS, "nobody": NOBODY}[user]
    python = _interpreter_for(prefix)
    if python is None:
        return None
    return [*prefix, python], [f"--{flag.replace('_', '-')}" for flag in flags]


@functools.cache
def _run_trainer(name: str, out: str, port: int, allow_weak: bool) -> dict[str, Any]:
    variant = _variant(name)
    if variant is None:
        pytest.skip(f"cannot run the trainer as {name} here (needs root and setpriv)")
    prefix, flags = variant
    programs = [
        DISABLE_THE_HOOK + code.replace("OUT", repr(out)).replace("PORT", str(port))
        for code in PROGRAMS.values()
    ]
    request = json.dumps({"programs": programs, "allow_weak": allow_weak, "timeout_s": 5.0})
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SANDBOX_TEST_SECRET": SECRET}
    done = subprocess.run(
        [*(prefix or [sys.executable]), str(TRAINER), str(REPO), *flags],
        input=request, capture_output=True, text=True, timeout=240, env=env, cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    report["by_program"] = dict(zip(PROGRAMS, report.pop("results"), strict=True))
    return report


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            continue
    return found


# as_is: the user the tests run as; +no_userns: on a host that refuses namespaces (a weak
# sandbox, allowed); +no_hook: the OS layers alone, as if the audit hook were switched off.
VARIANTS = ["as_is", "no_capabilities", "nobody", "nobody+no_userns", "as_is+no_hook",
            "nobody+no_hook"]  # fmt: skip


@pytest.mark.parametrize("program", list(PROGRAMS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_hostile_program_is_contained(
    variant: str, program: str, out_dir: Path, server: socket.socket
) -> None:
    port = server.getsockname()[1]
    weak = variant.endswith("+no_userns")
    report = _run_trainer(variant, str(out_dir), port, weak)
    record = report["by_program"][program]
    if variant == "as_is" and "weak" in record:
        pytest.skip(f"this host refuses the sandbox: {record['weak']}")
    stdout, output = record["stdout"], record["stdout"] + record["stderr"]
    assert "reached:" in stdout, record  # the walk ran
    assert "ESCAPED" not in stdout, record
    assert "refused" in stdout, record
    if weak:
        assert "seccomp" in record["layers"] and "pidns" not in record["layers"], record
    elif not variant.endswith("+no_hook"):
        assert set(STRONG_LAYERS) <= set(record["layers"]), record
    if variant in ("no_capabilities", "nobody") or (variant == "as_is" and os.getuid() != 0):
        assert "userns" in record["layers"], record  # made inside a user namespace
    # The trainer-side effect did not happen.
    assert not list(out_dir.iterdir())
    assert SECRET not in output
    assert record["signals"] == 0
    assert _processes_with(TOKEN) == []
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing connected to the test's server
        server.accept()
    if program == "frame_walk" and "no_hook" not in variant:  # the boot's frames, the hook's
        assert "sandbox_boot.py" in stdout and "sandbox_hook.py" in stdout, stdout


def test_without_namespaces_the_sandbox_refuses_unless_weak_is_allowed(
    out_dir: Path, server: socket.socket
) -> None:
    report = _run_trainer("nobody+no_userns", str(out_dir), server.getsockname()[1], False)
    for record in report["by_program"].values():
        assert set(record) == {"weak", "signals"}, record  # the code never ran
        assert "allow_weak_sandbox" in record["weak"]
        assert "kernel.apparmor_restrict_unprivileged_userns" in record["weak"]
    assert not list(out_dir.iterdir())


def test_the_trainer_runs_as_the_intended_users(out_dir: Path, server: socket.socket) -> None:
    port = server.getsockname()[1]
    assert _run_trainer("as_is", str(out_dir), port, False)["uid"] == os.getuid()
    if _variant("nobody") is not None:
        assert _run_trainer("nobody", str(out_dir), port, False)["uid"] == 65534
