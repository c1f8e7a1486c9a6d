"""A seccomp filter for the sandbox, built with libseccomp (Debian's ``libseccomp2``, which apt
and systemd depend on, so it is on every Debian and Ubuntu machine) through ctypes, and handed to
bubblewrap as BPF (``bwrap --seccomp FD``).

The filter allows every system call but the ones no model code or drafted adapter needs and
that widen a sandbox's reach into the kernel: tracing other processes, loading kernel modules
or BPF programs, keyrings, mounting, new namespaces (also ``clone`` with ``CLONE_NEWUSER``;
``clone3``, whose flags seccomp cannot read, answers ENOSYS so the C library falls back to
``clone``), io_uring (which bypasses this filter), userfaultfd, perf events, kexec, reboot,
swap, accounting and quotas. Refused calls fail with EPERM. This is Flatpak's approach (a deny
list on top of namespaces), narrowed to what a headless PyTorch process never calls.

Where libseccomp cannot be loaded, :func:`filter_bytes` returns None and the sandbox runs with
namespaces and limits only (``available()`` says why)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import tempfile

# System calls refused with EPERM.
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "chroot",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "iopl",
    "ioperm",
    "personality",
    "name_to_handle_at",
    "open_by_handle_at",
    "lookup_dcookie",
    "vhangup",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "nfsservctl",
    "uselib",
)
CLONE_NEWUSER = 0x10000000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)  # SCMP_ACT_ERRNO(code)


class _Arg(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@functools.cache
def _lib() -> ctypes.CDLL | str:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        return f"libseccomp cannot be loaded ({exc}); install libseccomp2"
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_Arg),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def available() -> str | None:
    """None when a filter can be built here, else why not."""
    lib = _lib()
    return lib if isinstance(lib, str) else None


@functools.cache
def filter_bytes() -> bytes | None:
    """The compiled BPF program (for ``bwrap --seccomp``), or None without libseccomp."""
    lib = _lib()
    if isinstance(lib, str):
        return None
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        return None
    try:
        deny = _errno_action(errno.EPERM)
        for name in DENIED:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue  # not a system call on this architecture
            if lib.seccomp_rule_add_array(ctx, deny, nr, 0, None) != 0:
                return None
        clone = lib.seccomp_syscall_resolve_name(b"clone")
        if clone >= 0:
            cond = (_Arg * 1)(_Arg(0, SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER))
            if lib.seccomp_rule_add_array(ctx, deny, clone, 1, cond) != 0:
                return None
        clone3 = lib.seccomp_syscall_resolve_name(b"clone3")
        if (
            clone3 >= 0
            and lib.seccomp_rule_add_array(ctx, _errno_action(errno.ENOSYS), clone3, 0, None) != 0
        ):
            return None
        with tempfile.TemporaryFile() as fh:
            if lib.seccomp_export_bpf(ctx, fh.fileno()) != 0:
                return None
            fh.seek(0)
            return fh.read()
    finally:
        lib.seccomp_release(ctx)


def filter_fd() -> int | None:
    """A readable file descriptor holding the filter (the caller passes it to bwrap and closes
    it), or None without libseccomp."""
    data = filter_bytes()
    if data is None:
        return None
    with tempfile.TemporaryFile() as fh:
        fh.write(data)
        fh.flush()
        fd = os.dup(fh.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


__all__ = ["DENIED", "available", "filter_bytes", "filter_fd"]
