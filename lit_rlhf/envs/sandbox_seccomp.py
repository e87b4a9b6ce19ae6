"""The seccomp layer of the code sandbox: a classic-BPF system-call filter, no library needed.

Installed (``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)``, which needs ``no_new_privs`` or
CAP_SYS_ADMIN, so it holds for any user) in the sandboxed process before it executes the
interpreter; it cannot be removed, and every process and thread of the code inherits it. It
answers ``EPERM`` to the system calls that raise no audit event in Python or that reach other
processes and the kernel's namespaces and mounts:

- file-system nodes: ``mknod``/``mknodat`` (``os.mkfifo``, ``os.mknod``);
- other processes: ``kill``, ``tkill``, ``rt_(tg)sigqueueinfo``, ``pidfd_open``,
  ``pidfd_send_signal``, ``pidfd_getfd``, ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``,
  and what changes another process's priority, CPU set or memory placement
  (``setpriority``, ``sched_set*``, ``ioprio_set``, ``migrate_pages``, ``move_pages``);
- signals by proxy: ``fcntl`` ``F_SETOWN``/``F_SETSIG``/``F_SETOWN_EX`` and ``ioctl``
  ``FIOSETOWN``/``SIOCSPGRP`` (SIGIO to another process when a descriptor is ready);
- new processes and sessions: ``fork``, ``vfork``, ``clone`` without ``CLONE_THREAD`` or with a
  namespace flag, ``setsid``, ``setpgid`` (threads stay allowed; ``clone3``, whose flags a
  filter cannot read, answers ``ENOSYS`` so the C library falls back to ``clone``);
- the network: ``socket``;
- namespaces, mounts, keys, BPF, io_uring, modules, reboot and the like.

A call of another architecture's ABI (x32, i386 on x86_64) kills the process. Filter layout and
constants: the kernel's Documentation/userspace-api/seccomp_filter.rst, ``linux/filter.h`` and
``linux/seccomp.h``; system-call numbers: ``asm/unistd_64.h`` (x86_64) and
``asm-generic/unistd.h`` (aarch64).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (low words: LE)
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_CLONE_THREAD, _CLONE_NAMESPACES = 0x00010000, 0x7E020000  # NEWNS|CGROUP|UTS|IPC|USER|PID|NET
# Commands that make the kernel signal another process when a descriptor is ready (SIGIO):
# fcntl F_SETOWN, F_SETSIG, F_SETOWN_EX; ioctl FIOSETOWN, SIOCSPGRP.
_SIGNAL_OWNER = {"fcntl": (8, 10, 15), "ioctl": (0x8901, 0x8902)}

_DENIED = (
    "mknod", "mknodat", "kill", "tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
    "pidfd_send_signal", "pidfd_getfd", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "fork", "vfork", "setsid", "setpgid", "socket", "unshare", "setns", "mount",
    "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at", "keyctl",
    "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "kexec_load", "kexec_file_load", "init_module",
    "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct", "personality",
    "setpriority", "sched_setparam", "sched_setscheduler", "sched_setaffinity", "sched_setattr",
    "ioprio_set", "migrate_pages", "move_pages",
)  # fmt: skip
# machine -> (AUDIT_ARCH value, the first number of a foreign ABI or None, numbers by name)
_ARCHES: dict[str, tuple[int, int | None, dict[str, int]]] = {
    "x86_64": (0xC000003E, 0x40000000, {
        "mknod": 133, "mknodat": 259, "kill": 62, "tkill": 200, "rt_sigqueueinfo": 129,
        "rt_tgsigqueueinfo": 297, "pidfd_open": 434, "pidfd_send_signal": 424,
        "pidfd_getfd": 438, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "kcmp": 312, "fork": 57, "vfork": 58, "setsid": 112, "setpgid": 109, "socket": 41,
        "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "mount_setattr": 442, "name_to_handle_at": 303,
        "open_by_handle_at": 304, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "personality": 135,
        "setpriority": 141, "sched_setparam": 142, "sched_setscheduler": 144,
        "sched_setaffinity": 203, "sched_setattr": 314, "ioprio_set": 251,
        "migrate_pages": 256, "move_pages": 279, "clone": 56, "clone3": 435, "fcntl": 72,
        "ioctl": 16,
    }),
    "aarch64": (0xC00000B7, None, {
        "mknodat": 33, "kill": 129, "tkill": 130, "rt_sigqueueinfo": 138,
        "rt_tgsigqueueinfo": 240, "pidfd_open": 434, "pidfd_send_signal": 424,
        "pidfd_getfd": 438, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
        "kcmp": 272, "setsid": 157, "setpgid": 154, "socket": 198, "unshare": 97, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "name_to_handle_at": 264, "open_by_handle_at": 265,
        "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142,
        "swapon": 224, "swapoff": 225, "acct": 89, "personality": 92, "setpriority": 140,
        "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
        "sched_setattr": 274, "ioprio_set": 30, "migrate_pages": 238, "move_pages": 239,
        "clone": 220, "clone3": 435, "fcntl": 25, "ioctl": 29,
    }),
}  # fmt: skip


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter's instructions (``struct sock_filter[]``) for ``machine`` (default: this
    one); None on an architecture without a table here (the layer is then missing)."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, foreign_abi, numbers = arch
    deny = _op(_RET, _RET_ERRNO | errno.EPERM)
    ops = [_op(_LD_W_ABS, _ARCH), _op(_JEQ, audit_arch, jt=1), _op(_RET, _RET_KILL_PROCESS)]
    ops.append(_op(_LD_W_ABS, _NR))
    if foreign_abi is not None:
        ops += [_op(_JGE, foreign_abi, jf=1), _op(_RET, _RET_KILL_PROCESS)]
    for name in _DENIED:
        if name in numbers:
            ops += [_op(_JEQ, numbers[name], jf=1), deny]
    ops += [_op(_JEQ, numbers["clone3"], jf=1), _op(_RET, _RET_ERRNO | errno.ENOSYS)]
    for name, commands in _SIGNAL_OWNER.items():  # allowed unless arg 1 is one of these
        ops += [_op(_JEQ, numbers[name], jf=len(commands) + 3), _op(_LD_W_ABS, _ARG1)]
        ops += [_op(_JEQ, command, jt=len(commands) - i) for i, command in enumerate(commands)]
        ops += [_op(_RET, _RET_ALLOW), deny]
    ops += [
        _op(_JEQ, numbers["clone"], jf=5),
        _op(_LD_W_ABS, _ARG0),
        _op(_JSET, _CLONE_NAMESPACES, jt=2),  # a new namespace: deny
        _op(_JSET, _CLONE_THREAD, jf=1),  # not a thread (a new process): deny
        _op(_RET, _RET_ALLOW),
        deny,
    ]
    ops.append(_op(_RET, _RET_ALLOW))
    return b"".join(ops)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def prepare(program: bytes) -> tuple[_Program, ctypes.Array[ctypes.c_char]]:
    """The ``struct sock_fprog`` for ``program``, with the buffer it points into (keep both
    alive); built in the parent, so that the forked child only makes the system call."""
    buffer = ctypes.create_string_buffer(program, len(program))
    return _Program(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p)), buffer


def install(libc: ctypes.CDLL, prepared: tuple[_Program, object]) -> bool:
    """Installs the filter in this process (and so in all it starts); whether the kernel took
    it (it needs ``no_new_privs`` set first, or CAP_SYS_ADMIN)."""
    fprog = prepared[0]
    return bool(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0)
