"""Where a client on this machine reaches a server from the address the server binds."""

from __future__ import annotations


def health_host(host: str) -> str:
    """A wildcard bind address is reached on loopback; any other address as it is."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def local_url(host: str, port: int) -> str:
    """http://HOST:PORT for a server bound to `host` (IPv6 literals bracketed)."""
    h = health_host(host)
    if ":" in h:
        h = f"[{h}]"
    return f"http://{h}:{port}"
