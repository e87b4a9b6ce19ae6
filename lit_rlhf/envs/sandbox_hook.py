"""The audit hook of the code sandbox, built so that the tool's code cannot change its verdict.

The sandboxed bootstrap (:mod:`lit_rlhf.envs.sandbox_boot`) executes this file into a private
namespace, calls :func:`build` and drops the namespace: the hook then lives only in the
interpreter's C-level hook list (PEP 578: it cannot be removed). Tool code can still reach
frames of these functions (a refused operation's traceback holds the hook's frame, and
``tb_frame`` must stay readable for tracebacks to work), so the functions are built so that
nothing reachable from such a frame changes a later verdict:

- no function reads a global or a builtin name: every name it uses is a parameter whose default
  :func:`build` binds (``tests/envs/test_code_tool_sandbox.py`` checks the bytecode), so
  rebinding module globals, ``builtins`` or the hook's ``__globals__`` does nothing;
- the bound defaults are immutable (tuples, frozensets, strings, C functions such as
  ``posix.lstat``, or these functions, whose ``__code__`` and ``__defaults__`` the hook refuses
  to let anyone replace); the one mutable value, the list of refusals, only feeds the report;
- no Python-level library function is called (``os.path.realpath`` reads ``os`` attributes the
  code could patch): paths are resolved here with ``lstat`` and ``readlink``;
- nothing of the code's own is called while the hook runs (no ``__fspath__``, ``__eq__``,
  ``__hash__`` or ``__repr__`` of its objects): only exact ``str``, ``bytes`` and ``int``
  arguments are looked at; a write through any other path object is refused.
"""

from __future__ import annotations

import os
from typing import Any

_S_IFMT, _S_IFLNK, _S_IFDIR = 0o170000, 0o120000, 0o040000
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Events refused whatever their arguments: sockets, processes, signals, limit changes, the
# modules that reach around the events, and the ways into the hook's own frames and objects.
BANNED_EVENT_PREFIXES = (
    "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.kill", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "ctypes.",
    "pty.", "os.startfile", "sqlite3.", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "sys._current_frames", "sys._current_exceptions", "sys.settrace",
    "sys.setprofile", "sys.addaudithook", "sys.monitoring", "code.__new__", "cpython.",
    "winreg.", "_winapi.",
)  # fmt: skip
# C modules that call around the audit events (ctypes, raw sockets, processes, file writes of
# their own: readline's history, dbm, POSIX shared memory) or poke at the interpreter's memory.
BANNED_MODULES = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "socket", "_socket", "ssl", "_ssl",
     "_xxsubinterpreters", "_xxinterpchannels", "_multiprocessing", "multiprocessing",
     "readline", "_dbm", "_gdbm", "_posixshmem", "_testcapi", "_testinternalcapi",
     "_testmultiphase", "_testbuffer", "_ctypes_test", "_xxtestfuzz"}
)  # fmt: skip
# Attributes whose change would swap the code of one of the hook's functions.
GUARDED_ATTRIBUTES = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
# event -> (argument index, refused values): the fcntl and ioctl commands that make the kernel
# signal another process (SIGIO) when a descriptor is ready.
SIGNAL_OWNER_EVENTS = (
    ("fcntl.fcntl", 1, frozenset({8, 10, 15})),  # F_SETOWN, F_SETSIG, F_SETOWN_EX
    ("fcntl.ioctl", 1, frozenset({0x8901, 0x8902})),  # FIOSETOWN, SIOCSPGRP
)
# event -> (indices of path arguments, indices of dir_fd arguments); the audit events of
# CPython 3.10-3.12 (docs.python.org/3/library/audit_events.html).
PATH_EVENTS = (
    ("os.remove", (0,), (1,)), ("os.rmdir", (0,), (1,)), ("os.rename", (0, 1), (2, 3)),
    ("os.mkdir", (0,), (2,)), ("os.symlink", (1,), (2,)), ("os.link", (0, 1), (2, 3)),
    ("os.chmod", (0,), (2,)), ("os.chown", (0,), (3,)), ("os.utime", (0,), (3,)),
    ("os.truncate", (0,), ()), ("os.chflags", (0,), ()), ("os.setxattr", (0,), ()),
    ("os.removexattr", (0,), ()),
)  # fmt: skip


