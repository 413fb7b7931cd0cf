"""Live layer: a running server is healthy, speculating as expected, and generates.

Standard library HTTP only; every request is bounded by the timeout and the whole
layer by a deadline, so a dead or stuck server fails in seconds.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

from sglang_dflash.check.result import Result, failed, passed, skipped
from sglang_dflash.sglang_overlay import settings

LAYER = "live"
ALGORITHMS = ("none", "dflash", "ddtree")
PROMPT_IDS = [1, 2, 3, 4]
NEW_TOKENS = 8


@dataclass(frozen=True)
class Expectations:
    """What the server should report; plain values so a config file can fill them."""

    algorithm: str | None = None  # none | dflash | ddtree
    draft_model: str | None = None
    ddtree_budget: int | None = None
    metrics: bool | None = None  # /metrics must answer (the config enables metrics)
    ddtree_policy: str | None = None  # canonical text: "fixed" or "adaptive <schedule>"


def expectations_from(algorithm: str | None = None, draft_model: str | None = None,
                      ddtree_budget: int | None = None,
                      ddtree_policy: str | None = None) -> Expectations:
    """Validate plain values (from flags or an instance config); ValueError names the bad one.

    A policy is canonicalised with the worker's own parser, so "adaptive" and its rendered
    schedule compare equal; it needs the budget (the schedule's largest candidate)."""
    if algorithm is not None:
        algorithm = algorithm.lower()
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    if ddtree_budget is not None:
        if isinstance(ddtree_budget, bool) or not isinstance(ddtree_budget, int) \
                or ddtree_budget < 1:
            raise ValueError(f"ddtree budget must be a positive integer, got {ddtree_budget!r}")
        if algorithm not in (None, "ddtree"):
            raise ValueError(f"a ddtree budget was given but the algorithm is {algorithm}")
    if ddtree_policy is not None:
        if ddtree_budget is None:
            raise ValueError("a ddtree policy needs the ddtree budget (--expect-ddtree-budget)")
        from sglang_dflash.sglang_overlay.policy import PolicyError, parse_policy

        try:
            ddtree_policy = parse_policy(ddtree_policy, ddtree_budget, "ddtree policy").describe()
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
    return Expectations(algorithm, draft_model, ddtree_budget, ddtree_policy=ddtree_policy)


def parse_url(url: str) -> str:
    """'http(s)://host:port[/]' -> base URL without trailing slash; ValueError otherwise."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ValueError(f"{url!r} is not http(s)://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{url!r} must not have a path (give http(s)://host:port)")
    return f"{parts.scheme}://{parts.netloc}"


class Client:
    """Tiny JSON client; each request gets min(timeout, time left before the deadline)."""

    def __init__(self, base: str, timeout: float, api_key: str | None, budget: float) -> None:
        self.base, self.timeout, self.api_key = base, timeout, api_key
        self.deadline = time.monotonic() + budget

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        """(status, parsed JSON or text). Raises OSError/TimeoutError on transport failure."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("live layer time budget spent")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=min(self.timeout, left)) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        text = raw.decode(errors="replace")
        try:
            return status, json.loads(text) if text else None
        except json.JSONDecodeError:
            return status, text


# SGLang 0.5.17's /health sleeps a second before its 200 (serve.HEALTH_PROBE_TIMEOUT_S)
HEALTH_MIN_TIMEOUT_S = 2.0


def transport_error(exc: BaseException, base: str, timeout: float) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, TimeoutError) or "timed out" in str(reason):
        return f"no answer from {base} within {timeout:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused by {base} (nothing listening)"
    return f"cannot reach {base}: {reason}"


def is_none_algorithm(value: object) -> bool:
    return value is None or str(value).upper() in ("", "NONE")


