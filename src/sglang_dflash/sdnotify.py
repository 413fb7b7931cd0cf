"""sd_notify(3) over $NOTIFY_SOCKET with the standard library only.

systemd's Type=notify needs READY=1 from the main process; the package must not pull in
a systemd binding for one datagram. Abstract-namespace sockets ('@name') are supported.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def socket_address(value: str) -> str | bytes | None:
    """Map a $NOTIFY_SOCKET value to an AF_UNIX address; None if unusable or unset."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # vsock:… and relative paths are not for us


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send one notification (e.g. "READY=1\\nSTATUS=…"); False when there is no socket.

    Never raises: a failed notification must not take a healthy server down (systemd
    then fails the start on its own timeout, which is the right outcome).
    """
    env = os.environ if env is None else env
    address = socket_address(env.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError:
        return False
