"""`sglang-dflash bench`: throughput, latency and acceptance of one server or a sweep.

Either against a running server (`--url`), or one server per sweep point, each started
with `sglang-dflash serve --config` and stopped before the next. Inputs are all checked
before anything starts, so a typo costs seconds, not a server start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_dflash.bench import plot, server
from sglang_dflash.bench.client import Endpoint, freeze_gc, health, parse_url
from sglang_dflash.bench.report import (
    ConfigResult,
    best_table,
    comparison_table,
    document,
    progress_line,
    summary_table,
)
from sglang_dflash.bench.runner import Sampling, run_level, split_admission_delays, warmup
from sglang_dflash.bench.stats import (
    RequestRecord,
    Summary,
    best_per_concurrency,
    compare,
    summarize,
)
from sglang_dflash.bench.sweep import (
    SweepError,
    apply_overrides,
    duplicate_points,
    expand,
    find_baseline,
    label,
    parse_sweep,
)
from sglang_dflash.bench.workload import Prompt, WorkloadError, load_jsonl, synthetic, take
from sglang_dflash.config import (
    ConfigError,
    parse_config,
    read_config_json,
    render_argv,
    render_env,
    unset_env,
)
from sglang_dflash.errors import UserError

PROG = "sglang-dflash bench"
DEFAULT_SYNTHETIC_PROMPTS = 64


class UsageError(UserError):
    """Bad input to `bench`: cli.main prints this one line and exits 2."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_argument_group("target (one of)")
    t = target.add_mutually_exclusive_group(required=True)
    t.add_argument("--url", help="a running server, e.g. http://127.0.0.1:30000")
    t.add_argument("--config", metavar="FILE",
                   help="an instance config (JSON); one server is started per sweep point")
    target.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="with --config: dotted key and values, e.g. ddtree.budget=16,32,64; "
                             "several --sweep give their cartesian product")
    target.add_argument("--baseline", metavar="KEY=VALUE",
                        help="the configuration the others are compared with "
                             "(e.g. algorithm=dflash); default: the first")
    target.add_argument("--start-timeout", type=float, metavar="S",
                        help="seconds to wait for each started server's /health "
                             "(default: the config's startTimeout, else 1800)")
    target.add_argument("--api-key-file", metavar="FILE",
                        help="file holding the server's API key (sent as a Bearer token); "
                             "with --config the config's apiKeyFile is the default")
    w = p.add_argument_group("workload")
    w.add_argument("--prompts", metavar="FILE.jsonl",
                   help='one {"text": ...} or {"input_ids": [...]} per line, optional '
                        '"max_new_tokens"; default: synthetic token ids')
    w.add_argument("--num-prompts", type=int, metavar="N",
                   help=f"requests per level (default: every line of --prompts, or "
                        f"{DEFAULT_SYNTHETIC_PROMPTS} synthetic); a shorter file is cycled")
    w.add_argument("--synthetic-input-len", type=int, default=128, metavar="N")
    w.add_argument("--synthetic-vocab", type=int, default=32000, metavar="N",
                   help="synthetic token ids are drawn from 0..N-1 (default 32000)")
    w.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts")
    w.add_argument("--concurrency", default="1", metavar="C1,C2,...",
                   help="requests in flight, one level per value (default 1)")
    w.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    w.add_argument("--temperature", type=float, default=0.0)
    w.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly max_new_tokens (default on)")
    w.add_argument("--warmup", type=int, default=1, metavar="N",
                   help="unrecorded requests per configuration before measuring (default 1)")
    w.add_argument("--warmup-wave", action="store_true",
                   help="before each level also send one unrecorded wave of C requests at "
                        "its concurrency C: what a server does the first time it sees a "
                        "batch size (a lazy compile, a new graph) stays out of the steady "
                        "state the level measures")
    w.add_argument("--warmup-waves", type=int, default=0, metavar="K",
                   help="K unrecorded waves (K x C requests in one closed loop) before each "
                        "level, the first staggered (half of C, the rest 0.25 s later) so the "
                        "server admits a prefill beside running requests before the level "
                        "measures (--warmup-wave = 1)")
    w.add_argument("--freeze-gc", action="store_true",
                   help="before each level, after its warm-up, POST the server's /freeze_gc "
                        "(SGLang's own endpoint): the objects alive then leave the garbage "
                        "collector's full passes, whose stall of every request in flight is "
                        "the suspect of the ~0.4 s pause each server had once (docs/ddtree.md)")
    w.add_argument("--request-timeout", type=float, default=300.0, metavar="S",
                   help="bound on each whole request (default 300)")
    w.add_argument("--connect-timeout", type=float, default=5.0, metavar="S",
                   help="bound on the /health probe of --url (default 5)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help="raw per-request records and summaries")
    o.add_argument("--plot", metavar="FILE.png",
                   help="throughput and acceptance length against budget (needs matplotlib)")
    o.add_argument("--log-dir", metavar="DIR",
                   help="keep started servers' configs and logs here (default: a temp dir, "
                        "removed afterwards)")
    o.add_argument("--quiet", action="store_true", help="no progress or status on stderr")


# ---------------------------------------------------------------- input checking


def parse_levels(text: str) -> list[int]:
    bad = UsageError(f"--concurrency {text!r}: expected positive integers like 1,8,32")
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        raise bad from None
    if not levels or any(c < 1 for c in levels):
        raise bad
    if len(set(levels)) != len(levels):
        raise UsageError(f"--concurrency {text!r}: a level is listed twice")
    return levels


def read_key(path: str) -> str:
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        raise UsageError(f"cannot read API key file {path}: {reason}") from None
    if not key:
        raise UsageError(f"API key file {path} is empty")
    return key


def read_raw_config(path: str) -> dict[str, Any]:
    try:
        raw = read_config_json(path)
    except ConfigError as e:
        raise UsageError(str(e)) from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: config must be a JSON object")
    return raw


def check_output_path(flag: str, path: str | None) -> None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise UsageError(f"{flag} {path}: directory {Path(path).resolve().parent} does not exist")


@dataclass
class Plan:
    """One configuration to measure: a sweep point, its raw config, where to reach it."""

    label: str
    point: dict[str, Any]
    raw: dict[str, Any] | None = None
    instance: server.Instance | None = None
    endpoint: Endpoint | None = None  # --url only; started servers get theirs at start
    api_key: str | None = None


def build_plans(args: argparse.Namespace) -> list[Plan]:
    if args.url:
        if args.sweep:
            raise UsageError("--sweep needs --config (a running server cannot be reconfigured)")
        key = read_key(args.api_key_file) if args.api_key_file else None
        try:
            ep = parse_url(args.url, key)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return [Plan(ep.url, {}, endpoint=ep)]
    raw = read_raw_config(args.config)
    try:
        points = expand([parse_sweep(s) for s in args.sweep])
    except SweepError as e:
        raise UsageError(f"--sweep {e}") from None
    plans = []
    for point in points:
        try:
            resolved = apply_overrides(raw, point)
            inst = server.validate(resolved)
        except (SweepError, ValueError) as e:
            where = f" (sweep point {label(point)})" if point else ""
            raise UsageError(f"{args.config}{where}: {e}") from None
        name = label(point) if point else str(raw.get("name", "config"))
        key_file = args.api_key_file or inst.api_key_file
        plans.append(Plan(name, point, resolved, inst, api_key=read_key(key_file)
                          if key_file else None))
    return drop_duplicate_servers(plans)


def rendered_server(raw: dict[str, Any]) -> tuple:
    """All a started server sees of its config: SGLang's argv and the environment serve sets."""
    cfg = parse_config(raw)
    return (tuple(render_argv(cfg)), tuple(sorted(render_env(cfg).items())),
            unset_env(cfg))


def drop_duplicate_servers(plans: list[Plan]) -> list[Plan]:
    """Keep one plan per distinct server; say on stderr which points went and why."""
    dropped = duplicate_points([p.point for p in plans],
                               [rendered_server(p.raw or {}) for p in plans])
    for d in dropped:
        alg = (plans[d.index].raw or {}).get("algorithm", "dflash")
        print(f"sglang-dflash bench: skipping sweep point {plans[d.index].label}: the same "
              f"server as {plans[d.same_as].label} (algorithm {alg} ignores "
              f"{', '.join(d.ignored)})", file=sys.stderr)
    gone = {d.index for d in dropped}
    return [p for i, p in enumerate(plans) if i not in gone]


def load_prompts(args: argparse.Namespace) -> list[Prompt]:
    if args.num_prompts is not None and args.num_prompts < 1:
        raise UsageError("--num-prompts must be at least 1")
    if args.prompts:
        try:
            return take(load_jsonl(args.prompts), args.num_prompts)
        except WorkloadError as e:
            raise UsageError(str(e)) from None
    if args.synthetic_input_len < 1 or args.synthetic_vocab < 1:
        raise UsageError("--synthetic-input-len and --synthetic-vocab must be at least 1")
    return synthetic(args.num_prompts or DEFAULT_SYNTHETIC_PROMPTS, args.synthetic_input_len,
                     args.synthetic_vocab, args.seed)


def check_numbers(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    if args.temperature < 0:
        raise UsageError("--temperature must not be negative")
    if args.warmup < 0:
        raise UsageError("--warmup must not be negative")
    if args.warmup_waves < 0:
        raise UsageError(f"--warmup-waves {args.warmup_waves}: must not be negative")
    for flag in ("request_timeout", "connect_timeout", "start_timeout"):
        v = getattr(args, flag)
        if v is not None and not v > 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be positive")


# ---------------------------------------------------------------- running


class Status:
    """Progress and status on stderr; the bar only on a terminal and never with --quiet."""

    def __init__(self, quiet: bool, stream=sys.stderr) -> None:
        self.quiet = quiet
        self.stream = stream
        self.bar = not quiet and stream.isatty()
        self._open = False
        self._width = 0  # of the last bar, to blank what a shorter one leaves behind

    def say(self, msg: str) -> None:
        self.end_bar()
        if not self.quiet:
            print(f"bench: {msg}", file=self.stream, flush=True)

    def error(self, msg: str) -> None:  # errors show even with --quiet
        self.end_bar()
        print(f"{PROG}: {msg}", file=self.stream, flush=True)

    def progress(self, text: str) -> None:
        if self.bar:
            self.stream.write("\r" + text.ljust(self._width))
            self.stream.flush()
            self._width = max(self._width, len(text))
            self._open = True

    def end_bar(self) -> None:
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
            self._width = 0


@dataclass
class Run:
    """What the run produced so far; partial when interrupted."""

    configs: list[ConfigResult] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)
    interrupted: bool = False
    warmups: list[Summary] = field(default_factory=list)  # the unrecorded waves, per level


@dataclass
class Bench:
    """Everything the measuring loop needs, checked and built before anything starts."""

    args: argparse.Namespace
    prompts: list[Prompt]
    levels: list[int]
    sampling: Sampling
    status: Status
    workdir: Path
    run: Run = field(default_factory=Run)

    def measure(self, plan: Plan, cres: ConfigResult, ep: Endpoint, tag: str,
                server_gone: Callable[[], str | None]) -> None:
        """Warm up, then every concurrency level; a failure lands in cres.error."""
        args, prompts, run = self.args, self.prompts, self.run
        if args.warmup:
            err = warmup(ep, prompts, args.warmup, self.sampling, args.request_timeout)
            if err:
                cres.error = server_gone() or err
                return
        waves = max(args.warmup_waves, 1 if args.warmup_wave else 0)
        for c in self.levels:
            if waves:
                err = self.warmup_wave(ep, plan, c, server_gone, waves)
                if err:
                    cres.error = err
                    return
            if args.freeze_gc:
                err = freeze_gc(ep, args.request_timeout)
                if err:
                    cres.error = server_gone() or err
                    return
            t0 = time.monotonic()
            name = f"{tag} {plan.label} c={c}"
            level = run_level(
                ep, plan.label, prompts, c, self.sampling, args.request_timeout,
                on_progress=lambda done, name=name, t0=t0: self.status.progress(
                    progress_line(name, done, len(prompts), time.monotonic() - t0)),
                server_gone=server_gone)
            self.status.end_bar()
            run.records.extend(level.records)
            if level.records:
                run.summaries.append(summarize(plan.label, c, level.records, level.duration_s))
            if level.interrupted:
                run.interrupted = True
                return
            if level.fatal:
                done = sum(r.ok for r in level.records)
                cres.error = (f"stopped at concurrency {c} after {done} completed requests: "
                              f"{level.fatal}")
                return
            if level.records:
                s = run.summaries[-1]
                self.status.say(f"{tag} {plan.label} c={c}: {s.ok}/{s.requests} ok, "
                                f"{s.output_tokens_per_s or 0:.1f} out tok/s")

    def warmup_wave(self, ep: Endpoint, plan: Plan, c: int,
                    server_gone: Callable[[], str | None], waves: int = 1) -> str | None:
        """``waves`` x ``c`` unrecorded requests at concurrency ``c`` (one closed loop); the
        first error. Their summary goes to ``run.warmups``: a first-use pause shows there."""
        wave = [self.prompts[i % len(self.prompts)] for i in range(waves * c)]
        # the first wave staggered: its second half is admitted beside running requests
        level = run_level(ep, plan.label, wave, c, self.sampling, self.args.request_timeout,
                          server_gone=server_gone, start_delays=split_admission_delays(c))
        if level.records:
            self.run.warmups.append(summarize(plan.label, c, level.records, level.duration_s))
        if level.interrupted:
            self.run.interrupted = True
            return "interrupted during the warm-up wave"
        if level.fatal:
            return f"warm-up wave at concurrency {c} failed: {level.fatal}"
        bad = next((r.error for r in level.records if not r.ok), None)
        return f"warm-up wave at concurrency {c} failed: {bad}" if bad else None

    def run_url(self, plan: Plan, cres: ConfigResult, tag: str) -> None:
        ep = plan.endpoint
        assert ep is not None
        cres.url = ep.url
        try:
            code = health(ep, self.args.connect_timeout)
        except OSError as e:
            cres.error = f"cannot reach {ep.url}/health: {e}"
            return
        if code != 200:
            cres.error = f"{ep.url}/health answered {code}, not 200 (is the server ready?)"
            return
        self.measure(plan, cres, ep, tag, lambda: None)

    def run_started(self, plan: Plan, cres: ConfigResult, tag: str, index: int) -> None:
        inst = plan.instance
        assert inst is not None and plan.raw is not None
        timeout = self.args.start_timeout or inst.start_timeout or 1800
        self.status.say(f"{tag} starting a server for {plan.label} on port {inst.port}")
        t0 = time.monotonic()
        try:
            launched = server.start(plan.raw, inst, self.workdir, f"config-{index + 1}",
                                    plan.api_key, timeout)
        except server.LaunchError as e:
            cres.error, cres.log_tail = str(e), e.log_tail
            return
        cres.url = launched.endpoint.url
        self.status.say(f"{tag} ready in {time.monotonic() - t0:.1f} s at {cres.url}")
        try:
            self.measure(plan, cres, launched.endpoint, tag, launched.gone)
        finally:
            died = cres.error is not None and server.exited_within(launched, 3.0)
            rc = server.stop(launched)
            if died:
                cres.error = f"{cres.error} (the server exited with code {rc})"
                cres.log_tail = server.tail(launched.stderr_path)
            self.status.say(f"{tag} stopped the server (exit code {rc})")

    def run_all(self, plans: list[Plan]) -> None:
        """Each plan in turn; a failed plan is reported and the next one runs."""
        for i, plan in enumerate(plans):
            cres = ConfigResult(plan.label, plan.point, config=plan.raw)
            self.run.configs.append(cres)
            tag = f"[{i + 1}/{len(plans)}]"
            if plan.endpoint is not None:
                self.run_url(plan, cres, tag)
            else:
                self.run_started(plan, cres, tag, i)
            if cres.error:
                self.status.error(f"{cres.label}: {cres.error}")
                for line in cres.log_tail:
                    print(f"  | {line}", file=sys.stderr)
            if self.run.interrupted:
                return


def machine() -> dict[str, str]:
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "python": platform.python_version()}


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    status = Status(args.quiet)
    # A UsageError from here on reaches cli.main (one line, exit 2) before anything starts.
    check_numbers(args)
    levels = parse_levels(args.concurrency)
    plans = build_plans(args)
    prompts = load_prompts(args)
    try:
        base_i = find_baseline([p.point for p in plans],
                               [p.raw or {} for p in plans], args.baseline)
    except SweepError as e:
        raise UsageError(str(e)) from None
    check_output_path("--json", args.json)
    check_output_path("--plot", args.plot)
    if args.plot:
        try:
            plot.require_matplotlib()
        except ImportError as e:
            raise UsageError(str(e)) from None
    if args.log_dir:
        try:
            Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--log-dir {args.log_dir}: {e.strerror or e}") from None

    workdir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="sgl-bench-"))
    bench = Bench(args, prompts, levels,
                  Sampling(args.max_new_tokens, args.temperature, args.ignore_eos),
                  status, workdir)
    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        bench.run_all(plans)
    except KeyboardInterrupt:
        bench.run.interrupted = True
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if not args.log_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    return finish(args, plans, base_i, bench.run, status)


