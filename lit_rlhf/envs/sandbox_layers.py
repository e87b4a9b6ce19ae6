"""The operating-system layers of the code sandbox, entered in the forked child before ``exec``.

Each layer is tried and skipped when the kernel or the privileges refuse it; the child's
bootstrap (:mod:`lit_rlhf.envs.sandbox_boot`) reports which held, and the parent refuses to run
the code without all of them unless told ``allow_weak_sandbox``. As root (or with
CAP_SYS_ADMIN) the namespaces are made directly; without, inside a new user namespace
(``CLONE_NEWUSER``, the caller's own uid and gid mapped to themselves), which the kernel gives
unprivileged users unless the host blocks it (Ubuntu's
``kernel.apparmor_restrict_unprivileged_userns=1``, Debian's older
``kernel.unprivileged_userns_clone=0``, ``user.max_user_namespaces=0``). Linux >= 5.12
(``mount_setattr``):

- a new network namespace: only a loopback device that is down, so no connection anywhere;
- a new PID namespace, the code's process its pid 1 (an extra process waits for it), with a
  fresh read-only procfs on ``/proc``: no process outside is visible (``/proc/<trainer>`` does
  not exist), signalled or traced; when the waiting process dies, pid 1 is killed
  (``PR_SET_PDEATHSIG``), and with it every process of the namespace;
- a new mount namespace in which every mount is read-only except a bind mount of the scratch
  folder (writes elsewhere fail with EROFS even for root), which is ``noexec``;
- an empty capability bounding set and ``no_new_privs``, so the child cannot remount, load
  modules, trace or signal other users' processes, or regain privileges;
- a seccomp filter (:mod:`lit_rlhf.envs.sandbox_seccomp`; needs only ``no_new_privs``, so it
  holds for every user): no ``mknod``/``mkfifo``, pidfds, signals to other processes, new
  processes or sessions, sockets, namespaces or mounts.

Always: resource limits on CPU seconds, address space, file size, open files and core dumps.
RLIMIT_NPROC is not set: the kernel exempts uid 0 from it; the seccomp filter refuses new
processes instead (and the audit hook refuses forks).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import struct
from dataclasses import dataclass
from typing import NoReturn

from lit_rlhf.envs import sandbox_seccomp

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
CLONE_NEWUSER = 0x10000000
CPU_LIMIT_EXIT = 88
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 1 << 14, 1 << 18
# mount_setattr's number is 442 on every architecture (the unified table since Linux 5.12).
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 1
_MOUNT_ATTR_NOSUID_NODEV_NOEXEC = 0x2 | 0x4 | 0x8
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 24, 38


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()  # loaded in the parent: the child only calls into it
_PROGRAM = sandbox_seccomp.filter_program()
_SECCOMP = None if _PROGRAM is None else sandbox_seccomp.prepare(_PROGRAM)  # built here, too


@dataclass(frozen=True)
class SandboxLimits:
    """The resource limits of one run (hard limits: the code cannot raise them)."""

    cpu_s: int
    """CPU seconds; then SIGXCPU (SIGKILL in a PID namespace, where pid 1 ignores SIGXCPU)."""
    memory_bytes: int
    """Address-space limit (RLIMIT_AS): an allocation above it raises MemoryError."""
    file_bytes: int
    """Largest file the code may write (RLIMIT_FSIZE); also bounds the captured output."""
    open_files: int = 64
    """Most open file descriptors (RLIMIT_NOFILE)."""


def enter_sandbox(scratch: str, limits: SandboxLimits) -> None:
    """Enters every layer that the kernel allows; for ``subprocess.Popen(preexec_fn=...)``.

    Runs in the child between fork and exec, so it only makes system calls (no imports, no
    locks); in a new PID namespace it forks once more, and the first child only waits.
    ``scratch`` must be an absolute path; the child's working directory becomes it.
    """
    new_pid_ns = False
    if _LIBC is not None:
        new_pid_ns = _enter_namespaces(_LIBC, scratch)
        for capability in range(64):
            if _LIBC.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                break
        _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.chdir(scratch)  # Popen chdirs before this hook: enter the bind mount, not the folder below
    if new_pid_ns:
        child = os.fork()  # the child is pid 1 of the new namespace and goes on to exec
        if child != 0:
            _reap(child, limits.cpu_s)
        assert _LIBC is not None
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # procfs shows the PID namespace of the process that mounts it: pid 1 does.
        flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        _LIBC.mount(b"proc", b"/proc", b"proc", flags, None)
    if _LIBC is not None and _SECCOMP is not None:
        sandbox_seccomp.install(_LIBC, _SECCOMP)  # it refuses mount and fork
    # Last, and only in the process that execs: this is still a forked copy of the trainer, whose
    # address space is far above the limit, so any allocation after RLIMIT_AS fails (a
    # MemoryError here, or in the reaper above, failed the sandbox in a large trainer process).
    # Pid 1 ignores SIGXCPU: in a PID namespace the CPU limit acts through the hard limit.
    _set_rlimits(limits, cpu_grace_s=0 if new_pid_ns else 1)


def _enter_namespaces(libc: ctypes.CDLL, scratch: str) -> bool:
    """Unshares the network, PID and mount namespaces (inside a new user namespace where the
    caller may not do so itself) and makes the file system read-only but ``scratch``; whether
    the PID namespace was made."""
    uid, gid = os.getuid(), os.getgid()
    everything = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if libc.unshare(everything) == 0:
        _readonly_except(libc, scratch)
        return True
    if libc.unshare(CLONE_NEWUSER | everything) == 0:
        _map_own_ids(uid, gid)
        _readonly_except(libc, scratch)
        return True
    if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) == 0:
        _readonly_except(libc, scratch)
    else:
        libc.unshare(CLONE_NEWNET)
    return False


def _map_own_ids(uid: int, gid: int) -> None:
    """Maps the caller's uid and gid to themselves in its new user namespace (the one mapping
    an unprivileged process may write; setgroups must be denied before the gid map)."""
    for name, line in (("setgroups", b"deny"), ("uid_map", b"%d %d 1" % (uid, uid)),
                       ("gid_map", b"%d %d 1" % (gid, gid))):  # fmt: skip
        try:
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        except OSError:
            continue  # setgroups is missing before Linux 3.19
        try:
            os.write(fd, line)
        except OSError:
            pass
        finally:
            os.close(fd)


def _reap(child: int, cpu_s: int) -> NoReturn:
    """The parent side of the PID-namespace fork: waits for ``child``, then dies as it did.

    Its descriptors are closed first, so that Popen sees the exec of the child, not of this
    process, and a dead child's stdin pipe breaks. The CPU limit ends pid 1 with SIGKILL; that
    death is reported as :data:`CPU_LIMIT_EXIT`.
    """
    # Every descriptor, also those above RLIMIT_NOFILE that Popen closes only after this hook.
    os.closerange(0, 2**31 - 1)
    _, status = os.waitpid(child, 0)
    if not os.WIFSIGNALED(status):
        os._exit(os.waitstatus_to_exitcode(status))
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    # rusage samples ticks: a child killed at 1 CPU second reports about 0.95 of them.
    if usage.ru_utime + usage.ru_stime >= 0.75 * cpu_s:
        os._exit(CPU_LIMIT_EXIT)
    os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(1)


def _readonly_except(libc: ctypes.CDLL, scratch: str) -> None:
    """Makes every mount read-only in this (new, private) mount namespace except ``scratch``."""
    path = scratch.encode()
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return  # changes would leak into the parent's namespace
    if libc.mount(path, path, None, _MS_BIND, None) != 0:
        return  # without its own mount, scratch would turn read-only with the rest
    set_rdonly = ctypes.create_string_buffer(struct.pack("QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0))
    # The scratch folder: writable, but nothing in it runs as native code (no exec, no mmap
    # PROT_EXEC of a file written there: a C extension the code wrote cannot be loaded).
    writable = (_MOUNT_ATTR_NOSUID_NODEV_NOEXEC, _MOUNT_ATTR_RDONLY, 0, 0)
    clear_rdonly = ctypes.create_string_buffer(struct.pack("QQQQ", *writable))
    root_ro = libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, b"/", _AT_RECURSIVE, set_rdonly, 32)
    if root_ro == 0:
        libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path, 0, clear_rdonly, 32)


def _set_rlimits(limits: SandboxLimits, cpu_grace_s: int) -> None:
    for which, value in (
        (resource.RLIMIT_FSIZE, limits.file_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + cpu_grace_s))
    memory = (limits.memory_bytes, limits.memory_bytes)  # built before the limit holds
    resource.setrlimit(resource.RLIMIT_AS, memory)  # the last allocation-free step before exec
