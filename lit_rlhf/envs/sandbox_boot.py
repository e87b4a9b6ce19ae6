"""The first code the sandboxed interpreter runs: it installs an audit hook, then runs the tool's
code (a file the parent wrote beside the scratch folder, ``argv[2]``) as ``__main__`` with
``runpy``.

Run as a script by :func:`lit_rlhf.envs.sandbox.run_python` (the parent imports it only for
its constants). It imports only ``contextlib``, ``os``, ``runpy`` and ``sys`` before the hook,
so the tool's code finds no ``ctypes`` or ``socket`` already loaded. An audit hook cannot be
removed once added (PEP 578), and the hook refuses, whatever the OS layers did: sockets,
processes (fork, exec, spawn, ``subprocess``), signals, resource-limit changes, the modules
that reach around the audit events (``ctypes``, ``_posixsubprocess``, ``_socket``), and every
file write, rename, removal, link or mode change outside the scratch folder (the working
directory). Modules that import ``socket`` (``asyncio``, ``urllib.request``) cannot be used.
The exit status tells the parent why the code stopped: 0, 1 (an exception),
:data:`MEMORY_EXIT`, :data:`BLOCKED_EXIT`.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

MEMORY_EXIT, BLOCKED_EXIT = 86, 87
LAYERS_HEADER = "sandbox-layers:"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_BANNED_EVENT_PREFIXES = (
    "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.kill", "resource.setrlimit", "resource.prlimit", "ctypes.", "pty.", "os.startfile",
)  # fmt: skip
_BANNED_MODULES = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "socket", "_socket", "ssl", "_ssl",
     "_xxsubinterpreters", "_multiprocessing", "multiprocessing"}
)  # fmt: skip
# event -> (indices of path arguments, indices of dir_fd arguments); the audit events of
# CPython 3.10-3.12 (docs.python.org/3/library/audit_events.html).
_PATH_EVENTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.rename": ((0, 1), (2, 3)),
    "os.mkdir": ((0,), (2,)), "os.symlink": ((1,), (2,)), "os.link": ((0, 1), (2, 3)),
    "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
    "os.truncate": ((0,), ()), "os.chflags": ((0,), ()), "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
}  # fmt: skip


def _inside(path: object, scratch: str) -> bool:
    """Whether ``path`` (str, bytes or path-like; symlinks resolved) lies in ``scratch``."""
    try:
        real = os.path.realpath(os.fsdecode(os.fspath(path)))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False
    return real == scratch or real.startswith(scratch + os.sep)


def _open_verdict(args: tuple[object, ...], scratch: str) -> str | None:
    path, mode, flags = args[0], args[1], args[2] or 0
    if isinstance(path, int) or path is None:
        return None  # an already open descriptor: it passed this check when it was opened
    writes = isinstance(flags, int) and flags & _WRITE_FLAGS and path != os.devnull
    if writes and not _inside(path, scratch):
        return f"write to {path!r} outside the scratch folder"
    # os.open of a directory gives a dir_fd, and dir_fd-relative paths would escape the check.
    if mode is None and not _inside(path, scratch) and os.path.isdir(os.fsdecode(path)):  # type: ignore[arg-type]
        return f"directory descriptor for {path!r} outside the scratch folder"
    return None


def _verdict(event: str, args: tuple[object, ...], scratch: str) -> str | None:
    """Why the event is refused, or None to allow it."""
    if event == "open":
        return _open_verdict(args, scratch)
    if event == "import":
        return f"import of {args[0]}" if args[0] in _BANNED_MODULES else None
    if event.startswith(_BANNED_EVENT_PREFIXES):
        return f"{event}"
    if event in _PATH_EVENTS:
        paths, dir_fds = _PATH_EVENTS[event]
        if any(args[i] not in (None, -1) for i in dir_fds if i < len(args)):
            return f"{event} relative to a directory descriptor"
        for i in paths:
            fd_ok = event == "os.truncate" and isinstance(args[i], int)
            if not fd_ok and not _inside(args[i], scratch):
                return f"{event} on {args[i]!r} outside the scratch folder"
    return None


def _install_hook(scratch: str) -> list[str]:
    """Adds the audit hook; returns the list it appends each refused event to."""
    blocked: list[str] = []

    def hook(event: str, args: tuple[object, ...]) -> None:
        reason = _verdict(event, args, scratch)
        if reason is not None:
            blocked.append(reason)
            raise PermissionError(f"blocked by the sandbox: {reason}")

    sys.addaudithook(hook)
    return blocked


def _layers(parent_net_ns: str) -> list[str]:
    """The isolation layers in force, seen from inside (reported to the parent on stderr)."""
    found = ["rlimits", "audit_hook"]
    try:
        if os.readlink("/proc/self/ns/net") != parent_net_ns:
            found.append("netns")
        if os.getpid() == 1:
            found.append("pidns")
        if os.statvfs("/").f_flag & os.ST_RDONLY:
            found.append("readonly_fs")
        with open("/proc/self/status") as status:
            caps = [line.split()[1] for line in status if line.startswith("CapEff:")]
        if caps and int(caps[0], 16) == 0:
            found.append("no_capabilities")
    except OSError:
        pass
    return found


def _run(path: str) -> int:
    """Runs the file ``path`` (the tool's code) as ``__main__``; returns the exit status."""
    try:
        runpy.run_path(path, run_name="__main__")
    except MemoryError:
        sys.stderr.write("MemoryError: the memory limit was reached\n")
        return MEMORY_EXIT
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException as exc:
        import traceback

        # Start the traceback at the tool's code, not at this bootstrap or runpy.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)  # None: the message alone
        return 1
    return 0


def main() -> None:
    scratch = os.path.realpath(os.getcwd())
    path = sys.argv[2]  # the code, written by the parent beside the scratch folder
    sys.stderr.write(LAYERS_HEADER + ",".join(_layers(sys.argv[1])) + "\n")
    sys.stderr.flush()
    blocked = _install_hook(scratch)
    status = _run(path)
    if blocked:
        sys.stderr.write("sandbox refused: " + "; ".join(blocked[:3]) + "\n")
        status = BLOCKED_EXIT
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