def finish(args: argparse.Namespace, plans: list[Plan], base_i: int, result: Run,
           status: Status) -> int:
    status.end_bar()
    baseline = plans[base_i].label
    comparisons = compare(result.summaries, baseline)
    best = best_per_concurrency(result.summaries, baseline) if len(plans) > 1 else []
    if result.summaries:
        print(summary_table(result.summaries))
        if len(plans) > 1 and any(s.config == baseline for s in result.summaries):
            print(f"\nagainst the baseline {baseline} (ratio = configuration / baseline)")
            print(comparison_table(comparisons))
        elif len(plans) > 1:
            print(f"\nno comparison: the baseline {baseline} has no results")
        if best:
            print("\nfastest per concurrency (configurations with no failed request)")
            print(best_table(best))
    rc = 0
    if args.json:
        doc = document(machine=machine(), argv=sys.argv, interrupted=result.interrupted,
                       baseline=baseline, configs=result.configs, summaries=result.summaries,
                       comparisons=comparisons, records=result.records, best=best,
                       warmups=result.warmups)
        try:
            tmp = Path(args.json + ".tmp")
            tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, args.json)
        except OSError as e:
            status.error(f"cannot write --json {args.json}: {e.strerror or e}")
            rc = 1
    if args.plot and result.summaries and not result.interrupted:
        try:
            plot.write_plot(args.plot, result.configs, result.summaries)
        except (ImportError, OSError, ValueError) as e:
            status.error(f"cannot write --plot {args.plot}: {e}")
            rc = 1
    if result.interrupted:
        where = f"; partial results written to {args.json}" if args.json else ""
        status.error(f"interrupted{where}")
        return 130
    failed = [c for c in result.configs if c.error]
    bad_requests = sum(s.errors for s in result.summaries)
    if failed or bad_requests:
        if bad_requests and not failed:  # a failed configuration has said why already
            status.error(f"{bad_requests} request(s) failed; see the ok/n column"
                         + (" and the records in --json" if args.json else ""))
        return 1
    return rc
