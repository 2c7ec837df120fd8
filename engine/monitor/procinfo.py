"""What a running process is, read from outside: its argv, working directory, environment and
where its output goes. `cockpit adopt` (engine.run.launchers.adopted) records these so that a process
cockpit did not start can be started again under cockpit later.

Linux: /proc/PID/cmdline, /proc/PID/cwd, /proc/PID/environ and /proc/PID/fd/{1,2}, read as
the bytes the kernel gives. macOS: the `kern.procargs2` sysctl (CTL_KERN, KERN_PROCARGS2, pid)
through ctypes, whose buffer is `int32 argc`, the executable's path, NUL padding, argc argument
strings, then the environment strings, each NUL-terminated (`parse_procargs2`); the working
directory through psutil (proc_pidinfo). Unverified on a Mac: the macOS path is tested here with
a crafted buffer and a ctypes stand-in for sysctl, not against a real kernel.

Reading another user's process raises PermissionError; a process that is gone,
FileNotFoundError or ProcessLookupError. Nothing here signals or changes a process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# <sys/sysctl.h>
CTL_KERN = 1
KERN_ARGMAX = 8
KERN_PROCARGS2 = 49


@dataclass(frozen=True)
class ProcessInfo:
    """A process as it was when read."""

    pid: int
    argv: list[str]
    cwd: str
    env: dict[str, str]
    # what could not be decoded as UTF-8 (an argument's index, a variable's name): replaced in
    # argv with U+FFFD, left out of env
    undecodable: list[str] = field(default_factory=list)


def _decode(raw: bytes, what: str, undecodable: list[str]) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        undecodable.append(what)
        return raw.decode(errors="replace")


def _split(data: bytes) -> list[bytes]:
    """NUL-separated strings, the last one's NUL optional."""
    parts = data.split(b"\0")
    if parts and parts[-1] == b"":
        parts.pop()
    return parts


def _environ(entries: list[bytes], undecodable: list[str]) -> dict[str, str]:
    env = {}
    for entry in entries:
        name, eq, value = entry.partition(b"=")
        if not eq or not name:
            continue  # not NAME=VALUE: nothing a child could be given back
        try:
            env[name.decode()] = value.decode()
        except UnicodeDecodeError:
            undecodable.append(name.decode(errors="replace"))
    return env


# ---------------------------------------------------------------- Linux


def read_linux(pid: int, root: Path | str = "/") -> ProcessInfo:
    proc = Path(root) / "proc" / str(pid)
    undecodable: list[str] = []
    argv = [_decode(a, f"argument {i}", undecodable)
            for i, a in enumerate(_split((proc / "cmdline").read_bytes()))]
    cwd = os.readlink(proc / "cwd")
    env = _environ(_split((proc / "environ").read_bytes()), undecodable)
    return ProcessInfo(pid, argv, cwd, env, undecodable)


def output_files(pid: int, root: Path | str = "/") -> dict[str, list[str]]:
    """The regular files the process's stdout and stderr write to, each with which of the two
    write it (one file for both, as `> train.log 2>&1` makes), Linux only: {} where neither is a
    file (a terminal, a pipe, /dev/null) or they cannot be read."""
    found: dict[str, list[str]] = {}
    by_inode: dict[tuple[int, int], str] = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        link = Path(root) / "proc" / str(pid) / "fd" / str(fd)
        try:
            info = os.stat(link)   # the open file itself, even if renamed since
            target = os.readlink(link)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or target.endswith(" (deleted)"):
            continue  # not a file, or one whose name is gone: nothing to follow by name
        target = by_inode.setdefault((info.st_dev, info.st_ino), target)
        found.setdefault(target, []).append(name)
    return found


# ---------------------------------------------------------------- macOS


