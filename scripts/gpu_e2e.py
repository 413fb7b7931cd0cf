"""End-to-end run on the GPU test host: the check, deliberate breakage, and servers per mode.

Runs ON the device (Python 3.12, staged site dir first on PYTHONPATH, no network) and writes
everything it sees as JSON and logs under --out (the device tool's $OUT). Each step is bounded
and independent: one failing step is recorded and the next one still runs, because device time
is scarce and a partial record is worth more than none.

    python3 scripts/gpu_e2e.py --out $OUT --site /root/site check break
    python3 scripts/gpu_e2e.py --out $OUT --site /root/site serve:none serve:dflash serve:ddtree:16
    python3 scripts/gpu_e2e.py --out $OUT --site /root/site --bench-prompts planted \
        --time-budget-s 500 serve:none plant:56 plant:16 simacc:4

Steps: `check` (every layer but live), `break` (nested copy and a missing module, FAIL lines
expected), `serve:<algorithm>[:<budget>]` (start through `sglang-dflash serve`, `check --url`,
fixed greedy prompts, a short bench), then `compare` is always run on whatever serve steps
produced: greedy outputs must be token-identical across modes.

`plant:<budget>` (after `serve:none` in the SAME run): writes a TEST-ONLY plant file from the
none run's greedy continuations with one rank schedule per prompt (all absent ... all rank 0),
starts DDTree with it (SGLANG_DFLASH_DDTREE_PLANT) and per-round profiling
(SGLANG_DFLASH_DDTREE_PROFILE), and records per prompt: output identical to the none run,
spec_verify_ct / spec_accept_length against the CPU oracle (plant_oracle.expected_rounds), and
whether acceptance rises with the share of rank-0 plants; then a bench on the planted prompts.
`simacc:<len>`: stock DFLASH with SGLANG_SIMULATE_ACC_LEN=<len> (outputs are the fixed token
100 by SGLang's design, so they are not compared; acceptance and throughput are the point).
`seeded:<budget>`: T > 0 as token identity: `--enable-deterministic-inference`, seeded requests
(T = 0.8, top_p = 0.95, sampling_seed per prompt) on a no-speculation server, then on a DDTree
server planted with those seeded outputs; outputs must be identical (two server starts).
`seeded:adaptive:<budget>`: the same under the adaptive policy, one at a time and in batches
of 8 and 32 requests, with the policy's state after each (issue 14 item 5).
`sample:<budget>[:noplant][:flashinfer]`: a fresh DDTree server whose FIRST requests are
T = 0.8 / top_p = 0.95 (the call-14 stall), planted (after `serve:none`) or not, with
`--sampling-backend pytorch` or, with `:flashinfer`, FlashInfer's; on a timeout it records
running compilers, GPU utilisation and py-spy stacks, then whether a greedy request still works.

`trace:<budget>`: a DDTree server (no plant) with SGLANG_DFLASH_DDTREE_TRACE: torch.profiler
tables of the first decode round at each new batch size (short benches at c = 1 … 32), to name
the per-process one-off cost in `prep` (docs/gpu-results.md §17).

`--curve` adds, to each plant step, one short bench per rank schedule (its one prompt, c = 1
and 8): throughput against acceptance length, one acceptance regime per point.

Any server step takes `@<backend>` (`serve:none@triton plant:56@triton`): that step runs on that
attention backend (target and draft), its files carry `-<backend>`, its plant comes from
`serve:none@<backend>`, and `compare` checks each backend's modes among themselves.
`--reuse <results.json>` takes the `serve:none` records of an earlier run on the same machine, so
a later call can plant without starting `serve:none` again (greedy decoding is deterministic).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# An 8B-shaped Qwen3 target (Qwen3-8B's config.json fields) and a DFlash draft for it.
TARGET_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "hidden_act": "silu",
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
# The draft shares the target's shape (it uses the target's embedding and lm_head); it differs
# in its architecture, one layer, and the DFlash fields.
DRAFT_CONFIG = {
    **{k: v for k, v in TARGET_CONFIG.items() if k not in ("bos_token_id", "eos_token_id")},
    "architectures": ["DFlashDraftModel"], "num_hidden_layers": 1,
    "layer_types": ["full_attention"], "block_size": 16,
    "num_target_layers": TARGET_CONFIG["num_hidden_layers"],
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 17, 33]},
}
PROMPTS = [[100 + i, 2000 + 7 * i, 31 * i + 5, 4242, 17 + i] for i in range(4)]
GEN_TOKENS = 64
PORT = 30000
# sglang_overlay.settings.NODRAFT_STEPS_ENV (tests/overlay/test_policy.py checks they agree)
NODRAFT_STEPS_ENV = "SGLANG_DFLASH_DDTREE_NODRAFT_STEPS"
DEFAULT_NODRAFT_STEPS = 8  # ... and its DEFAULT_NODRAFT_STEPS (the same test)
BLOCK = DRAFT_CONFIG["block_size"]
# Plant: one rank schedule per prompt, in rising share of rank-0 plants (cycled over the
# continuation). 0 = on the rank-0 spine, 1..3 = a branch off it, -1 = absent from the top-K.
PLANT_SCHEDULES = (
    ("absent", (-1,)),
    ("sparse", (0, -1, -1)),
    ("mixed", (0, 0, 1, -1)),
    ("branchy", (3, 0, 0, -1, 2, 0, 0, -1, 1, 0, 0, -1)),  # accepts ranks 1-3 at N=56
    ("mostly0", (0, 0, 0, 0, 0, 0, 1, 0, 0, -1)),
    ("chain", (0,)),
)
PLANT_PROMPTS = [[100 + i, 2000 + 7 * i, 31 * i + 5, 4242, 17 + i]
                 for i in range(len(PLANT_SCHEDULES))]  # PROMPTS first, then two more
# Fixed per-rank log-probs of planted rows. Chosen so that at budgets 16 and 56 the budget
# boundary of the tree falls between score groups (plant_oracle.boundary_margin >= 0.05):
# tie-breaking on the GPU cannot then make the tree differ from the CPU oracle's. At 56 the
# tree holds ranks 1-3 off the spine; at 64 with this profile (or (-0.01,-4,-5,-6)) it does not
# close a group, so the oracle there is not exact (recorded as oracle_exact: false).
PLANT_PROFILE = (-0.1, -4.0, -4.25, -4.5)
ORACLE_EXACT_MARGIN = 1e-3
# The continuation must cover every depth drafted in the last round of GEN_TOKENS.
LONG_TOKENS = GEN_TOKENS + BLOCK + 1
BACKENDS = ("flashinfer", "triton")
STEP_MIN_S = 100  # a server step needs start (~60 s warm) + requests + stop
BENCH_MIN_S = 45
# Unrecorded waves of c requests before each bench level (bench --warmup-waves; adaptive_grid
# and real_drafter.serve_pair): steady state starts after a server's first split admission at
# that c (gpu-results.md §28: each speculative server paused ~0.39 s there after one wave).
WARMUP_WAVES = 2


def sh(cmd: list[str], *, env: dict | None = None, timeout: float = 300) -> dict:
    """Run a command, bounded; return rc, seconds and the output tails."""
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = 124, exc.stdout or "", (exc.stderr or "") + f"\n[timeout {timeout}s]"
        out = out if isinstance(out, str) else out.decode(errors="replace")
        err = err if isinstance(err, str) else err.decode(errors="replace")
    return {"cmd": cmd, "rc": rc, "seconds": round(time.monotonic() - t0, 2),
            "stdout": out[-20000:], "stderr": err[-8000:]}


def cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "sglang_dflash", *args]


def write_models(root: Path, target_cfg: dict = TARGET_CONFIG,
                 draft_cfg: dict = DRAFT_CONFIG) -> tuple[Path, Path]:
    """root/target and root/draft with their config.json (dummy weights need nothing else)."""
    target, draft = root / "target", root / "draft"
    for path, cfg in ((target, target_cfg), (draft, draft_cfg)):
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return target, draft


def step_check(out: Path, env: dict) -> dict:
    res = sh(cli(["check", "--json"]), env=env, timeout=240)
    text = sh(cli(["check"]), env=env, timeout=240)
    (out / "check.txt").write_text(text["stdout"] + text["stderr"])
    return {"json": res, "text_rc": text["rc"]}


def step_break(out: Path, env: dict, site: Path) -> dict:
    """Break the staged tree on purpose, capture the FAIL lines, then repair it."""
    pkg = site / "sglang"
    result: dict = {}
    nested = pkg / "sglang"
    copy = Path("/tmp/gpu_e2e-copy/sglang")
    shutil.rmtree(copy.parent, ignore_errors=True)
    copy.parent.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(pkg), str(copy)], check=True)
    subprocess.run(["cp", "-r", str(copy), str(pkg)], check=True)  # into pkg: nests sglang/sglang
    try:
        result["nested"] = sh(cli(["check", "--layer", "package"]), env=env, timeout=240)
    finally:
        shutil.rmtree(nested, ignore_errors=True)
    victim = pkg / "srt" / "speculative" / "dflash_utils.py"
    moved = victim.with_suffix(".py.moved")
    victim.rename(moved)
    try:
        result["missing_module"] = sh(cli(["check", "--layer", "package"]), env=env, timeout=240)
    finally:
        moved.rename(victim)
    result["repaired"] = sh(cli(["check", "--layer", "package"]), env=env, timeout=240)
    (out / "break.txt").write_text("\n\n".join(
        f"== {k} (rc={v['rc']})\n{v['stdout']}{v['stderr'][-2000:]}" for k, v in result.items()))
    return result


def http_json(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def instance_config(opts: Opts, name: str, algorithm: str, budget: int | None = None, *,
                    extra_args: tuple[str, ...] = (), plant: Path | None = None,
                    environment: dict | None = None, policy: str | None = None) -> dict:
    """The run's instance config: dummy weights, this step's attention backend for target and
    draft, and for DDTree the profiler (and plant) environment."""
    target, draft = opts.models
    cfg = {
        "name": name, "model": str(target), "algorithm": algorithm, "port": PORT,
        "gpus": [0], "memFractionStatic": 0.7, "attentionBackend": opts.backend,
        "loadFormat": "dummy", "skipTokenizerInit": True, "preflight": False,
        "startTimeout": 420,
        "extraArgs": ["--sampling-backend", "pytorch", "--cuda-graph-max-bs", "32",
                      "--cuda-graph-backend-prefill", "disabled", *extra_args],
    }
    if algorithm != "none":
        cfg |= {"draftModel": str(draft), "draftLoadFormat": "dummy",
                "draftAttentionBackend": opts.backend}
    if algorithm == "ddtree":
        cfg["ddtree"] = {"budget": budget} | ({"policy": policy} if policy else {})
        environment = ddtree_environment(opts, name, plant) | (environment or {})
    if environment is not None:
        cfg["environment"] = environment
    return cfg


class Clock:
    """The run's time budget: steps and benches that cannot finish are skipped, not cut off."""

    def __init__(self, budget_s: float) -> None:
        self.t0, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        if self.budget_s <= 0:
            return float("inf")
        return self.budget_s - (time.monotonic() - self.t0)