def real_path(
    path: str, getcwd: Any = None, lstat: Any = None, readlink: Any = None,
    os_error: Any = None, s_ifmt: int = _S_IFMT, s_iflnk: int = _S_IFLNK,
) -> str | None:  # fmt: skip
    """``path`` made absolute with every symlink and ``..`` resolved, as
    ``os.path.realpath`` does (a missing part is kept as written); None after 40 links."""
    if not path.startswith("/"):
        path = getcwd() + "/" + path
    todo = path.split("/")
    todo.reverse()
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part == "" or part == ".":
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        current = "/" + "/".join(done) + "/" + part if done else "/" + part
        try:
            mode = lstat(current).st_mode
        except os_error:
            mode = 0
        if mode & s_ifmt != s_iflnk:
            done.append(part)
            continue
        links += 1
        if links > 40:
            return None
        target = readlink(current)
        if target.startswith("/"):
            done = []
        parts = target.split("/")
        parts.reverse()
        todo.extend(parts)
    return "/" + "/".join(done)


def inside(
    path: object, scratch: str, real_path: Any = None, type_: Any = None, str_: Any = None,
    bytes_: Any = None,
) -> bool:  # fmt: skip
    """Whether ``path`` (an exact str or bytes; symlinks resolved) lies in ``scratch``."""
    kind = type_(path)
    if kind is bytes_:
        path = path.decode("utf-8", "surrogateescape")  # type: ignore[attr-defined]
    elif kind is not str_:
        return False
    real = real_path(path)
    return real is not None and (real == scratch or real.startswith(scratch + "/"))


def open_verdict(
    args: tuple[Any, ...], scratch: str, inside: Any = None, real_path: Any = None,
    stat: Any = None, pid: str = "", os_error: Any = None, type_: Any = None, int_: Any = None,
    str_: Any = None, bytes_: Any = None, write_flags: int = _WRITE_FLAGS,
    s_ifmt: int = _S_IFMT, s_ifdir: int = _S_IFDIR,
) -> str | None:  # fmt: skip
    """The verdict on an ``open`` event (``open``, ``os.open``, ``io.open``)."""
    path, mode, flags = args[0], args[1], args[2]
    if path is None or type_(path) is int_:
        return None  # an already open descriptor: it passed this check when it was opened
    if type_(flags) is not int_:
        return "an open with flags that are not an int"
    if type_(path) is not str_ and type_(path) is not bytes_:
        # Its __fspath__ could answer the hook one path and the open another.
        return "open of a path object (pass a str)" if flags & write_flags or mode is None else None
    devnull = type_(path) is str_ and path == "/dev/null"
    if flags & write_flags and not devnull and not inside(path, scratch):
        return f"write to {path!r} outside the scratch folder"
    # Another process's files (environ, mem, root, cwd) where the host's procfs is in sight.
    text = path.decode("utf-8", "surrogateescape") if type_(path) is bytes_ else path
    real = real_path(text)
    if real is None:
        return f"open of {path!r} through more than 40 symlinks"
    first = real.split("/")[2] if real.startswith("/proc/") else ""
    if first.isdigit() and first != pid:
        return f"open of {path!r}: another process's files"
    if mode is None:  # os.open: a directory's descriptor would let dir_fd paths escape the check
        try:
            is_dir = stat(path).st_mode & s_ifmt == s_ifdir
        except os_error:
            return None
        return f"directory descriptor for {path!r}" if is_dir else None
    return None


def import_verdict(
    args: tuple[Any, ...], scratch: str, inside: Any = None, type_: Any = None,
    str_: Any = None, len_: Any = None, banned_modules: frozenset[str] = BANNED_MODULES,
) -> str | None:  # fmt: skip
    """The verdict on an ``import`` event: a banned module under any dotted name (an extension
    loaded as ``pkg._ctypes`` runs ``_ctypes``'s init: the last part names it), or an
    extension module file in the scratch folder (the code's own native code)."""
    name = args[0]
    if type_(name) is not str_:
        return "import of a module named by a non-str"
    for part in name.split("."):
        if part in banned_modules:
            return f"import of {name}"
    filename = args[1] if len_(args) > 1 else None
    if filename is not None and (type_(filename) is not str_ or inside(filename, scratch)):
        return f"import of {name} from a file of the code's own"
    return None