def parse_procargs2(buf: bytes) -> tuple[str, list[str], list[str]]:
    """(executable path, argv, environment entries) from a KERN_PROCARGS2 buffer: a native
    int32 argc, the executable's path NUL-terminated, NULs padding it, argc NUL-terminated
    arguments, then NAME=VALUE strings until an empty one (what follows, the `apple` strings
    the loader was given, is not the environment). Raises ValueError on a buffer too short to
    hold what its argc says."""
    if len(buf) < 4:
        raise ValueError(f"KERN_PROCARGS2 buffer of {len(buf)} bytes: no argc")
    argc = int.from_bytes(buf[:4], sys.byteorder, signed=True)
    if argc < 0:
        raise ValueError(f"KERN_PROCARGS2 argc {argc}")
    end = buf.find(b"\0", 4)
    if end < 0:
        raise ValueError("KERN_PROCARGS2 buffer ends inside the executable's path")
    exec_path = buf[4:end].decode(errors="replace")
    pos = end
    while pos < len(buf) and buf[pos] == 0:   # the padding after the path
        pos += 1
    strings: list[bytes] = []
    while pos < len(buf) and len(strings) < argc:
        end = buf.find(b"\0", pos)
        if end < 0:
            end = len(buf)
        strings.append(buf[pos:end])
        pos = end + 1
    if len(strings) < argc:
        raise ValueError(f"KERN_PROCARGS2 buffer holds {len(strings)} of {argc} arguments")
    env: list[bytes] = []
    while pos < len(buf):
        end = buf.find(b"\0", pos)
        if end < 0:
            end = len(buf)
        if end == pos:
            break   # the empty string that ends the environment
        env.append(buf[pos:end])
        pos = end + 1
    # bytes that are not UTF-8 kept as surrogates: the caller decides what to do with them
    return (exec_path, [a.decode(errors="surrogateescape") for a in strings],
            [e.decode(errors="surrogateescape") for e in env])


@functools.cache
def _sysctl():
    """libc's sysctl(int *name, u_int namelen, void *oldp, size_t *oldlenp, void *newp,
    size_t newlen), loaded once."""
    fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.dylib", use_errno=True).sysctl
    fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_uint, ctypes.c_void_p,
                   ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def procargs2(pid: int, fn=None) -> bytes:
    """The raw KERN_PROCARGS2 buffer of a process (`fn`: the C sysctl; tests hand in a ctypes
    callback). OSError with the errno where the kernel refuses (EINVAL for a process of another
    user or one that is gone, as xnu answers both)."""
    fn = fn or _sysctl()

    def call(mib: list[int], size: int) -> bytes:
        names = (ctypes.c_int * len(mib))(*mib)
        buf = ctypes.create_string_buffer(size)
        length = ctypes.c_size_t(size)
        if fn(names, len(mib), buf, ctypes.byref(length), None, 0) != 0:
            errno = ctypes.get_errno() or 22
            raise OSError(errno, os.strerror(errno))
        return buf.raw[:length.value]

    argmax = int.from_bytes(call([CTL_KERN, KERN_ARGMAX], 4)[:4], sys.byteorder) or (1 << 20)
    return call([CTL_KERN, KERN_PROCARGS2, pid], argmax)


def read_macos(pid: int, fn=None) -> ProcessInfo:
    try:
        buf = procargs2(pid, fn)
    except OSError as e:
        # xnu says EINVAL for another user's process as for one that is gone: tell them apart
        if not psutil.pid_exists(pid):
            raise ProcessLookupError(e.errno, f"no process {pid}") from None
        raise PermissionError(e.errno, f"sysctl kern.procargs2 refused ({e.strerror})") from None
    _, raw_argv, env_entries = parse_procargs2(buf)
    undecodable: list[str] = []
    argv = [_decode(a.encode(errors="surrogateescape"), f"argument {i}", undecodable)
            for i, a in enumerate(raw_argv)]
    env = _environ([e.encode(errors="surrogateescape") for e in env_entries], undecodable)
    try:
        cwd = psutil.Process(pid).cwd()
    except psutil.AccessDenied as e:
        raise PermissionError(1, f"its working directory cannot be read ({e})") from None
    except psutil.NoSuchProcess:
        raise ProcessLookupError(3, f"no process {pid}") from None
    return ProcessInfo(pid, argv, cwd, env, undecodable)


def read(pid: int, platform: str = sys.platform) -> ProcessInfo:
    """The process's argv, working directory and environment, as this platform allows."""
    if platform == "darwin":
        return read_macos(pid)
    if platform.startswith("linux"):
        return read_linux(pid)
    raise OSError(f"reading another process's arguments and environment is not supported on {platform}")