@dataclass
class Opts:
    out: Path
    env: dict
    models: tuple[Path, Path]
    backend: str
    bench: bool
    bench_prompts: str
    bench_concurrency: str
    bench_num_prompts: int
    clock: Clock
    curve: bool = False
    suffix: str = ""  # "@triton": this step's backend differs from --backend
    nodraft_steps: int = 8  # adaptive servers' no-draft decode steps (set explicitly)

    @property
    def tag(self) -> str:
        """File-name tag of a step run with ``@backend`` (its logs, configs, profiles)."""
        return self.suffix.replace("@", "-")

    @property
    def none_key(self) -> str:
        """The ``serve:none`` step whose continuations this step's plant uses (same backend)."""
        return "serve:none" + self.suffix


def generate(url: str, ids: list[int], n: int) -> dict:
    return http_json(url + "/generate", {
        "input_ids": ids, "sampling_params": {
            "temperature": 0, "max_new_tokens": n, "ignore_eos": True}})


def stop_group(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM a child started with ``start_new_session`` and its whole group, SIGKILL after
    ``timeout`` s; its exit status. Interrupted while it waits (the caller's own time limit),
    it kills the group before the interrupt goes on: a server in its own session outlives a
    killed caller, and the device tool does not end it (gpu-results.md §34)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            proc.wait()
        except BaseException:
            kill_tree(proc.pid)
            raise
    return proc.returncode


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s group and every descendant: serve starts SGLang in a group of its own,
    and a serve killed outright only SIGTERMs it (PDEATHSIG), which an SGLang stuck in its
    graceful exit ignores (§34: "Gracefully exiting... Remaining number of requests 1")."""
    from sglang_dflash.portowner import process_tree

    tree = process_tree(pid)  # before serve dies: its children are then reparented
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for other in tree - {pid}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(other, signal.SIGKILL)


# Which process group serves which port, one file per port (the group id and the id of the
# process that started it): a server whose starter was killed (SIGKILL after a call's limit,
# before stop_group ran) keeps running in its own session; the next start on that port stops it
# first. A group whose starter still runs is another live run's, and is left alone. §34: a
# seeded server left by one call bound 127.0.0.1:30000 under the next call's server, whose
# start then "answered".
REGISTRY_ENV = "SGLANG_DFLASH_E2E_REGISTRY"


def registry_dir(env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(REGISTRY_ENV) or Path(tempfile.gettempdir()) / "sglang-dflash-e2e")


def _alive(ident: int, probe=os.kill) -> bool:
    """Whether a process (``probe=os.killpg``: a process group) exists."""
    try:
        probe(ident, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def note_server(registry: Path, port: int, pgid: int) -> None:
    registry.mkdir(parents=True, exist_ok=True)
    (registry / str(port)).write_text(f"{pgid} {os.getpid()}\n")


def _noted(path: Path) -> tuple[int, int]:
    pgid, starter = (int(x) for x in path.read_text().split())
    return pgid, starter


def forget_server(registry: Path, port: int, pgid: int) -> None:
    path = registry / str(port)
    with contextlib.suppress(OSError, ValueError):
        if _noted(path)[0] == pgid:
            path.unlink()


def reap_stale(registry: Path, port: int, wait_s: float = 15.0) -> int | None:
    """SIGKILL the process group an earlier run left serving ``port`` when the process that
    started it is gone (its id; None when there was none, it had ended, or its starter still
    runs: a live run's server is not ours to stop)."""
    path = registry / str(port)
    try:
        pgid, starter = _noted(path)
    except (OSError, ValueError):
        return None
    if starter != os.getpid() and _alive(starter):
        return None
    reaped = None
    if pgid > 1 and pgid != os.getpgrp() and _alive(pgid, os.killpg):
        kill_tree(pgid)  # serve's pid is its group's id
        t0 = time.monotonic()
        while _alive(pgid, os.killpg) and time.monotonic() - t0 < wait_s:
            time.sleep(0.2)
        reaped = pgid
    with contextlib.suppress(OSError):
        path.unlink()
    return reaped


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


# SIGTERM to SIGKILL when the caller is being interrupted: under the `-k 15` its callers give
# `timeout` (gpu_pair_call.sh), so the group is gone before the caller is killed (§34)
INTERRUPT_STOP_S = 8.0
PORT_FREE_WAIT_S = 60.0  # a stale server of a killed call still shutting down (2026-12-05 §29)


def _listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    import socket

    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port_free(port: int, limit_s: float = PORT_FREE_WAIT_S,
                   listening=_listening, sleep=time.sleep) -> float | None:
    """Seconds waited until nothing listens on ``port`` (0.0 when free at once), or None when
    it is still taken after ``limit_s``. ``sglang-dflash serve`` refuses a taken port, and a
    server of a call killed at its time limit may still hold it for a few seconds (§29: two
    seeded modes lost to 'something already listens on 127.0.0.1:30000')."""
    t0 = time.monotonic()
    while listening(port):
        if time.monotonic() - t0 >= limit_s:
            return None
        sleep(0.5)
    return round(time.monotonic() - t0, 1)


@contextlib.contextmanager
def running_server(opts: Opts, cfg: dict, name: str, record: dict | None = None):
    """Start ``sglang-dflash serve`` for cfg, wait for /health; yield (url, record); stop it.
    ``record``: the dict to fill (the caller's, so a start cut off by an interrupt, which stops
    the server before the interrupt goes on, still leaves its ``serve_exit`` there).

    Ready means *this* child answers: a port that already answers before the start (a stale
    server of an interrupted run) is refused, and a child that has exited is never ready even
    if the port answers (on 2026-12-03 a stale DDTree N = 16 server answered for an N = 64
    start whose serve had exited 3, and was benched as N = 64)."""
    cfg_path = opts.out / f"config-{name}.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    log_path = opts.out / f"serve-{name}.log"
    port = int(cfg.get("port", PORT))
    url = f"http://127.0.0.1:{port}"
    registry = registry_dir(opts.env)
    reaped = reap_stale(registry, port)
    waited = None if _answers(url) else wait_port_free(port)
    if waited is None:
        rec = {"config": cfg, "ready_seconds": None,
               "error": f"port busy: something already answers or listens on {url} before the "
                        f"start (a stale server?) after {PORT_FREE_WAIT_S:.0f} s; not started"}
        if reaped:
            rec["reaped_stale_group"] = reaped
        yield url, rec
        return
    log = open(log_path, "w")  # noqa: SIM115 - closed in finally
    t0 = time.monotonic()
    proc = subprocess.Popen(cli(["serve", "--config", str(cfg_path), "--poll-interval", "0.5"]),
                            env=opts.env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    note_server(registry, port, proc.pid)
    rec = {} if record is None else record
    rec.update(config=cfg, ready_seconds=None, pid=proc.pid)
    if reaped:
        rec["reaped_stale_group"] = reaped
    if waited:
        rec["waited_for_port_s"] = waited
    limit = min(cfg["startTimeout"] + 10, max(opts.clock.left() - 20, 30))
    yielded = False
    try:
        while time.monotonic() - t0 < limit:
            if proc.poll() is not None:
                rec["serve_exit_before_ready"] = proc.returncode
                break
            # ready = serve itself said so (it checks that the server answering is its own
            # child) and the port answers now; the port alone was fooled in §34
            if (serve_said_ready(log_path) and _answers(url)) and proc.poll() is None:
                rec["ready_seconds"] = round(time.monotonic() - t0, 1)
                break
            time.sleep(0.5)
        yielded = True
        try:
            yield url, rec
        except Exception as exc:  # recorded, never fatal: the next step still runs
            rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        # interrupted (a caller's limit: `timeout -s INT -k 15`), stop within the kill margin
        exc = sys.exc_info()[1]
        interrupted = exc is not None and not isinstance(exc, (Exception, GeneratorExit))
        if interrupted and not yielded:
            rec["interrupted"] = True  # cut off while it started: the caller has no record
        rec["serve_exit"] = stop_group(proc, timeout=INTERRUPT_STOP_S if interrupted else 40)
        forget_server(registry, port, proc.pid)
        log.close()
        text = log_path.read_text(errors="replace")
        rec["log_tail"] = text[-6000:]
        rec["serve_lines"] = serve_lines(text)


# serve's own journal lines (readiness, the collectors' freeze, the child's fate): until
# gpu-results.md §33 no GPU run had serve's "ready after" line, and nothing recorded its absence
SERVE_PREFIX = "sglang-dflash serve: "


def serve_said_ready(log_path: Path) -> bool:
    """Whether ``sglang-dflash serve`` has written its "ready after" line to ``log_path``."""
    try:
        return serve_lines(log_path.read_text(errors="replace"))["ready"]
    except OSError:
        return False


def serve_lines(log_text: str, keep: int = 12) -> dict:
    """What ``sglang-dflash serve`` itself said in a server's log (first ``keep`` lines), and
    whether it saw the server ready and froze its collectors."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.startswith(SERVE_PREFIX)]
    return {"lines": lines[:keep],
            "ready": any(ln.startswith(SERVE_PREFIX + "ready after") for ln in lines),
            "froze": any("froze SGLang's garbage collectors" in ln for ln in lines)}


def bench_prompts_file(out: Path) -> Path:
    """The planted prompts as a bench workload (bench cycles them)."""
    path = out / "bench-prompts-planted.jsonl"
    path.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in PLANT_PROMPTS))
    return path


def bench_call(opts: Opts, url: str, out: Path, prompts: Path | None, concurrency: str,
               num_prompts: int, max_s: float) -> dict:
    """One `sglang-dflash bench` into ``out``, or a skip when the run's time budget is short."""
    left = opts.clock.left()
    if left < BENCH_MIN_S:
        return {"skipped": f"time budget: {left:.0f}s left"}
    args = ["bench", "--url", url, "--concurrency", concurrency, "--num-prompts",
            str(num_prompts), "--max-new-tokens", str(GEN_TOKENS), "--json", str(out), "--quiet"]
    if prompts is not None:
        args += ["--prompts", str(prompts)]
    return sh(cli(args), env=opts.env, timeout=max(10.0, min(max_s, left - 15)))


def run_bench(opts: Opts, url: str, name: str, prompts: str) -> dict:
    res = bench_call(opts, url, opts.out / f"bench-{name}.json",
                     bench_prompts_file(opts.out) if prompts == "planted" else None,
                     opts.bench_concurrency, opts.bench_num_prompts, 240.0)  # fmt: skip
    if "skipped" not in res:
        res["prompts"] = prompts
    return res


def acceptance_curve(opts: Opts, url: str, name: str, rows: list[dict]) -> list[dict]:
    """Throughput against acceptance length: one short bench per plant schedule (its one
    prompt, repeated), at concurrency 1 and 8, so each point has a single acceptance regime."""
    points = []
    for row in rows:
        prompts = opts.out / f"curve-{name}-{row['schedule']}.jsonl"
        prompts.write_text(json.dumps({"input_ids": row["input_ids"]}) + "\n")
        out = opts.out / f"bench-{name}-{row['schedule']}.json"
        res = bench_call(opts, url, out, prompts, "1,8", 8, 120.0)
        if "skipped" in res:
            points.append({"schedule": row["schedule"], **res})
            continue
        point = {"schedule": row["schedule"], "rc": res.get("rc"),
                 "oracle_accept_length": row.get("oracle_accept_length")}
        if out.exists():
            for summ in json.loads(out.read_text()).get("summaries", []):
                c = summ.get("concurrency")
                point[f"tok_s_c{c}"] = summ.get("output_tokens_per_s")
                point[f"accept_length_c{c}"] = summ.get("accept_length")
        points.append(point)
    return points


def ddtree_environment(opts: Opts, name: str, plant: Path | None = None) -> dict:
    env = {"SGLANG_DFLASH_DDTREE_PROFILE": str(opts.out / f"profile-{name}.jsonl")}
    if plant is not None:
        env["SGLANG_DFLASH_DDTREE_PLANT"] = str(plant)
    return env


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            out.append({"unparsed": line[:200]})
    return out


def step_serve(opts: Opts, mode: str) -> dict:
    parts = mode.split(":")
    algorithm = parts[1]
    budget = int(parts[2]) if len(parts) > 2 else None
    name = "-".join(parts[1:]) + opts.tag
    cfg = instance_config(opts, name, algorithm, budget)
    with running_server(opts, cfg, name) as (url, rec):
        rec["mode"] = mode
        if rec["ready_seconds"]:
            expect = ["--expect-algorithm", algorithm]
            if budget is not None:
                expect += ["--expect-ddtree-budget", str(budget)]
            rec["check_url"] = sh(cli(["check", "--url", url, "--layer", "live", *expect]),
                                  env=opts.env, timeout=120)
            outputs, metas, t1 = [], [], time.monotonic()
            for ids in PROMPTS:
                r = generate(url, ids, GEN_TOKENS)
                outputs.append(r["output_ids"])
                metas.append(r.get("meta_info", {}))
            rec["greedy"] = {"outputs": outputs, "meta": metas,
                             "seconds": round(time.monotonic() - t1, 3)}
            if algorithm == "none":
                # The plant steps' continuations: longer than GEN_TOKENS so that every drafted
                # depth of the last round is planted.
                rec["continuations"] = [generate(url, ids, LONG_TOKENS)["output_ids"]
                                        for ids in PLANT_PROMPTS]
                rec["continuations_extend_greedy"] = [
                    c[:GEN_TOKENS] == o for c, o in zip(rec["continuations"], outputs,
                                                        strict=False)]
            if opts.bench:
                rec["bench"] = run_bench(opts, url, name, opts.bench_prompts)
    if algorithm == "ddtree":
        rec["profile"] = read_jsonl(opts.out / f"profile-{name}.jsonl")
    return rec


# ---- plant:<budget> ------------------------------------------------------------------------


def schedule_ranks(pattern: tuple[int, ...], n: int) -> list[int]:
    return [pattern[i % len(pattern)] for i in range(n)]


def plant_document(continuations: list[list[int]]) -> dict:
    """The TEST-ONLY plant file: every planted prompt with its schedule's ranks."""
    reqs = []
    for ids, cont, (_, pattern) in zip(PLANT_PROMPTS, continuations, PLANT_SCHEDULES,
                                       strict=True):
        reqs.append({"input_ids": ids, "continuation": cont,
                     "ranks": schedule_ranks(pattern, len(cont))})
    return {"test_only": True, "requests": reqs, "logp_profile": list(PLANT_PROFILE)}


def accepted_ranks(ranks: list[int], rounds: list[int]) -> dict[str, int]:
    """How many accepted drafts the oracle expects at each planted rank (0 = spine)."""
    counts: dict[str, int] = {}
    pos = 0
    for a in rounds:
        for d in range(1, a + 1):
            key = str(ranks[pos + d])
            counts[key] = counts.get(key, 0) + 1
        pos += a + 1
    return dict(sorted(counts.items()))


def oracle_margin(budget: int) -> float:
    from sglang_dflash.sglang_overlay.diagnostics.plant_oracle import boundary_margin

    k = min(budget, TARGET_CONFIG["vocab_size"])
    return boundary_margin(PLANT_PROFILE, k, min(BLOCK, budget + 1) - 1, budget)


def oracle_rounds(doc: dict, budget: int) -> list[list[int]]:
    """Accepted drafts per round for each planted prompt (the CPU oracle)."""
    from sglang_dflash.sglang_overlay.diagnostics.plant import parse_plant
    from sglang_dflash.sglang_overlay.diagnostics.plant_oracle import expected_rounds

    spec = parse_plant(json.dumps(doc))
    return [expected_rounds(req, spec.logp_profile, budget=budget, block_size=BLOCK,
                            vocab=TARGET_CONFIG["vocab_size"], max_new_tokens=GEN_TOKENS)
            for req in spec.requests]


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def judge_plant(rows: list[dict]) -> dict:
    """Summary: identity, oracle agreement, and acceptance rising with the rank-0 share."""
    observed = [r.get("accept_length") for r in rows]
    rising = None
    if all(isinstance(x, int | float) for x in observed):
        # Never lower for a higher rank-0 share, and strictly higher from the least to the most.
        rising = all(observed[i] <= observed[j] + 1e-9
                     for i in range(len(rows)) for j in range(len(rows))
                     if rows[i]["share_rank0"] < rows[j]["share_rank0"])
        lo = min(range(len(rows)), key=lambda i: rows[i]["share_rank0"])
        hi = max(range(len(rows)), key=lambda i: rows[i]["share_rank0"])
        rising = rising and observed[hi] > observed[lo]
    return {
        "all_identical": all(r.get("identical") is True for r in rows),
        "all_verify_ct_match_oracle": all(r.get("verify_ct_matches") is True for r in rows),
        "accept_rises_with_rank0_share": rising,
        "accept_length_by_schedule": {r["schedule"]: r.get("accept_length") for r in rows},
        "oracle_accept_length_by_schedule": {r["schedule"]: r["oracle_accept_length"]
                                             for r in rows},
    }


def step_plant(opts: Opts, step: str, serves: dict) -> dict:
    budget = int(step.split(":")[1])
    none = serves.get(opts.none_key, {})
    conts = none.get("continuations")
    if not conts:
        return {"error": f"plant needs `{opts.none_key}` earlier in the same run or in --reuse "
                         "(its greedy continuations are the plant's ground truth)"}
    name = f"plant-{budget}{opts.tag}"
    doc = plant_document(conts)
    plant_path = opts.out / f"{name}.json"
    plant_path.write_text(json.dumps(doc))
    try:  # identity is still worth a server start if the oracle cannot run
        rounds, oracle_error = oracle_rounds(doc, budget), None
        margin = oracle_margin(budget)
    except Exception as exc:
        rounds, margin = [[0] * GEN_TOKENS for _ in PLANT_PROMPTS], 0.0
        oracle_error = f"{type(exc).__name__}: {exc}"
    cfg = instance_config(opts, name, "ddtree", budget, plant=plant_path)
    rows: list[dict] = []
    for (sched, pattern), ids, cont, rr in zip(PLANT_SCHEDULES, PLANT_PROMPTS, conts, rounds,
                                               strict=True):
        k = min(budget, TARGET_CONFIG["vocab_size"])
        ranks = schedule_ranks(pattern, GEN_TOKENS)
        rows.append({
            "schedule": sched, "pattern": list(pattern), "input_ids": ids,
            "share_rank0": round(sum(r == 0 for r in ranks) / len(ranks), 3),
            "share_in_topk": round(sum(0 <= r < k for r in ranks) / len(ranks), 3),
            "oracle_rounds": rr, "oracle_verify_ct": len(rr),
            "oracle_accepted_by_rank": accepted_ranks(schedule_ranks(pattern, len(cont)), rr),
            "oracle_accept_length": round(GEN_TOKENS / len(rr), 4),
            "reference": cont[:GEN_TOKENS],
        })
    with running_server(opts, cfg, name) as (url, rec):
        rec["mode"] = step
        rec["plant_file"] = str(plant_path)
        rec["oracle_boundary_margin"] = margin
        rec["oracle_exact"] = margin > ORACLE_EXACT_MARGIN
        if oracle_error:
            rec["oracle_error"] = oracle_error
        rec["rows"] = rows
        if rec["ready_seconds"]:
            rec["check_url"] = sh(cli(["check", "--url", url, "--layer", "live",
                                       "--expect-algorithm", "ddtree",
                                       "--expect-ddtree-budget", str(budget)]),
                                  env=opts.env, timeout=120)
            for row in rows:
                try:
                    r = generate(url, row["input_ids"], GEN_TOKENS)
                except Exception as exc:  # one failed request must not hide the others
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    continue
                meta = r.get("meta_info", {})
                out = r["output_ids"]
                row |= {
                    "output": out,
                    "identical": out == row["reference"],
                    "first_diff": first_diff(out, row["reference"]),
                    "verify_ct": meta.get("spec_verify_ct"),
                    "accept_length": meta.get("spec_accept_length"),
                    "accept_histogram": meta.get("spec_accept_histogram"),
                    "verify_ct_matches": meta.get("spec_verify_ct") == row["oracle_verify_ct"],
                }
            rec["summary"] = judge_plant(rows) | {"oracle_exact": rec["oracle_exact"]}
            # Written at once: a server that hangs in the next part (T > 0) and the call's time
            # limit then cannot take the greedy results with it.
            (opts.out / f"{name}-greedy.json").write_text(json.dumps(rec, indent=1))
            rec["sampling_smoke"] = sampling_smoke(url, [r["input_ids"] for r in rows],
                                                   rec.get("pid"))
            if opts.bench:
                rec["bench"] = run_bench(opts, url, name, "planted")
            if opts.curve:
                rec["curve"] = acceptance_curve(opts, url, name, rows)
    rec["profile"] = read_jsonl(opts.out / f"profile-{name}.jsonl")
    return rec


def sampling_smoke(url: str, prompts: list[list[int]], pid: int | None = None) -> dict:
    """T > 0 through the DDTree sampling path: every request completes at full length.

    Only a smoke test: losslessness in distribution is tested on the CPU (tests/ddtree); a
    handful of samples here can show a crash or a truncated output, not a biased sampler.
    On the first timeout the stall is described (``stall_diagnostics``) before giving up.
    """
    results = []
    for i, ids in enumerate(prompts):
        body = {"input_ids": ids, "sampling_params": {
            "temperature": 0.8, "top_p": 0.95, "max_new_tokens": GEN_TOKENS,
            "ignore_eos": True, "sampling_seed": i}}
        t0 = time.monotonic()
        try:
            r = http_json(url + "/generate", body, timeout=30)
            meta = r.get("meta_info", {})
            results.append({"tokens": len(r["output_ids"]),
                            "accept_length": meta.get("spec_accept_length"),
                            "seconds": round(time.monotonic() - t0, 3)})
        except Exception as exc:  # a hung server: stop here, the rest would hang too
            results.append({"prompt": i, "error": f"{type(exc).__name__}: {exc}",
                            "stall": stall_diagnostics(pid)})
            break
    ok = all(r.get("tokens") == GEN_TOKENS for r in results)
    return {"temperature": 0.8, "all_full_length": ok, "requests": results}


STALL_PROCS = ("nvcc", "cicc", "ptxas", "ninja", "fatbinary")


def stall_diagnostics(pid: int | None) -> dict:
    """What a stalled server is doing: compilers running (a JIT build), GPU busy (a spinning
    kernel), and the Python stacks of the server's processes when py-spy is installed."""
    out: dict = {}
    ps = sh(["ps", "-eo", "pid,ppid,etimes,pcpu,args"], timeout=20)
    lines = ps.get("stdout", "").splitlines()
    out["compilers"] = [ln[:300] for ln in lines if any(c in ln for c in STALL_PROCS)][:20]
    if shutil.which("nvidia-smi"):
        smi = sh(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used",
                  "--format=csv,noheader"], timeout=20)
        out["gpu"] = smi.get("stdout", "").strip()
    spy = shutil.which("py-spy")
    if spy and pid:
        dump = sh([spy, "dump", "--pid", str(pid), "--subprocesses"], timeout=60)
        out["py_spy"] = (dump.get("stdout", "") + dump.get("stderr", ""))[-12000:]
    else:
        out["py_spy"] = "py-spy not on PATH" if not spy else "no pid"
    return out


def flashinfer_sampling_builds() -> list[str]:
    """FlashInfer's JIT-built sampling modules in its cache (empty = the next use compiles)."""
    base = Path(os.environ.get("FLASHINFER_WORKSPACE_BASE", str(Path.home())))
    root = base / ".cache" / "flashinfer"
    if not root.is_dir():
        return []
    return sorted(str(p) for p in root.glob("**/sampling/*.so"))[:10]


# ---- sample:<budget>[:noplant][:flashinfer] -------------------------------------------------


SAMPLE_FLAGS = ("noplant", "flashinfer")


def step_sample(opts: Opts, step: str, serves: dict) -> dict:
    """The call-14 stall, reproduced on purpose: T = 0.8 requests FIRST on a fresh DDTree server.

    ``sample:56`` plants like ``plant:56`` (needs ``serve:none`` earlier in the run),
    ``sample:56:noplant`` runs the drafter as is; ``:flashinfer`` drops ``--sampling-backend
    pytorch`` so the fused renorm kernels (warmed up at worker start) are exercised. A
    greedy request afterwards shows whether the server is still alive.
    """
    parts = step.split(":")
    budget = int(parts[1])
    flags = set(parts[2:])
    if flags - set(SAMPLE_FLAGS):
        return {"error": f"unknown sample flag(s) {sorted(flags - set(SAMPLE_FLAGS))}; "
                         f"known: {', '.join(SAMPLE_FLAGS)}"}
    name = "-".join(["sample", str(budget), *[f for f in SAMPLE_FLAGS if f in flags]]) + opts.tag
    plant_path = None
    if "noplant" not in flags:
        conts = serves.get(opts.none_key, {}).get("continuations")
        if not conts:
            return {"error": f"sample without :noplant needs `{opts.none_key}` earlier in the "
                             "same run or in --reuse (its continuations are the plant)"}
        plant_path = opts.out / f"{name}.json"
        plant_path.write_text(json.dumps(plant_document(conts)))
    cfg = instance_config(opts, name, "ddtree", budget, plant=plant_path)
    if "flashinfer" in flags:
        args = cfg["extraArgs"]
        args[args.index("--sampling-backend") + 1] = "flashinfer"
    before = flashinfer_sampling_builds()
    with running_server(opts, cfg, name) as (url, rec):
        rec["mode"] = step
        rec["plant_file"] = str(plant_path) if plant_path else None
        rec["flashinfer_sampling_before"] = before
        if rec["ready_seconds"]:
            rec["flashinfer_sampling_at_ready"] = flashinfer_sampling_builds()
            rec["sampling_smoke"] = sampling_smoke(url, PLANT_PROMPTS, rec.get("pid"))
            try:
                r = http_json(url + "/generate", {"input_ids": PLANT_PROMPTS[0],
                                                  "sampling_params": {
                                                      "temperature": 0, "max_new_tokens": 8,
                                                      "ignore_eos": True}}, timeout=30)
                rec["alive_after"] = len(r["output_ids"]) == 8
            except Exception as exc:
                rec["alive_after"] = False
                rec["alive_error"] = f"{type(exc).__name__}: {exc}"
    rec["profile"] = read_jsonl(opts.out / f"profile-{name}.jsonl")
    return rec


def step_simacc(opts: Opts, step: str) -> dict:
    """Stock DFLASH with SGLANG_SIMULATE_ACC_LEN: the acceptance cross-check for the plant."""
    length = step.split(":")[1]
    float(length)  # a bad value is this step's error, before a server starts
    name = f"simacc-{length}{opts.tag}"
    cfg = instance_config(opts, name, "dflash",
                          environment={"SGLANG_SIMULATE_ACC_LEN": length})
    with running_server(opts, cfg, name) as (url, rec):
        rec["mode"] = step
        if rec["ready_seconds"]:
            metas = [generate(url, ids, GEN_TOKENS).get("meta_info", {}) for ids in PROMPTS]
            rec["greedy_meta"] = metas
            rec["accept_lengths"] = [m.get("spec_accept_length") for m in metas]
            rec["note"] = ("SGLang's simulated acceptance emits a fixed token (100): outputs are "
                           "not the target's and are not compared")
            if opts.bench:
                rec["bench"] = run_bench(opts, url, name, opts.bench_prompts)
    return rec


# ---- trace:<budget> -------------------------------------------------------------------------

TRACE_CONCURRENCY = "1,2,4,8,13,32"  # new batch sizes: powers of two and one padded size
TRACE_PROMPTS = 16


def step_trace(opts: Opts, step: str) -> dict:
    """A DDTree server (no plant) with first-round tracing: torch.profiler tables of the first
    round at each new batch size, to name the one-off `prep` cost of gpu-results.md §17.
    Batch sizes come from short benches at rising concurrency."""
    from sglang_dflash.sglang_overlay.diagnostics import trace as trace_mod

    budget = int(step.split(":")[1])
    name = f"trace-{budget}{opts.tag}"
    tdir = opts.out / name
    cfg = instance_config(opts, name, "ddtree", budget, environment={
        trace_mod.TRACE_ENV: str(tdir), trace_mod.MAX_ENV: "16"})
    with running_server(opts, cfg, name) as (url, rec):
        rec["mode"] = step
        if rec["ready_seconds"]:
            rec["bench"] = bench_call(opts, url, opts.out / f"bench-{name}.json",
                                      bench_prompts_file(opts.out), TRACE_CONCURRENCY,
                                      TRACE_PROMPTS, 180.0)
    rec["profile"] = read_jsonl(opts.out / f"profile-{name}.jsonl")
    rec["traces"] = read_jsonl(tdir / "rounds.jsonl")
    rec["trace_files"] = sorted(p.name for p in tdir.glob("round-bs*.txt"))
    return rec


# ---- seeded:<budget> ------------------------------------------------------------------------


def seeded_params(i: int, n: int) -> dict:
    return {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1000 + i, "max_new_tokens": n,
            "ignore_eos": True}


def seeded_generate(url: str, i: int, n: int) -> dict:
    """PLANT_PROMPTS[i] sampled with its own seed (seeded_params), n tokens: SGLang's answer."""
    return http_json(url + "/generate", {"input_ids": PLANT_PROMPTS[i],
                                         "sampling_params": seeded_params(i, n)})


SEEDED_BATCH_LEVELS = (8, 32)  # besides one at a time: batch sizes where the adaptive policy
#                               runs other candidate budgets (its schedule changes at bs 8, 32)


def parse_seeded(step: str) -> tuple[int, bool]:
    """``seeded:<N>`` -> (N, False); ``seeded:adaptive:<N>`` -> (N, True); ValueError else."""
    parts = step.split(":")
    adaptive = len(parts) == 3 and parts[1] == "adaptive"
    if len(parts) != (3 if adaptive else 2) or not parts[-1].isdigit() or int(parts[-1]) < 1:
        raise ValueError(f"bad step {step!r}: seeded:<N> or seeded:adaptive:<N>")
    return int(parts[-1]), adaptive


def policy_state(url: str) -> dict | None:
    """internal_states[0].ddtree of /server_info: the adaptive policy's summary."""
    try:
        with urllib.request.urlopen(url + "/server_info", timeout=30) as r:
            info = json.loads(r.read())
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        return states[0].get("ddtree")
    return None


def seeded_batch(url: str, outs: list[list[int]], c: int) -> dict:
    """c seeded requests at once (the prompts cycled, each with its own prompt's seed), each
    against that prompt's no-speculation output."""
    import concurrent.futures as cf

    idx = [i % len(PLANT_PROMPTS) for i in range(c)]

    with cf.ThreadPoolExecutor(c) as pool:
        got = [r["output_ids"] for r in pool.map(lambda i: seeded_generate(url, i, GEN_TOKENS),
                                                  idx)]
    diffs = [first_diff(o, outs[i][:GEN_TOKENS]) for o, i in zip(got, idx, strict=True)]
    return {"concurrency": c, "first_diff": diffs, "identical": all(d is None for d in diffs)}


def step_seeded(opts: Opts, step: str) -> dict:
    """T > 0 losslessness as token identity: seeded sampling under
    ``--enable-deterministic-inference``, no speculation vs DDTree planted with the no-spec run's
    own seeded outputs (so drafts are accepted). Each committed DDTree token is drawn with
    SGLang's seeded sampler keyed by (seed, position), so outputs must match token for token
    (up to last-bit logit differences between a 1-row decode and an N+1-row verify).
    ``seeded:adaptive:<N>`` runs the adaptive policy and also checks batches of
    SEEDED_BATCH_LEVELS requests, recording the policy's state after each (which budgets it
    ran and fell back to at that batch size)."""
    budget, adaptive = parse_seeded(step)
    det = ("--enable-deterministic-inference",)
    rec: dict = {"mode": step}
    cfg = instance_config(opts, f"seeded-none{opts.tag}", "none", extra_args=det)
    outs: list[list[int]] = []
    greedy: list[list[int]] = []
    with running_server(opts, cfg, f"seeded-none{opts.tag}") as (url, r0):
        if r0["ready_seconds"]:
            outs = [seeded_generate(url, i, LONG_TOKENS)["output_ids"]
                    for i in range(len(PLANT_PROMPTS))]
            greedy = [generate(url, ids, GEN_TOKENS)["output_ids"] for ids in PLANT_PROMPTS]
    rec["none"] = r0 | {"outputs": outs, "greedy": greedy}
    if len(outs) != len(PLANT_PROMPTS):
        rec["error"] = "the no-speculation seeded run gave no outputs"
        return rec
    name = f"seeded-{'adaptive-' if adaptive else ''}{budget}{opts.tag}"
    plant_path = opts.out / f"{name}.json"
    plant_path.write_text(json.dumps(plant_document(outs)))
    steps = {NODRAFT_STEPS_ENV: str(opts.nodraft_steps)} if adaptive else None
    cfg = instance_config(opts, name, "ddtree", budget, extra_args=det, plant=plant_path,
                          policy="adaptive" if adaptive else None, environment=steps)
    rec["nodraft_steps"] = opts.nodraft_steps if adaptive else None
    rows, batches = [], []
    with running_server(opts, cfg, name) as (url, r1):
        if r1["ready_seconds"]:
            for i in range(len(PLANT_PROMPTS)):
                r = seeded_generate(url, i, GEN_TOKENS)
                out, ref = r["output_ids"], outs[i][:GEN_TOKENS]
                rows.append({"identical": out == ref, "first_diff": first_diff(out, ref),
                             "accept_length": r.get("meta_info", {}).get("spec_accept_length"),
                             "output": out, "reference": ref})
            if adaptive:
                r1["policy_after_one_at_a_time"] = policy_state(url)
                for c in SEEDED_BATCH_LEVELS:
                    batches.append(seeded_batch(url, outs, c) | {"policy": policy_state(url)})
    rec["ddtree"] = r1 | {"rows": rows, "batches": batches}
    rec["summary"] = {
        "all_identical": bool(rows) and all(r["identical"] for r in rows)
        and all(b["identical"] for b in batches),
        "identical": [r["identical"] for r in rows],
        "batches": {b["concurrency"]: b["identical"] for b in batches},
        "accept_length": [r["accept_length"] for r in rows],
        # the seeded outputs are not the greedy ones: T > 0 really sampled
        "sampled": any(o[:GEN_TOKENS] != g for o, g in zip(outs, greedy, strict=True)),
    }
    return rec


def compare_group(got: dict) -> dict:
    """Greedy outputs must be token-identical across every mode of one attention backend."""
    if len(got) < 2:
        return {"compared": list(got), "identical": None}
    base_mode, base = next(iter(got.items()))
    diffs = {m: [i for i, (a, b) in enumerate(zip(o, base, strict=True)) if a != b]
             for m, o in got.items() if m != base_mode}
    return {"baseline": base_mode, "compared": list(got),
            "identical": all(not d for d in diffs.values()), "differing_prompts": diffs}


def compare(serves: dict) -> dict:
    """``compare_group`` for the --backend steps; other backends' groups under ``by_backend``.

    Backends are compared only within themselves: FlashInfer and Triton attention round
    differently in bf16, and with dummy weights a last-bit difference can flip an argmax.
    """
    groups: dict[str, dict] = {}
    for m, r in serves.items():
        if "greedy" in r:
            groups.setdefault(m.partition("@")[2], {})[m] = r["greedy"]["outputs"]
    res = compare_group(groups.pop("", {}))
    if groups:
        res["by_backend"] = {b: compare_group(g) for b, g in groups.items()}
    return res


def reused_serves(path: Path) -> dict:
    """``serve:none`` records of an earlier run's results.json (plants need their continuations)."""
    doc = json.loads(path.read_text())
    out = {}
    for m, r in doc.get("serve", {}).items():
        if m.partition("@")[0] == "serve:none" and r.get("continuations"):
            out[m] = r | {"reused_from": str(path)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--site", type=str, required=True,
                    help="the staged site dir (os.pathsep-separated entries allowed)")
    ap.add_argument("--models", type=Path, default=Path("/root/models"))
    ap.add_argument("--backend", default="flashinfer", choices=BACKENDS)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-prompts", default="synthetic", choices=["synthetic", "planted"],
                    help="workload of serve/simacc benches (plant benches always use planted)")
    ap.add_argument("--bench-concurrency", default="1,8,32")
    ap.add_argument("--bench-num-prompts", type=int, default=32)
    ap.add_argument("--curve", action="store_true",
                    help="plant steps: one short bench per rank schedule (throughput against "
                         "acceptance length, concurrency 1 and 8)")
    ap.add_argument("--reuse", type=Path, metavar="RESULTS_JSON",
                    help="take serve:none records (continuations) from an earlier run's "
                         "results.json on the same machine, instead of starting serve:none again")
    ap.add_argument("--time-budget-s", type=float, default=0,
                    help="skip steps/benches that cannot finish within this many seconds")
    ap.add_argument("--nodraft-steps", type=int, default=DEFAULT_NODRAFT_STEPS,
                    help=f"seeded:adaptive servers: {NODRAFT_STEPS_ENV} (1..64, default "
                    f"{DEFAULT_NODRAFT_STEPS}, the server's)")
    ap.add_argument("steps", nargs="+")
    args = ap.parse_args()
    if not 1 <= args.nodraft_steps <= 64:
        ap.error(f"--nodraft-steps {args.nodraft_steps}: expected 1..64")
    args.out.mkdir(parents=True, exist_ok=True)
    site_entries = [p for p in args.site.split(os.pathsep) if p]
    sys.path[:0] = site_entries  # the oracle imports sglang_dflash from the staged site
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(site_entries), PYTHONUNBUFFERED="1")
    opts = Opts(out=args.out, env=env, models=write_models(args.models), backend=args.backend,
                bench=not args.no_bench, bench_prompts=args.bench_prompts,
                bench_concurrency=args.bench_concurrency,
                bench_num_prompts=args.bench_num_prompts, clock=Clock(args.time_budget_s),
                curve=args.curve, nodraft_steps=args.nodraft_steps)
    results: dict = {"steps": args.steps, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                      time.gmtime())}
    serves: dict = reused_serves(args.reuse) if args.reuse else {}
    plants: dict = {}
    simaccs: dict = {}
    samples: dict = {}
    seededs: dict = {}
    traces: dict = {}
    for step in args.steps:
        t0 = time.monotonic()
        left = opts.clock.left()
        base, at, backend = step.partition("@")  # plant:56@triton: this step on Triton
        sopts = dataclasses.replace(opts, backend=backend, suffix=at + backend) if at else opts
        try:
            if at and backend not in BACKENDS:
                results[step] = {"error": f"unknown backend {backend!r}; known: "
                                          f"{', '.join(BACKENDS)}"}
            elif left < STEP_MIN_S and base.split(":")[0] in ("serve", "plant", "simacc",
                                                               "sample", "seeded", "trace"):
                results[step] = {"skipped": f"time budget: {left:.0f}s left"}
            elif step == "check":
                results["check"] = step_check(args.out, env)
            elif step == "break":
                results["break"] = step_break(args.out, env, Path(site_entries[0]))
            elif base.startswith("serve:"):
                serves[step] = step_serve(sopts, base)
            elif base.startswith("plant:"):
                plants[step] = step_plant(sopts, base, serves)
            elif base.startswith("simacc:"):
                simaccs[step] = step_simacc(sopts, base)
            elif base.startswith("sample:"):
                samples[step] = step_sample(sopts, base, serves)
            elif base.startswith("seeded:"):
                seededs[step] = step_seeded(sopts, base)
            elif base.startswith("trace:"):
                traces[step] = step_trace(sopts, base)
            else:
                results[step] = {"error": f"unknown step {step!r}"}
        except Exception as exc:
            results[step] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[gpu_e2e] {step}: {time.monotonic() - t0:.1f}s", flush=True)
        results["serve"] = serves
        results["plant"] = plants
        results["simacc"] = simaccs
        results["sample"] = samples
        results["seeded"] = seededs
        results["trace"] = traces
        results["compare"] = compare(serves)
        results["elapsed_s"] = round(time.monotonic() - opts.clock.t0, 1)
        # Written after every step: a call cut off at its time limit still returns the rest.
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({
        "compare": results["compare"],
        "ready": {m: r.get("ready_seconds")
                  for m, r in {**serves, **plants, **simaccs, **samples, **traces}.items()},
        "plant": {m: r.get("summary", r.get("error")) for m, r in plants.items()},
        "curve": {m: [(c["schedule"], c.get("oracle_accept_length"), c.get("tok_s_c1"),
                       c.get("tok_s_c8")) for c in r.get("curve", [])]
                  for m, r in plants.items() if r.get("curve")},
        "simacc": {m: r.get("accept_lengths", r.get("error")) for m, r in simaccs.items()},
        "sample": {m: r.get("sampling_smoke", r.get("error")) for m, r in samples.items()},
        "seeded": {m: r.get("summary", r.get("error")) for m, r in seededs.items()},
        "trace": {m: [(t.get("bs"), t.get("wall_ms"), (t.get("top_ops") or [{}])[0].get("name"))
                      for t in r.get("traces", [])] if r.get("traces") else r.get("error", [])
                  for m, r in traces.items()},
        "errors": {k: v["error"]
                   for k, v in {**results, **serves, **plants, **simaccs,
                                **samples, **seededs, **traces}.items()
                   if isinstance(v, dict) and "error" in v},
        "elapsed_s": results.get("elapsed_s"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