def verdict(
    event: str, args: tuple[Any, ...], scratch: str, open_verdict: Any = None,
    import_verdict: Any = None, inside: Any = None, type_: Any = None, str_: Any = None,
    int_: Any = None, len_: Any = None, function_: Any = None, private: Any = None,
    banned_prefixes: tuple[str, ...] = BANNED_EVENT_PREFIXES,
    guarded: frozenset[str] = GUARDED_ATTRIBUTES,
    owner_events: tuple[tuple[str, int, frozenset[int]], ...] = SIGNAL_OWNER_EVENTS,
    path_events: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = PATH_EVENTS,
) -> str | None:  # fmt: skip
    """Why the event is refused, or None to allow it."""
    if event == "open":
        return open_verdict(args, scratch)
    if event == "import":
        return import_verdict(args, scratch)
    if event.startswith(banned_prefixes):
        return event
    if event == "object.__setattr__" or event == "object.__delattr__":
        target, name = args[0], args[1]
        ours = type_(target) is function_ and target.__globals__ is private
        if ours and (type_(name) is not str_ or name in guarded):
            return f"{event} of the audit hook's functions"
        return None
    for name, index, commands in owner_events:
        if name == event and (type_(args[index]) is not int_ or args[index] in commands):
            return f"{event} with a command that signals another process"
    for name, paths, dir_fds in path_events:
        if name != event:
            continue
        for i in dir_fds:
            value = args[i] if i < len_(args) else None
            if value is not None and (type_(value) is not int_ or value != -1):
                return f"{event} relative to a directory descriptor"
        for i in paths:
            fd = event == "os.truncate" and type_(args[i]) is int_
            if not fd and not inside(args[i], scratch):
                return f"{event} outside the scratch folder"
    return None


def hook(
    event: object, args: tuple[object, ...], verdict: Any = None, scratch: str = "",
    refused: Any = None, type_: Any = None, str_: Any = None, permission_error: Any = None,
) -> None:  # fmt: skip
    """The audit hook: raises PermissionError (which aborts the operation) for a refused
    event and records why in ``refused``."""
    if type_(event) is not str_:
        return  # only sys.audit from the code itself sends those; nothing happens on them
    reason = verdict(event, args, scratch)
    if reason is not None:
        refused.append(reason)
        raise permission_error("blocked by the sandbox: " + reason)


def build(scratch: str, refused: list[str]) -> Any:
    """The hook for the scratch folder ``scratch`` (a real path), appending to ``refused``.

    Each function above is copied with an empty globals dict (no builtins either: a name that
    slipped through would raise, refusing the event) and its parameters bound.
    """
    function: Any = type(build)
    private: dict[str, Any] = {"__builtins__": {}}
    kinds = {"type_": type, "str_": str, "bytes_": bytes, "int_": int, "len_": len}

    def bind(template: Any, **values: Any) -> Any:
        code = template.__code__
        names = code.co_varnames[code.co_argcount - len(template.__defaults__) : code.co_argcount]
        values = {**kinds, **values}
        pairs = zip(names, template.__defaults__, strict=True)
        defaults = tuple(values.get(name, default) for name, default in pairs)
        return function(code, private, template.__name__, defaults)

    real = bind(real_path, getcwd=os.getcwd, lstat=os.lstat, readlink=os.readlink,
                os_error=OSError)  # fmt: skip
    within = bind(inside, real_path=real)
    on_open = bind(open_verdict, inside=within, real_path=real, stat=os.stat,
                   pid=str(os.getpid()), os_error=OSError)  # fmt: skip
    on_import = bind(import_verdict, inside=within)
    judge = bind(verdict, open_verdict=on_open, import_verdict=on_import, inside=within,
                 function_=function, private=private)  # fmt: skip
    return bind(hook, verdict=judge, scratch=scratch, refused=refused,
                permission_error=PermissionError)  # fmt: skip
