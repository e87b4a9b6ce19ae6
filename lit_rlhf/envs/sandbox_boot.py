"""The first code the sandboxed interpreter runs: it reports the layers that hold, installs the
audit hook, then runs the tool's code (a file the parent wrote beside the scratch folder).

Run as a script by :func:`lit_rlhf.envs.sandbox.run_python` (the parent imports it only for its
constants), with the arguments: the parent's network and user namespaces (to tell whether new
ones hold), the code's file, the descriptor of the layer report and whether a weak sandbox is
allowed. In order:

1. It writes the layers that hold (:data:`STRONG_LAYERS`, seen from inside) to the report
   descriptor and closes it, before any of the code runs, so the code cannot forge the report.
   Without every strong layer and without ``allow_weak``, it exits with :data:`WEAK_EXIT` and
   the code never runs.
2. It installs the audit hook (:mod:`lit_rlhf.envs.sandbox_hook`, executed into a private
   namespace that is dropped: no module, global or frame of the code's reach holds the hook's
   functions, and what a refused event's traceback shows of them cannot change a verdict).
   The hook refuses sockets, processes, signals, ``sqlite3``, the modules that reach around the
   audit events (``ctypes``, ``readline``, ...), tracing and the garbage collector's object
   lists, and every file write outside the scratch folder (the working directory).
3. It compiles and executes the code as ``__main__`` in a fresh globals dict; an exception's
   traceback is printed from the code's own first frame.

Before the hook it imports only ``os`` and ``sys`` (and what the hook file imports: ``os``,
``typing``), so the code finds no ``ctypes`` or ``socket`` already loaded. The exit status
tells the parent why the code stopped: 0, 1 (an exception), :data:`MEMORY_EXIT`,
:data:`BLOCKED_EXIT`.
"""

from __future__ import annotations

import os
import sys

MEMORY_EXIT, BLOCKED_EXIT, WEAK_EXIT = 86, 87, 89
STRONG_LAYERS = ("netns", "pidns", "fresh_proc", "readonly_fs", "no_capabilities", "seccomp")
"""The layers without which the code runs only when a weak sandbox is allowed."""


def _status(field: str) -> str:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return line.split()[1]
    return ""


def layers(parent_net_ns: str, parent_user_ns: str) -> list[str]:
    """The isolation layers in force, seen from inside."""
    found = ["rlimits", "audit_hook"]
    try:
        if os.readlink("/proc/self/ns/user") != parent_user_ns:
            found.append("userns")
        if os.readlink("/proc/self/ns/net") != parent_net_ns:
            found.append("netns")
        if os.getpid() == 1:
            found.append("pidns")
            if os.readlink("/proc/self") == "1":  # the procfs of this namespace, not the host's
                found.append("fresh_proc")
        if os.statvfs("/").f_flag & os.ST_RDONLY:
            found.append("readonly_fs")
        if os.statvfs(".").f_flag & os.ST_NOEXEC:
            found.append("noexec_scratch")
        if _status("CapEff") and int(_status("CapEff"), 16) == 0:
            found.append("no_capabilities")
        if _status("Seccomp") == "2":
            found.append("seccomp")
    except OSError:
        pass
    return found


def _install_hook(scratch: str) -> list[str]:
    """Adds the audit hook; returns the list it appends each refused event to."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_hook.py")
    with open(path, encoding="utf-8") as file:
        source = file.read()
    namespace: dict[str, object] = {"__name__": "lit_rlhf_sandbox_hook"}
    exec(compile(source, path, "exec"), namespace)  # our own file, not the tool's code
    refused: list[str] = []
    sys.addaudithook(namespace["build"](scratch, refused))  # type: ignore[operator]
    namespace.clear()
    return refused


def _run(path: str) -> int:
    """Runs the file ``path`` (the tool's code) as ``__main__``; returns the exit status."""
    try:
        with open(path, "rb") as file:
            code = compile(file.read(), path, "exec")
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
    except MemoryError:
        sys.stderr.write("MemoryError: the memory limit was reached\n")
        return MEMORY_EXIT
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException as exc:
        import traceback

        # Start the traceback at the tool's code, not at this bootstrap.
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb)  # None: the message alone
        return 1
    return 0


def main() -> None:
    parent_net_ns, parent_user_ns, path, report, allow_weak = sys.argv[1:6]
    scratch = os.path.realpath(os.getcwd())
    held = layers(parent_net_ns, parent_user_ns)
    os.write(int(report), (",".join(held) + "\n").encode())
    os.close(int(report))
    if allow_weak != "1" and not set(STRONG_LAYERS) <= set(held):
        os._exit(WEAK_EXIT)
    sys.argv[:] = [path]
    del sys.path[0]  # this folder: the code imports nothing of the sandbox's own
    refused = _install_hook(scratch)
    # Held here, not looked up after the code ran: it may have emptied this module's globals.
    exit_now, stdout, stderr, blocked_exit = os._exit, sys.stdout, sys.stderr, BLOCKED_EXIT
    status = 1
    try:
        status = _run(path)
        if refused:
            stderr.write("sandbox refused: " + "; ".join(refused[:3]) + "\n")
            status = blocked_exit
    finally:
        for stream in (stdout, stderr):
            try:  # noqa: SIM105 (no contextlib: a global the code may have removed)
                stream.flush()
            except BaseException:
                pass
        exit_now(status)


if __name__ == "__main__":
    main()
