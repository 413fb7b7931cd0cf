"""Who listens on a TCP port, read from Linux's /proc.

``serve`` calls a server ready when ``/health`` answers 200 on the configured port. A stale
server that binds that port after serve's start-up check (serve refuses a port already taken)
answers for it: on 2026-12-06 a server left by a killed benchmark call bound 127.0.0.1:30000
while the next instance's SGLang started, which then failed with "address already in use", and
the benchmark took the stale server's answer for the new one (docs/gpu-results.md §34). So a
200 counts only when the listening socket belongs to serve's own child or its descendants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp{,6}


@dataclass(frozen=True)
class Listener:
    """The verdict on one port: ``ours`` is None when /proc cannot tell (not Linux, or no
    listening socket on the port is visible); ``others`` the pids outside the tree found
    holding it (best effort: other users' descriptors may be unreadable)."""

    ours: bool | None
    others: tuple[int, ...] = ()


def listening_inodes(port: int, proc: Path = PROC) -> set[int] | None:
    """Socket inodes listening on ``port`` (any address, IPv4 and IPv6); None when
    /proc/net/tcp cannot be read."""
    found: set[int] = set()
    read_any = False
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            try:
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found.add(int(fields[9]))
            except ValueError:
                continue
    return found if read_any else None


def pids(proc: Path = PROC) -> list[int]:
    """Every process id /proc lists (none where there is no /proc)."""
    try:
        return [int(d.name) for d in proc.iterdir() if d.name.isdigit()]
    except OSError:
        return []


def parent_pid(pid: int, proc: Path = PROC) -> int | None:
    """``pid``'s parent from /proc/<pid>/stat (the name may hold spaces and ')'), or None."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def process_tree(root: int, proc: Path = PROC) -> set[int]:
    """``root`` and every descendant of it alive now."""
    children: dict[int, list[int]] = {}
    for pid in pids(proc):
        parent = parent_pid(pid, proc)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in tree:
                tree.add(child)
                todo.append(child)
    return tree


def holds_socket(pid: int, inodes: set[int], proc: Path = PROC) -> bool:
    """Whether ``pid`` has a descriptor on one of the socket ``inodes`` (False if unreadable)."""
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in wanted:
                return True
        except OSError:
            continue
    return False


def listener(port: int, root: int, proc: Path = PROC) -> Listener:
    """Whether the process tree of ``root`` holds a socket listening on ``port``."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return Listener(ours=None)
    tree = process_tree(root, proc)
    if any(holds_socket(pid, inodes, proc) for pid in sorted(tree)):
        return Listener(ours=True)
    others = tuple(pid for pid in pids(proc)
                   if pid not in tree and holds_socket(pid, inodes, proc))
    return Listener(ours=False, others=others)
