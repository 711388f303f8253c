"""The pod supervisor program (the container runtime's ``shim``), run as a script.

``python -I -S shim.py <plan> <argv...>`` (built by :func:`qosflow.local.supervisor.shim_command`)
pins itself to the pod's cores and joins its cgroup (the container inherits both), forks, and in
the child enters the pod's sandbox before it execs the container. It forwards SIGTERM and SIGINT
to the container, waits for it, and writes its exit code (``128 + signal`` when a signal killed
it) atomically to the exit file before exiting with the same code. The supervisor itself stays in
the host's mount namespace, so it can always write that file, and the server can die and restart
without losing what happened to its containers.

The sandbox (``plan["sandbox"]``, see :mod:`qosflow.local.sandbox` for the host side) is a private
mount namespace (with a user namespace when not root) in which:

* ``/`` is a copy-on-write overlay of the host's file system (the host is the "image"), each
  other mount of the host likewise; the upper layers live under the pod's ``rootfs`` folder and
  are removed by the node when the pod ends (without root, ``/`` is a tmpfs with one layer per
  top-level folder, see :func:`_top_level`);
* ``/proc``, ``/dev`` and ``/sys`` are the host's, with a private ``/dev/shm``;
* the hidden folders (the local cluster's state directory) are covered by an empty tmpfs;
* each volume's host folder is bind-mounted at its mount path (read-only when asked);
* the container starts in its working directory (created when missing, as runtimes do).

``python -I -S shim.py --exec <pid> <argv...>`` (:func:`qosflow.local.supervisor.exec_command`)
runs a command in the view of the running container ``pid`` instead, as ``kubectl exec`` and the
kubelet's ``exec`` probes do: it joins that process's user and mount namespaces (when they are not
its own), its root and its working directory, and execs the command with the container's
environment (:func:`enter_running`).

This file runs with ``-I -S`` (no site-packages, no script directory on ``sys.path``), so it
imports the standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
SETUP_FAILED = 128
"""Exit code of a container whose sandbox could not be set up (it never ran)."""
_HOST_TREES = ("/proc", "/dev", "/sys")
_SKIP_TYPES = {"autofs", "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "nsfs"}
_STATVFS_FLAGS = (
    (os.ST_NOSUID, MS_NOSUID),
    (os.ST_NODEV, MS_NODEV),
    (os.ST_NOEXEC, MS_NOEXEC),
    (os.ST_RDONLY, MS_RDONLY),
)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    """Raise ``OSError`` naming ``what`` when a libc call failed."""
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """``mount(2)``."""
    _check(
        _libc().mount(
            source.encode() if source is not None else None,
            target.encode(),
            fstype.encode() if fstype is not None else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def unshare(flags: int) -> None:
    """``unshare(2)``."""
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def setns(path: str, nstype: int) -> None:
    """``setns(2)`` into the namespace file ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc().setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns {path}")
    finally:
        os.close(fd)


def _option(path: str) -> str:
    """A path escaped for an overlayfs option (backslash, comma and colon are separators)."""
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def _unescape(field: str) -> str:
    """A path of ``/proc/self/mountinfo`` (octal escapes for spaces and such) as text."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def host_mounts() -> list[str]:
    """The host's mount points other than ``/``, parents first (automount points left out)."""
    points: dict[str, str] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            if " - " not in line or len(fields) < 5:
                continue
            point = _unescape(fields[4])
            fstype = line.split(" - ", 1)[1].split()[0]
            points[point] = fstype  # a later mount at the same point hides the earlier one
    kept = [p for p, fstype in points.items() if p != "/" and fstype not in _SKIP_TYPES]
    return sorted(kept, key=lambda p: (p.count("/"), p))


