"""A stand-in for `python -m sglang.launch_server` (see tests/standin/README.md)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _env_float(name: str, default: float | None = None) -> float | None:
    value = os.environ.get(name)
    return default if value in (None, "") else float(value)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-dflash-block-size", type=int, default=None)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--speculative-draft-attention-backend", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--config", default=None, help="YAML/JSON file of flag values (api-key only)")
    p.add_argument("--vocab-size", type=int, default=151936, help="stand-in only")
    args, _unknown = p.parse_known_args(argv)  # the real server has hundreds of flags
    if args.config and not args.api_key:
        # sglang-dflash serve writes JSON, which is valid YAML, so json reads it here.
        with open(args.config) as f:
            args.api_key = json.load(f).get("api-key")
    return args


def next_token(ids: list[int], vocab: int) -> int:
    """Deterministic 'greedy model': depends only on the last two tokens."""
    a = ids[-1] if ids else 0
    b = ids[-2] if len(ids) > 1 else 0
    return (a * 31 + b * 17 + 7) % vocab


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready = False
        self.requests = 0
        self.gc_freezes = 0  # /freeze_gc answered (SGLang's endpoint: a real gc.freeze here)
        self.lock = threading.Lock()
        self.profile: dict | None = None  # an active /start_profile
        self.speculative = args.speculative_algorithm not in (None, "", "NONE")
        self.accept_length = _env_float("STANDIN_ACCEPT_LENGTH", 3.0)
        self.token_delay = _env_float("STANDIN_TOKEN_DELAY", 0.002)
        # SGLang 0.5.17's /health once up: queue a one-token generation, sleep 1 s, answer 200
        self.health_delay = _env_float("STANDIN_HEALTH_DELAY", 1.0)
        die = os.environ.get("STANDIN_DIE_AFTER_REQUESTS")
        self.die_after = int(die) if die else None

    def num_draft_tokens(self) -> int | None:
        """DDTree's plugin makes SGLang verify budget+1 tokens (H200: width 17 = budget 16 + 1)."""
        budget = os.environ.get("SGLANG_DFLASH_DDTREE_BUDGET", "").strip()
        if budget.isdigit() and self.args.speculative_algorithm == "DFLASH":
            return int(budget) + 1
        return self.args.speculative_num_draft_tokens

    def internal_state(self) -> dict:
        """As SGLang's, plus what the DDTree plugin adds: the worker's policy summary."""
        state = {"avg_spec_accept_length": self.accept_length if self.speculative else None}
        budget = os.environ.get("SGLANG_DFLASH_DDTREE_BUDGET", "").strip()
        if budget.isdigit() and self.args.speculative_algorithm == "DFLASH":
            raw = os.environ.get("SGLANG_DFLASH_DDTREE_POLICY")
            try:  # the worker's own parser, as the real plugin renders it
                from sglang_dflash.sglang_overlay.policy import parse_policy

                policy = parse_policy(raw, int(budget), "policy").describe()
            except Exception:
                policy = raw or "fixed"
            state["ddtree"] = {"policy": policy, "budget": int(budget)}
            forced = os.environ.get("STANDIN_DDTREE_HOST_LENS")
            if forced:  # a plugin that reports these host lengths (§30's planned from a bound)
                state["ddtree"]["host_lens"] = forced
        return state

    def server_info(self) -> dict:
        a = self.args
        return {
            "model_path": a.model_path,
            "served_model_name": a.served_model_name or a.model_path,
            "speculative_algorithm": a.speculative_algorithm,
            "speculative_draft_model_path": a.speculative_draft_model_path,
            "speculative_num_draft_tokens": self.num_draft_tokens(),
            "speculative_dflash_block_size": a.speculative_dflash_block_size,
            "tp_size": a.tp_size,
            # SGLang 0.5.17's DFLASH hook (speculative_hook._handle_dflash) sets 48 when unset
            "max_running_requests": (a.max_running_requests if a.max_running_requests is not None
                                     else 48 if a.speculative_algorithm == "DFLASH" else None),
            "attention_backend": a.attention_backend,
            "speculative_draft_attention_backend": a.speculative_draft_attention_backend,
            "internal_states": [self.internal_state()],
            "version": "0.5.17",
        }

    def metrics(self) -> str:
        """Prometheus text in the names SGLang 0.5.17's MetricsCollector uses."""
        labels = f'model_name="{self.args.served_model_name or self.args.model_path}"'
        lines = ["# TYPE sglang:num_requests_total counter",
                 f"sglang:num_requests_total{{{labels}}} {self.requests}",
                 "# TYPE standin:gc_freezes_total counter",
                 f"standin:gc_freezes_total {self.gc_freezes}",
                 "# TYPE sglang:num_running_reqs gauge",
                 f"sglang:num_running_reqs{{{labels}}} 0"]
        if self.speculative:
            lines += ["# TYPE sglang:spec_accept_length gauge",
                      f"sglang:spec_accept_length{{{labels}}} {self.accept_length}"]
        return "\n".join(lines) + "\n"


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # keep test output quiet
            pass

        def _send(self, code: int, body: dict | None = None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_text(self, code: int, text: str) -> None:
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            key = state.args.api_key
            if not key:
                return True
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            self._send(401, {"error": "unauthorized"})
            return False

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                if state.ready:  # 503 at once while starting, as SGLang's ServerStatus.Starting
                    time.sleep(state.health_delay)
                self._send(200 if state.ready else 503)
            elif path == "/metrics" and state.args.enable_metrics:
                self._send_text(200, state.metrics())
            elif not self._authorized():
                return
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, state.server_info())
            elif path == "/v1/models":
                name = state.args.served_model_name or state.args.model_path
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model"}]})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            path = self.path.split("?")[0]
            if not self._authorized():
                return
            if path == "/start_profile":
                self._start_profile()
                return
            if path == "/freeze_gc" and os.environ.get("STANDIN_NO_FREEZE_GC") != "1":
                self._freeze_gc()
                return
            if path != "/generate":
                self._send(404, {"detail": "Not Found"})
                return
            if not state.ready:
                self._send(503, {"error": "not ready"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "invalid JSON"}})
                return
            self._generate(req)
            with state.lock:
                state.requests += 1
                if state.die_after is not None and state.requests >= state.die_after:
                    os._exit(4)

        def _freeze_gc(self) -> None:
            """SGLang 0.5.17's /freeze_gc: gc.freeze() in the server process, a log line with
            the generation counts, 200 and a plain-text body."""
            import gc

            before = len(gc.get_objects(2))
            gc.freeze()
            with state.lock:
                state.gc_freezes += 1
            print(f"[stand-in sglang] Freezing GC in Scheduler process. gen2: {before}->"
                  f"{len(gc.get_objects(2))}", file=sys.stderr, flush=True)
            self._send_text(200, "Garbage collection frozen.\n")

        def _start_profile(self) -> None:
            """SGLang's /start_profile with num_steps: the next num_steps decode steps are
            written as a chrome trace <output_dir>/<profile_id>-TP-0.trace.json.gz (one
            'kernel' and one 'cudaLaunchKernel' event per generated token here)."""
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            with state.lock:
                state.profile = {"dir": body.get("output_dir") or "/tmp",
                                 "steps": int(body.get("num_steps") or 5),
                                 "id": body.get("profile_id") or str(time.time()),
                                 "events": []}
            self._send(200, {"success": True, "message": "Succeeded"})

        def _profile_step(self, t0: float, t1: float) -> None:
            with state.lock:
                prof = state.profile
                if prof is None:
                    return
                ts, dur = t0 * 1e6, (t1 - t0) * 1e6
                prof["events"] += [
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts,
                     "dur": 5.0},
                    {"ph": "X", "cat": "kernel", "name": "standin_decode", "ts": ts + 5.0,
                     "dur": max(1.0, dur * 0.5)},
                ]
                if len(prof["events"]) // 2 >= prof["steps"]:
                    state.profile = None
                    out = Path(prof["dir"])
                    out.mkdir(parents=True, exist_ok=True)
                    data = gzip.compress(json.dumps({"traceEvents": prof["events"]}).encode())
                    (out / f"{prof['id']}-TP-0.trace.json.gz").write_bytes(data)

        def _generate(self, req: dict) -> None:
            params = req.get("sampling_params") or {}
            n = int(params.get("max_new_tokens", 16))
            self._n = n
            ids = req.get("input_ids")
            if ids is None:
                text = req.get("text") or ""
                ids = [ord(c) % state.args.vocab_size for c in text] or [0]
            start = time.time()
            ctx = list(ids)
            out: list[int] = []
            acc = state.accept_length if state.speculative else 1.0
            stream = bool(req.get("stream"))
            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
            for _ in range(n):
                t0 = time.time()
                tok = next_token(ctx, state.args.vocab_size)
                ctx.append(tok)
                out.append(tok)
                time.sleep(state.token_delay / acc)
                self._profile_step(t0, time.time())
                if stream:
                    self.wfile.write(b"data: " + json.dumps(self._body(ids, out, start)).encode()
                                     + b"\n\n")
                    self.wfile.flush()
            if stream:
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
            else:
                self._send(200, self._body(ids, out, start))

        def _body(self, ids: list[int], out: list[int], start: float) -> dict:
            meta = {
                "id": "standin",
                "standin_port": state.args.port,  # which stand-in answered (router tests)
                "prompt_tokens": len(ids),
                "completion_tokens": len(out),
                "e2e_latency": time.time() - start,
                "finish_reason": (
                    {"type": "length", "length": len(out)} if len(out) >= self._n else None
                ),
            }
            if state.speculative and out:
                acc = state.accept_length
                verify_ct = max(1, round(len(out) / acc))
                width = state.num_draft_tokens() or 16
                meta["spec_verify_ct"] = verify_ct
                meta["spec_accept_length"] = len(out) / verify_ct
                meta["spec_accept_rate"] = (len(out) - verify_ct) / (verify_ct * (width - 1))
            return {"text": "", "output_ids": list(out), "meta_info": meta}

    return Handler


