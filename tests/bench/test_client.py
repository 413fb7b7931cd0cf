"""The streaming client against raw-socket servers that answer the way uvicorn does.

The stand-in writes one SSE event per write without chunked encoding; SGLang (uvicorn)
sends `Transfer-Encoding: chunked`, and chunk boundaries need not match event boundaries.
These servers send exactly the bytes given, so both shapes are covered.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sglang_dflash.bench.client import RequestError, health, parse_url, stream_generate


def event(tokens: int, **meta) -> bytes:
    body = {"text": "", "output_ids": list(range(tokens)),
            "meta_info": {"completion_tokens": tokens, **meta}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def chunk(part: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(part), part)


def chunked(*parts: bytes) -> bytes:
    """A whole chunked body: the parts, then the terminating zero-length chunk."""
    return b"".join(map(chunk, parts)) + b"0\r\n\r\n"


HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[socket.socket], None]], str]]:
    """`url = raw_server(handler)`: handler(conn) answers one connection after its request."""
    socks: list[socket.socket] = []

    def start(handler: Callable[[socket.socket], None]) -> str:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        socks.append(srv)

        def loop() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                with conn:
                    read_request(conn)  # all of it: unread bytes would make close() a reset
                    with contextlib.suppress(OSError):  # the client hung up: fine
                        handler(conn)

        threading.Thread(target=loop, daemon=True).start()
        return f"http://127.0.0.1:{srv.getsockname()[1]}"

    yield start
    for s in socks:
        s.close()


def test_chunked_stream_with_events_split_across_chunks(raw_server):
    e1, e2 = event(1), event(4)
    final = event(6, spec_accept_length=3.0, spec_verify_ct=2, spec_accept_rate=0.25)

    def handler(conn):
        conn.sendall(HEAD + chunk(e1[:10]))  # the first event split mid-JSON
        time.sleep(0.05)
        conn.sendall(chunked(e1[10:], e2 + final[:7], final[7:] + b"data: [DONE]\n\n"))

    res = stream_generate(parse_url(raw_server(handler)), {"text": "x"}, timeout=5)
    assert res.output_tokens == 6
    assert [n for _, n in res.chunks] == [1, 4, 6]
    assert res.ttft is not None and res.ttft >= 0.05
    assert res.meta["spec_verify_ct"] == 2 and res.meta["spec_accept_length"] == 3.0
    assert res.latency >= res.ttft


def test_http_errors_are_recorded_and_auth_errors_are_fatal(raw_server):
    def status(code: int, body: bytes):
        def handler(conn):
            conn.sendall(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s"
                         % (code, len(body), body))
        return handler

    with pytest.raises(RequestError) as e:
        stream_generate(parse_url(raw_server(status(400, b'{"error": {"message": "too long"}}'))),
                        {"text": "x"}, timeout=5)
    assert str(e.value) == "HTTP 400: too long" and not e.value.fatal
    with pytest.raises(RequestError) as e:
        stream_generate(parse_url(raw_server(status(401, b'{"error": "unauthorized"}'))),
                        {"text": "x"}, timeout=5)
    assert e.value.fatal and "--api-key-file" in str(e.value)


def test_error_event_in_the_stream_is_a_request_failure(raw_server):
    def handler(conn):
        err = b'data: {"error": {"message": "boom"}}\n\n'
        conn.sendall(HEAD + chunked(event(1), err, b"data: [DONE]\n\n"))

    with pytest.raises(RequestError, match="boom") as e:
        stream_generate(parse_url(raw_server(handler)), {"text": "x"}, timeout=5)
    assert not e.value.fatal


def test_a_stream_cut_before_done_is_fatal(raw_server):
    def handler(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\n\r\n" + event(1))

    with pytest.raises(RequestError, match=r"before data: \[DONE\]") as e:
        stream_generate(parse_url(raw_server(handler)), {"text": "x"}, timeout=5)
    assert e.value.fatal


def test_timeout_bounds_the_whole_request_not_each_read(raw_server):
    def handler(conn):  # a token every 0.1 s: no single read is slow, the request is
        conn.sendall(HEAD)
        for n in range(1, 40):
            conn.sendall(chunk(event(n)))
            time.sleep(0.1)

    t0 = time.monotonic()
    with pytest.raises(RequestError, match=r"timed out after 0\.5 s") as e:
        stream_generate(parse_url(raw_server(handler)), {"text": "x"}, timeout=0.5)
    assert not e.value.fatal
    assert time.monotonic() - t0 < 1.5


def test_refused_connection_is_fatal_and_health_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    ep = parse_url(f"http://127.0.0.1:{port}")
    with pytest.raises(RequestError, match="ConnectionRefused") as e:
        stream_generate(ep, {"text": "x"}, timeout=2)
    assert e.value.fatal
    with pytest.raises(OSError):
        health(ep, timeout=2)


@pytest.mark.parametrize("url, reason", [
    ("127.0.0.1:30000", "expected http"),
    ("http://", "no host"),
    ("http://h:99999", "port"),
    ("http://h:1/x?y=1", "without ?query"),
])
def test_parse_url_rejects(url, reason):
    with pytest.raises(ValueError, match=reason.replace("?", r"\?")):
        parse_url(url)


def test_parse_url_keeps_a_path_prefix_and_ipv6():
    ep = parse_url("https://[::1]:8443/sglang/", api_key="k")
    assert (ep.scheme, ep.host, ep.port, ep.base_path) == ("https", "::1", 8443, "/sglang")
    assert ep.url == "https://[::1]:8443/sglang"
    assert ep.headers()["Authorization"] == "Bearer k"
    assert parse_url("http://h").port == 80