def evaluate_server_info(info: dict, exp: Expectations) -> list[Result]:
    """Pure: the server's reported speculation settings against the expectations."""
    out = []
    algo = info.get("speculative_algorithm")
    if exp.algorithm is None:
        out.append(passed(LAYER, "algorithm", f"server reports speculative_algorithm={algo} "
                          "(no expectation given)"))
    elif exp.algorithm == "none":
        if is_none_algorithm(algo):
            out.append(passed(LAYER, "algorithm", f"no speculation ({algo}) as expected"))
        else:
            out.append(failed(LAYER, "algorithm", f"server speculates with {algo}, expected "
                              "none", "restart the server without --speculative-algorithm"))
    elif str(algo).upper() != "DFLASH":  # ServerArgs keeps the spelling it was given
        out.append(failed(LAYER, "algorithm", f"server reports speculative_algorithm={algo}, "
                          f"expected DFLASH ({exp.algorithm})",
                          "start it with --speculative-algorithm DFLASH"))
    else:
        out.append(passed(LAYER, "algorithm", f"speculative_algorithm=DFLASH ({exp.algorithm})"))
    if exp.draft_model is not None:
        draft = info.get("speculative_draft_model_path")
        if draft == exp.draft_model:
            out.append(passed(LAYER, "draft_model", f"draft model {draft}"))
        else:
            out.append(failed(LAYER, "draft_model", f"draft model {draft}, expected "
                              f"{exp.draft_model}", "start it with "
                              f"--speculative-draft-model-path {exp.draft_model}"))
    if exp.ddtree_budget is not None:
        width = info.get("speculative_num_draft_tokens")
        want = exp.ddtree_budget + 1
        if width == want:
            out.append(passed(LAYER, "ddtree_budget", f"verify width {width} = budget "
                              f"{exp.ddtree_budget} + 1 (DDTree active)"))
        else:
            out.append(failed(LAYER, "ddtree_budget", f"speculative_num_draft_tokens={width}, "
                              f"expected budget {exp.ddtree_budget} + 1 = {want}",
                              "check that the DDTree plugin is installed and the config sets "
                              "algorithm \"ddtree\" with ddtree.budget (serve passes it as "
                              f"{settings.BUDGET_ENV})"))
    if exp.ddtree_budget is not None or exp.ddtree_policy is not None:
        out.append(evaluate_ddtree_policy(info, exp.ddtree_policy))
    return out


def ddtree_state(info: dict) -> dict | None:
    """The DDTree worker's policy summary in /server_info (internal_states[0]["ddtree"])."""
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        state = states[0].get("ddtree")
        return state if isinstance(state, dict) else None
    return None


def flashinfer_fields(info: dict) -> list[str]:
    """The fields of /server_info that select FlashInfer attention (``field=flashinfer``)."""
    return [f"{k}=flashinfer" for k in settings.ATTENTION_BACKEND_ARGS
            if info.get(k) == "flashinfer"]


# SGLang 0.5.17's DFLASH argument hook (speculative_hook._handle_dflash) sets
# max_running_requests to this when it is not given: beyond it requests wait, so an adaptive
# server cannot follow no speculation above it (docs/gpu-results.md §35: 0.69 x at c = 64).
SGLANG_SPECULATIVE_MAX_RUNNING = 48


def describe_running_cap(info: dict) -> str:
    """`, at most 48 running requests (...)`: the server's cap on concurrent requests, or ""."""
    cap = info.get("max_running_requests")
    if not isinstance(cap, int) or isinstance(cap, bool):
        return ""
    if cap == SGLANG_SPECULATIVE_MAX_RUNNING:
        return (f"; at most {cap} running requests (SGLang's default for a speculative server: "
                "more wait in its queue; maxRunningRequests lifts it)")
    return f"; at most {cap} running requests"


def describe_slots(slots: dict) -> str:
    """`bs 1 -> 16 (accept 3.20), bs 8 -> 0`: each batch size's current budget."""
    parts = []
    for bs, slot in sorted(slots.items(), key=lambda kv: int(kv[0])):
        cur = slot.get("current")
        acc = (slot.get("accept") or {}).get(str(cur))
        parts.append(f"bs {bs} -> {cur}" + (f" (accept {acc:.2f})" if acc and cur else ""))
    return ", ".join(parts[:8]) + (f", ... ({len(parts)} batch sizes)" if len(parts) > 8 else "")


def adaptive_nodraft_steps(info: dict) -> int | None:
    """The decode steps of an adaptive DDTree server's no-draft round, from /server_info; None
    for any other server (or one without the plugin's report)."""
    from sglang_dflash.sglang_overlay.policy import POLICY_ADAPTIVE  # as parse_policy, above

    state = ddtree_state(info)
    if state is None or not str(state.get("policy") or "").startswith(POLICY_ADAPTIVE):
        return None
    steps = state.get("nodraft_steps")
    return steps if isinstance(steps, int) else None