def _overlay(lower: str, target: str, layers: str, index: int) -> None:
    """Mount a copy-on-write view of ``lower`` at ``target`` (upper layer under ``layers``)."""
    upper, work = f"{layers}/{index}/upper", f"{layers}/{index}/work"
    os.makedirs(upper, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    options = f"lowerdir={_option(lower)},upperdir={_option(upper)},workdir={_option(work)}"
    if os.getuid() != 0:  # in a user namespace, trusted.* xattrs are out of reach
        options += ",userxattr"
    mount("overlay", target, "overlay", 0, options)


def _layer(point: str, root: str, layers: str, index: int) -> None:
    """The host's mount ``point`` at ``root + point``: copy-on-write, else read-only, else absent."""
    target = root + point
    if not os.path.isdir(point):  # a bind-mounted file (resolv.conf in a container, say)
        if os.path.isfile(target):
            with contextlib.suppress(OSError):
                mount(point, target, None, MS_BIND)
                _remount_read_only(target)
        return
    try:
        _overlay(point, target, layers, index)
    except OSError:
        with contextlib.suppress(OSError):
            mount(point, target, None, MS_BIND | MS_REC)
            _remount_read_only(target)


def _remount_read_only(target: str) -> None:
    """Make a bind mount read-only, keeping the flags the kernel locks (nosuid, nodev...)."""
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY
    state = os.statvfs(target).f_flag
    for stat_flag, mount_flag in _STATVFS_FLAGS:
        if state & stat_flag:
            flags |= mount_flag
    mount(None, target, None, flags)


def _map_ids(uid: int, gid: int) -> None:
    """Map our own uid and gid into the new user namespace (identity), as rootless runtimes do."""
    with open("/proc/self/setgroups", "w", encoding="ascii") as handle:
        handle.write("deny")
    with open("/proc/self/uid_map", "w", encoding="ascii") as handle:
        handle.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w", encoding="ascii") as handle:
        handle.write(f"{gid} {gid} 1")


def _mount_point(path: str, is_dir: bool) -> None:
    """Create a mount point inside the new root (a file for a file volume, like the kubelet)."""
    if is_dir:
        os.makedirs(path, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    if not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def _top_level(root: str, layers: str, hide: list[str]) -> int:
    """Without root: a tmpfs ``/`` holding a layer per top-level folder of the host's.

    In a user namespace the kernel refuses an overlay of the host's ``/`` itself (mounts under
    it are locked), so each top-level folder gets its own (read-only where even that is
    refused, ``/run`` with its locked submounts, say); symlinks (``/bin -> usr/bin``) are copied.
    Returns the number of layers used.
    """
    mount("rootfs", root, "tmpfs", 0, "mode=755")
    index = 0
    for name in sorted(os.listdir("/")):
        source, target = f"/{name}", f"{root}/{name}"
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        elif os.path.isdir(source):
            os.mkdir(target)
            if source not in _HOST_TREES and source not in hide:
                index += 1
                _layer(source, root, layers, index)
        elif os.path.isfile(source):
            _mount_point(target, False)
            _layer(source, root, layers, 0)
    return index


def _root_filesystem(box: dict[str, Any]) -> str:
    """Unshare, then build the pod's root under ``<rootfs>/root``; returns that path."""
    uid, gid = os.getuid(), os.getgid()
    unshare(CLONE_NEWNS if uid == 0 else CLONE_NEWNS | CLONE_NEWUSER)
    if uid != 0:
        _map_ids(uid, gid)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    hide = [str(h) for h in box.get("hide") or []]
    # /proc, /dev and /sys come whole (recursive binds), the hidden folders are covered
    others = [p for p in host_mounts() if not _under(p, [*_HOST_TREES, *hide])]
    rootfs = str(box["root"])
    root, layers = f"{rootfs}/root", f"{rootfs}/layers"
    os.makedirs(root, exist_ok=True)
    if uid == 0:
        _overlay("/", root, layers, 0)  # no fallback: a pod must be able to write its own root
        start = 1
    else:
        start = _top_level(root, layers, hide) + 1
        others = [p for p in others if p.count("/") > 1]  # the top-level ones are layers already
    for index, point in enumerate(others, start=start):
        _layer(point, root, layers, index)
    for tree in _HOST_TREES:
        mount(tree, root + tree, None, MS_BIND | MS_REC)
    with contextlib.suppress(OSError):
        mount("shm", f"{root}/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    return root


def enter(box: dict[str, Any], cwd: str) -> None:
    """Enter the pod's sandbox described by ``box`` and change to ``cwd`` inside it.

    Raises:
        OSError: A step failed (the message names it); the container must not start.
    """
    root = _root_filesystem(box)
    volumes = list(box.get("mounts") or [])
    handles = [os.open(str(v["host"]), os.O_PATH | os.O_CLOEXEC) for v in volumes]
    os.chroot(root)
    os.chdir("/")
    for hidden in box.get("hide") or []:
        if os.path.isdir(hidden):
            mount("hidden", str(hidden), "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
    for volume, handle in zip(volumes, handles, strict=True):
        target = str(volume["path"])
        _mount_point(target, os.path.isdir(f"/proc/self/fd/{handle}"))
        mount(f"/proc/self/fd/{handle}", target, None, MS_BIND | MS_REC)
        if volume.get("readOnly"):
            _remount_read_only(target)
        os.close(handle)
    os.makedirs(cwd, exist_ok=True)
    os.chdir(cwd)


def enter_running(pid: int) -> dict[str, str]:
    """Join the view of the running process ``pid``; returns its environment.

    Its user namespace (a sandbox made without root has one), its mount namespace, its root and
    its working directory, each only when it is not already ours.

    Raises:
        OSError: The process is gone or a step is not allowed.
    """
    proc = f"/proc/{pid}"
    with open(f"{proc}/environ", "rb") as handle:
        raw = handle.read()
    env = dict(
        item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item
    )
    root = os.open(f"{proc}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    cwd = os.open(f"{proc}/cwd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for kind, flag in (("user", CLONE_NEWUSER), ("mnt", CLONE_NEWNS)):
        if os.readlink(f"{proc}/ns/{kind}") != os.readlink(f"/proc/self/ns/{kind}"):
            setns(f"{proc}/ns/{kind}", flag)
    here = os.stat("/")
    there = os.fstat(root)
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        os.fchdir(root)
        os.chroot(".")
    os.fchdir(cwd)
    os.close(root)
    os.close(cwd)
    return env


def exec_in(args: list[str]) -> None:
    """``--exec <pid> <argv...>``: run ``argv`` in the view of the container ``pid`` (never returns)."""
    try:
        env = enter_running(int(args[0]))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"cannot enter the container: {exc}\n")
        sys.stderr.flush()
        os._exit(126)
    try:
        os.execvpe(args[1], args[1:], env)
    except (OSError, IndexError) as exc:
        sys.stderr.write(f"exec {args[1:2]!r}: {exc}\n")
        sys.stderr.flush()
    os._exit(127)


def _write_exit_code(exit_file: str, code: int) -> None:
    """Write the exit code atomically (a reader sees the old file or the whole new one)."""
    with contextlib.suppress(OSError):
        tmp = exit_file + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, str(code).encode())
        os.fsync(fd)
        os.close(fd)
        os.replace(tmp, exit_file)


def _child(plan: dict[str, Any], argv: list[str]) -> None:
    """In the forked child: default signals, the sandbox (or just the cwd), then exec."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_DFL)
    try:
        if plan.get("sandbox"):
            enter(plan["sandbox"], str(plan.get("cwd") or "/"))
        else:
            os.chdir(str(plan.get("cwd") or "."))
    except OSError as exc:
        sys.stderr.write(f"the local cluster could not set up the pod's file system: {exc}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"exec {argv[0]!r}: {exc.strerror}\n")
        sys.stderr.flush()
    os._exit(127)


def supervise(args: list[str]) -> None:
    """Run the container of ``args = [plan, argv...]`` and record how it ended (never returns)."""
    plan: dict[str, Any] = json.loads(args[0])
    argv = args[1:]
    child = 0
    pending: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if child:
            with contextlib.suppress(OSError):
                os.kill(child, signum)
        else:
            pending.append(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    os.sched_setaffinity(0, [int(c) for c in plan.get("cores") or []] or os.sched_getaffinity(0))
    if plan.get("procs"):
        with contextlib.suppress(OSError), open(plan["procs"], "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))
    child = os.fork()
    if child == 0:
        _child(plan, argv)
    for signum in pending:
        os.kill(child, signum)
    status = os.waitpid(child, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code
    _write_exit_code(str(plan["exit_file"]), code)
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--exec"]:
        exec_in(sys.argv[2:])
    supervise(sys.argv[1:])
