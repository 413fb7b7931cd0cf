"""Drive one concurrency level: N worker threads pull prompts and stream /generate.

Workers are daemon threads, so Ctrl-C never waits for a request in flight: the main
thread only joins with a short timeout, notices the interrupt, and returns what finished.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sglang_dflash.bench.client import Endpoint, RequestError, stream_generate
from sglang_dflash.bench.stats import RequestRecord, itl_samples
from sglang_dflash.bench.workload import Prompt


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    ignore_eos: bool = True


def build_payload(prompt: Prompt, sampling: Sampling) -> dict:
    """The /generate body; a prompt's own max_new_tokens wins over the command's."""
    params = {
        "max_new_tokens": prompt.max_new_tokens or sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "ignore_eos": sampling.ignore_eos,
    }
    return {**prompt.payload_input(), "sampling_params": params}


@dataclass
class LevelResult:
    records: list[RequestRecord] = field(default_factory=list)
    duration_s: float = 0.0
    fatal: str | None = None
    interrupted: bool = False


def _num(meta: dict, key: str, kind: type) -> float | int | None:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return kind(v)


def one_request(ep: Endpoint, config: str, concurrency: int, index: int, prompt: Prompt,
                sampling: Sampling, timeout: float, t0: float) -> tuple[RequestRecord, bool]:
    """Run one request -> (record, fatal)."""
    start = time.monotonic() - t0
    try:
        res = stream_generate(ep, build_payload(prompt, sampling), timeout)
    except RequestError as e:
        return RequestRecord(config, concurrency, index, ok=False, start=start,
                             error=str(e)), e.fatal
    m = res.meta
    return RequestRecord(
        config, concurrency, index, ok=True, start=start, latency=res.latency, ttft=res.ttft,
        output_tokens=res.output_tokens, prompt_tokens=_num(m, "prompt_tokens", int),
        itl=itl_samples(res.chunks),
        spec_accept_length=_num(m, "spec_accept_length", float),
        spec_accept_rate=_num(m, "spec_accept_rate", float),
        spec_verify_ct=_num(m, "spec_verify_ct", int),
    ), False


# A staggered warm-up wave's second half starts this long after its first: those requests are
# decoding by then, so the server admits a prefill beside running requests (§28/§29: a server's
# first such admission paused it ~0.4 s once, none's included; a closed loop of equal-length
# requests need not produce one before the measured level does).
SPLIT_ADMISSION_DELAY_S = 0.25


def split_admission_delays(concurrency: int, delay: float = SPLIT_ADMISSION_DELAY_S
                           ) -> list[float]:
    """Start delays per worker for a wave that forces a split admission: the first half at
    once, the rest ``delay`` later (nothing to split below 2)."""
    half = concurrency // 2
    return [0.0] * half + [delay if half else 0.0] * (concurrency - half)


def run_level(ep: Endpoint, config: str, prompts: Sequence[Prompt], concurrency: int,
              sampling: Sampling, timeout: float,
              on_progress: Callable[[int], None] = lambda done: None,
              server_gone: Callable[[], str | None] = lambda: None,
              start_delays: Sequence[float] = ()) -> LevelResult:
    """Send every prompt once with `concurrency` requests in flight; stop early on a fatal error.

    `server_gone` is polled while waiting; a message from it (a launched server that
    exited) stops the level like a fatal request error does. `start_delays[i]` holds worker
    i back that many seconds before its first request (``split_admission_delays``).
    """
    result = LevelResult()
    records: list[RequestRecord] = []
    work: queue.SimpleQueue[tuple[int, Prompt]] = queue.SimpleQueue()
    for item in enumerate(prompts):
        work.put(item)
    stop = threading.Event()
    closed = False  # set under the lock once the level returns: late results are dropped
    lock = threading.Lock()
    t0 = time.monotonic()

    def worker(delay: float = 0.0) -> None:
        if delay > 0 and stop.wait(delay):
            return
        while not stop.is_set():
            try:
                index, prompt = work.get_nowait()
            except queue.Empty:
                return
            rec, fatal = one_request(ep, config, concurrency, index, prompt, sampling,
                                     timeout, t0)
            with lock:
                if closed or (stop.is_set() and not rec.ok):
                    return  # a casualty of the stop, not a result
                records.append(rec)
                if fatal and result.fatal is None:
                    result.fatal = rec.error
                    stop.set()

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{i}",
                                args=(start_delays[i] if i < len(start_delays) else 0.0,))
               for i in range(min(concurrency, len(prompts)))]
    for t in threads:
        t.start()
    try:
        while not stop.is_set():
            alive = [t for t in threads if t.is_alive()]
            if not alive:
                break
            alive[0].join(0.1)
            with lock:
                on_progress(len(records))
            gone = server_gone()
            if gone:
                with lock:
                    if result.fatal is None:
                        result.fatal = gone
                    stop.set()
    except KeyboardInterrupt:
        result.interrupted = True
        stop.set()
    with lock:
        closed = True
        result.records = list(records)
    result.duration_s = time.monotonic() - t0
    return result


def warmup(ep: Endpoint, prompts: Sequence[Prompt], n: int, sampling: Sampling,
           timeout: float) -> str | None:
    """Send n requests one by one (JIT, CUDA graphs, caches); the first error, or None."""
    for i in range(n):
        try:
            stream_generate(ep, build_payload(prompts[i % len(prompts)], sampling), timeout)
        except RequestError as e:
            return f"warm-up request failed: {e}"
    return None