def on_term(*_) -> None:
    """Exit on SIGTERM; STANDIN_SELFKILL_ON_TERM=1 ends like SGLang 0.5.17's kill_process_tree;
    STANDIN_STUCK_ON_TERM=1 never ends, as an SGLang waiting on a request it will not finish
    (gpu-results.md §34: "Gracefully exiting... Remaining number of requests 1" every 5 s)."""
    if os.environ.get("STANDIN_STUCK_ON_TERM") == "1":
        try:  # as SGLang's logging does, a closed stderr (serve gone) is no reason to stop
            print("[stand-in sglang] Gracefully exiting... Remaining number of requests 1.",
                  file=sys.stderr, flush=True)
        except OSError:
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
        return
    if os.environ.get("STANDIN_SELFKILL_ON_TERM") == "1":
        print("[stand-in sglang] Gracefully exiting... Remaining number of requests 0.",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(int(os.environ.get("STANDIN_EXIT_CODE_ON_TERM", "0")))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if os.environ.get("STANDIN_ARGV_FILE"):
        with open(os.environ["STANDIN_ARGV_FILE"], "w") as f:
            json.dump(argv, f)
    print(f"[stand-in sglang] starting model={args.model_path} "
          f"algorithm={args.speculative_algorithm}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, on_term)
    time.sleep(_env_float("STANDIN_BIND_DELAY", 0.0))
    state = State(args)
    ThreadingHTTPServer.request_queue_size = 128  # the default 5 drops concurrent benches
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(f"[stand-in sglang] listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    time.sleep(_env_float("STANDIN_READY_DELAY", 0.0))
    crash = os.environ.get("STANDIN_CRASH_BEFORE_READY")
    if crash:
        print("[stand-in sglang] RuntimeError: simulated failure while loading weights",
              file=sys.stderr, flush=True)
        return int(crash)
    if os.environ.get("STANDIN_NEVER_READY") == "1":
        while True:
            time.sleep(3600)
    state.ready = True
    print("[stand-in sglang] The server is fired up and ready to roll!",
          file=sys.stderr, flush=True)
    crash_after = _env_float("STANDIN_CRASH_AFTER_READY")
    if crash_after is not None:
        time.sleep(crash_after)
        print("[stand-in sglang] simulated crash after ready", file=sys.stderr, flush=True)
        return 3
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