def evaluate_ddtree_policy(info: dict, expected: str | None) -> Result:
    """Pure: the budget policy the DDTree worker reports against the expected one."""
    state = ddtree_state(info)
    if state is None:
        if expected is None:
            return skipped(LAYER, "ddtree_policy", "the server reports no DDTree policy state "
                           "(no decode round yet, or a plugin without the report)")
        return failed(LAYER, "ddtree_policy", f"expected policy {expected!r}, but the server "
                      "reports no DDTree policy state",
                      "install this sglang-dflash in the server's environment (the plugin adds "
                      "internal_states[0].ddtree to /server_info)")
    policy = state.get("policy")
    slots = state.get("slots") or {}
    learnt = f"; {describe_slots(slots)}" if slots else ""
    if expected is not None and policy != expected:
        return failed(LAYER, "ddtree_policy", f"server runs policy {policy!r}, expected "
                      f"{expected!r}", "set ddtree.policy in the instance config (serve passes "
                      f"it as {settings.POLICY_ENV}) and restart")
    steps = state.get("nodraft_steps")
    fallback = f", no-draft round of {steps} decode steps" if steps and steps > 1 else ""
    fast, checks = state.get("fast_plan"), state.get("fast_plan_checks") or {}
    plan = f", sync-free plan {fast}" if fast in ("on", "check") else ""
    if checks:
        plan += f" ({checks.get('rounds', 0)} rounds checked)"
    if state.get("host_lens") == "bound":
        plan += ", host lengths from the reserved bound"
    flashinfer = flashinfer_fields(info)
    draft = info.get("speculative_draft_attention_backend")
    padded = state.get("padded_verify") is True and draft not in (None, "", "flashinfer")
    if state.get("host_lens") == "bound" and padded:
        plan += f", the FlashInfer verify padded to it (drafter on {draft})"
    elif state.get("host_lens") == "bound" and (flashinfer or state.get("flashinfer_plans")):
        return failed(LAYER, "ddtree_policy", f"policy {policy}: DDTree plans FlashInfer "
                      f"attention ({', '.join(flashinfer) or 'the worker reports it'}) from the "
                      "reserved length bound: FlashInfer's split-KV plan then mixes a tree "
                      "verify's rows and commits tokens the target did not choose "
                      "(docs/gpu-results.md §29, §30)",
                      "install this sglang-dflash in the server's environment (its worker plans "
                      "FlashInfer from exact lengths, or pads the verify to the bound with the "
                      "drafter on --speculative-draft-attention-backend triton), unset "
                      f"{settings.HOST_LENS_ENV}, or use --attention-backend triton")
    if checks.get("violations"):
        return failed(LAYER, "ddtree_policy", f"policy {policy}: the sync-free plan's host bound "
                      f"was below the device prefix in {checks['violations']} of "
                      f"{checks.get('rounds', 0)} rounds (outputs may differ)",
                      (f"set {settings.HOST_LENS_ENV}=sync for this server (the bound came from "
                       "the reserved lengths)" if state.get("host_lens") == "bound" else
                       f"set {settings.FAST_PLAN_ENV}=0 for this server")
                      + " and report the server log's 'fast plan host bound' lines")
    return passed(LAYER, "ddtree_policy", f"policy {policy} (budget {state.get('budget')}"
                  f"{fallback}{plan}){learnt}{describe_running_cap(info)}")


def evaluate_metrics(status: int | None, body: object, expected: bool | None) -> Result:
    """Pure: GET /metrics answered SGLang's Prometheus text (metrics.enable/--enable-metrics).

    Expected (the config enables metrics): anything but 200 with sglang: series is a FAIL.
    Not expected: a 200 is reported, anything else is a SKIP naming how to turn it on.
    """
    text = body if isinstance(body, str) else ""
    series = [ln for ln in text.splitlines() if ln.startswith("sglang:")]
    if status == 200 and series:
        found = f"GET /metrics 200: {len(series)} sglang: series"
        accept = [ln for ln in series if ln.startswith("sglang:spec_accept_length")]
        if accept:
            found += f", spec_accept_length {accept[0].rsplit(' ', 1)[-1]}"
        return passed(LAYER, "metrics", found)
    what = (f"GET /metrics answered {status}" if status != 200
            else "GET /metrics answered 200 without sglang: series")
    if expected:
        return failed(LAYER, "metrics", f"{what}, but the config enables metrics",
                      "the server runs without --enable-metrics; restart it from this config")
    return skipped(LAYER, "metrics", f"{what}: metrics not enabled (metrics.enable = true "
                   "renders --enable-metrics)")


