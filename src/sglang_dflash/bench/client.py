"""SGLang's native streaming /generate over http.client: the standard library only.

Errors are sorted into two kinds: a request that failed (a timeout, an HTTP error the
server answered with) is recorded and the run goes on; a server that is gone or refuses
the key (connection refused/reset, a stream cut before `[DONE]`, 401/403) is `fatal`, and
the runner stops the configuration instead of recording a thousand identical failures.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


class RequestError(Exception):
    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    base_path: str = ""
    api_key: str | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{_host_for_url(self.host)}:{self.port}{self.base_path}"

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout)

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_url(url: str, api_key: str | None = None) -> Endpoint:
    """`http://host:port[/prefix]` -> Endpoint; ValueError with a one-line reason otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"--url {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    if not parts.hostname:
        raise ValueError(f"--url {url!r}: no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"--url {url!r}: the port is not a number in 1..65535") from None
    if parts.query or parts.fragment:
        raise ValueError(f"--url {url!r}: give the server's base URL, without ?query or #fragment")
    return Endpoint(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), api_key)


def connect_host(bind_host: str) -> str:
    """The address to reach a server bound to bind_host (a wildcard means this machine)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_host, bind_host)


def _status(ep: Endpoint, method: str, path: str, timeout: float) -> int:
    """The status code of a bodiless request; raises OSError when nothing answers within
    timeout (an HTTP protocol error included)."""
    conn = ep.connection(timeout)
    try:
        conn.request(method, ep.base_path + path, headers=ep.headers())
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except http.client.HTTPException as e:
        raise OSError(f"{type(e).__name__}: {e}") from None
    finally:
        conn.close()


def health(ep: Endpoint, timeout: float) -> int:
    """GET /health's status code; raises OSError when nothing answers within timeout."""
    return _status(ep, "GET", "/health", timeout)


def freeze_gc(ep: Endpoint, timeout: float) -> str | None:
    """POST SGLang's ``/freeze_gc`` (the tokenizer manager and the scheduler move every object
    alive now out of the collector's full passes); a one-line reason when it did not answer 200.

    Why a benchmark wants it: a full (generation-2) collection walks every object a server
    process holds (660 k for the scheduler's imports alone, 0.5-0.95 s on the CPU machine) and
    stalls every request in flight meanwhile: the suspect of the ~0.4 s pause each server had
    once, at no batch size in particular (docs/ddtree.md, "A pause once per server")."""
    try:
        status = _status(ep, "POST", "/freeze_gc", timeout)
    except OSError as e:
        return f"POST {ep.url}/freeze_gc failed: {type(e).__name__}: {e}"
    if status != 200:
        return (f"POST {ep.url}/freeze_gc answered {status}, not 200 (SGLang 0.5.17 has the "
                f"endpoint; an API key with admin rights may be needed)")
    return None


@dataclass
class StreamResult:
    """Times are seconds from the moment the request was sent."""

    latency: float
    ttft: float | None
    output_tokens: int
    chunks: list[tuple[float, int]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


def _tokens_of(chunk: dict[str, Any]) -> int:
    meta = chunk.get("meta_info") or {}
    n = meta.get("completion_tokens")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    return len(chunk.get("output_ids") or [])


def _error_text(body: bytes) -> str:
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace").strip()
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        err = err.get("message") or err.get("detail") or err
    return str(err)[:200]


def stream_generate(ep: Endpoint, payload: dict[str, Any], timeout: float) -> StreamResult:
    """POST /generate with stream=true and read the SSE stream to `data: [DONE]`.

    `timeout` bounds the whole request, not only each socket read.
    """
    body = json.dumps({**payload, "stream": True}).encode()
    t0 = time.monotonic()
    deadline = t0 + timeout
    conn = ep.connection(timeout)
    try:
        conn.request("POST", ep.base_path + "/generate", body=body, headers=ep.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            detail = _error_text(resp.read(4096))
            fatal = resp.status in (401, 403)
            hint = " (check --api-key-file)" if fatal else ""
            raise RequestError(f"HTTP {resp.status}{hint}: {detail}", fatal=fatal)
        chunks: list[tuple[float, int]] = []
        meta: dict[str, Any] = {}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if conn.sock is not None:
                conn.sock.settimeout(remaining)
            line = resp.readline()
            if not line:
                raise RequestError("the stream ended before data: [DONE]", fatal=True)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                raise RequestError(f"unparsable stream chunk: {data[:80]!r}") from None
            if isinstance(chunk, dict) and "error" in chunk:
                raise RequestError(f"server error in stream: {_error_text(data)}")
            chunks.append((time.monotonic() - t0, _tokens_of(chunk)))
            meta = chunk.get("meta_info") or meta
        latency = time.monotonic() - t0
    except TimeoutError:
        raise RequestError(f"timed out after {timeout:g} s (--request-timeout)") from None
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        raise RequestError(f"{type(e).__name__}: {e}".rstrip(": "), fatal=True) from None
    finally:
        conn.close()
    first = next((t for t, n in chunks if n > 0), None)
    return StreamResult(latency, first, max((n for _, n in chunks), default=0), chunks, meta)