def evaluate_generation(status: int, body: object, speculative: bool,
                        nodraft_steps: int | None = None) -> list[Result]:
    """Pure: the /generate answer has 8 tokens and, when speculating, acceptance stats.

    ``nodraft_steps``: the adaptive policy's no-draft round (k decode steps), which SGLang counts
    as one verify of k tokens, so the accept length it reports is tokens a round, not what the
    drafter earned (8.00 on a server whose drafter earns nothing): the line says so."""
    if status != 200 or not isinstance(body, dict):
        return [failed(LAYER, "generate", f"POST /generate answered {status}: "
                       f"{str(body)[:200]}", "read the server log")]
    ids = body.get("output_ids") or []
    out = []
    if len(ids) != NEW_TOKENS:
        out.append(failed(LAYER, "generate", f"got {len(ids)} output ids, expected {NEW_TOKENS}",
                          "read the server log"))
    else:
        out.append(passed(LAYER, "generate", f"{NEW_TOKENS} tokens generated (greedy)"))
    if speculative:
        meta = body.get("meta_info") or {}
        ct, acc = meta.get("spec_verify_ct"), meta.get("spec_accept_length")
        if not isinstance(ct, (int, float)) or ct <= 0 or acc is None:
            out.append(failed(LAYER, "speculation", f"no speculation statistics in meta_info "
                              f"(spec_verify_ct={ct}, spec_accept_length={acc})",
                              "the server is not speculating; check its flags and log"))
        else:
            note = (f" (tokens a round: the adaptive policy's no-draft rounds of {nodraft_steps}"
                    " decode steps count as one verify each; ddtree_policy shows what the drafter "
                    "earned)" if nodraft_steps and nodraft_steps > 1 else "")
            out.append(passed(LAYER, "speculation", f"spec_verify_ct={ct}, accept length "
                              f"{acc:.2f}{note}"))
    return out


def run_layer(url: str | None, exp: Expectations, timeout: float, api_key: str | None,
              offline: bool) -> list[Result]:
    if offline:
        return [skipped(LAYER, "all", "--offline: no network in this mode")]
    if url is None:
        return [skipped(LAYER, "all", "no --url given")]
    base = parse_url(url)
    client = Client(base, timeout, api_key, budget=4 * timeout + 1)
    try:
        status, _ = client.request("GET", "/health")
    except (OSError, TimeoutError) as exc:
        found = transport_error(exc, base, timeout)
        slow = found.startswith("no answer") and timeout < HEALTH_MIN_TIMEOUT_S
        return [failed(LAYER, "health", found,
                       f"use --timeout {HEALTH_MIN_TIMEOUT_S:g} or more (SGLang 0.5.17's /health "
                       "answers a server that is up after a one-token generation and a 1 s wait)"
                       if slow else "start the server, or check --url")]
    if status != 200:
        return [failed(LAYER, "health", f"GET /health answered {status} (not ready or unhealthy)",
                       "wait for startup to finish, or read the server log")]
    out = [passed(LAYER, "health", f"GET {base}/health 200")]
    try:
        status, info = client.request("GET", "/server_info")
        if status == 404:
            status, info = client.request("GET", "/get_server_info")
        if status == 401:
            return [*out, failed(LAYER, "server_info", "401 unauthorized",
                                 "pass the server's key with --api-key-file")]
        if status != 200 or not isinstance(info, dict):
            return [*out, failed(LAYER, "server_info", f"GET /server_info answered {status}",
                                 "read the server log")]
        out += evaluate_server_info(info, exp)
        speculative = not is_none_algorithm(info.get("speculative_algorithm"))
        status, body = client.request("POST", "/generate", {
            "input_ids": PROMPT_IDS,
            "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS,
                                "ignore_eos": True}})
        out += evaluate_generation(status, body, speculative, adaptive_nodraft_steps(info))
        status, body = client.request("GET", "/metrics")
        out.append(evaluate_metrics(status, body, exp.metrics))
    except (OSError, TimeoutError) as exc:
        out.append(failed(LAYER, "request", transport_error(exc, base, timeout),
                          "the server stopped answering; read its log"))
    return out
