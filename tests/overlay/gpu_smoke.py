"""DDTree smoke run against a real SGLang server (GPU host), with dummy weights and a plant.

1. Writes tiny Qwen3 target / DFlash draft configs (``--load-format dummy``, no tokenizer).
2. Baseline server (no speculation): greedy outputs for a planted and an unplanted prompt.
3. Writes a TEST-ONLY plant file: the baseline continuation, a rank pattern, a logp profile.
4. DDTree server (``SGLANG_DFLASH_DDTREE_BUDGET``, ``SGLANG_DFLASH_DDTREE_PLANT``): the same
   requests; checks ``/server_info`` reports N+1, outputs equal the baseline's, and the planted
   request's ``spec_verify_ct`` equals the CPU oracle's round count.

Prints one JSON report; exit 0 when every check passes, 1 when one fails, 2 on bad usage.
Dummy weights give near-tied logits, so a numerics-only argmax flip can break token identity;
the report names the first differing index. Example (H200, plugin installed):

    python tests/overlay/gpu_smoke.py --budget 8 --backend flashinfer --ranks 0,0,1,-1
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUDGET_ENV = "SGLANG_DFLASH_DDTREE_BUDGET"
PLANT_ENV = "SGLANG_DFLASH_DDTREE_PLANT"
PLANTED_PROMPT = list(range(11, 43))
OTHER_PROMPT = list(range(200, 224))


def model_configs(vocab: int, block: int) -> tuple[dict, dict]:
    target = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "hidden_act": "silu", "torch_dtype": "bfloat16", "tie_word_embeddings": False,
    }  # fmt: skip
    draft = {
        **target, "architectures": ["DFlashDraftModel"], "num_hidden_layers": 1,
        "block_size": block, "num_target_layers": 4,
        "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": vocab - 1},
    }  # fmt: skip
    return target, draft


def plant_doc(continuation: list[int], pattern: list[int], profile: list[float]) -> dict:
    ranks = [pattern[i % len(pattern)] for i in range(len(continuation))]
    return {
        "test_only": True,
        "requests": [{"input_ids": PLANTED_PROMPT, "continuation": continuation, "ranks": ranks}],
        "logp_profile": profile,
    }


def first_diff(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Report:
    verify_width: int | None = None
    expected_verify_width: int = 0
    planted_identical: bool = False
    planted_first_diff: int | None = None
    other_identical: bool = False
    other_first_diff: int | None = None
    expected_verify_ct: int = 0
    observed_verify_ct: int | None = None
    accept_length: float | None = None
    failures: list[str] = field(default_factory=list)


def judge(report: Report) -> Report:
    if report.verify_width != report.expected_verify_width:
        report.failures.append(
            f"/server_info speculative_num_draft_tokens={report.verify_width}, "
            f"expected {report.expected_verify_width}"
        )
    if not report.planted_identical:
        report.failures.append(f"planted output differs at {report.planted_first_diff}")
    if not report.other_identical:
        report.failures.append(f"unplanted output differs at {report.other_first_diff}")
    if report.observed_verify_ct != report.expected_verify_ct:
        report.failures.append(
            f"spec_verify_ct={report.observed_verify_ct}, oracle {report.expected_verify_ct}"
        )
    return report


# ---- I/O at the edges ----------------------------------------------------------------------


def _http(url: str, body: dict | None = None, timeout: float = 120.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def launch(python: str, argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [python, "-m", "sglang.launch_server", *argv],
            env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def wait_ready(proc: subprocess.Popen, base: str, timeout: float, log: Path) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"server exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise RuntimeError(f"server not healthy after {timeout:.0f}s (log: {log})")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def generate(base: str, prompt: list[int], n: int) -> dict:
    body = {"input_ids": prompt, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                     "ignore_eos": True}}  # fmt: skip
    return _http(base + "/generate", body, timeout=300)


def serve(python, argv, env, log, base, timeout, requests) -> tuple[list[dict], dict]:
    proc = launch(python, argv, env, log)
    try:
        wait_ready(proc, base, timeout, log)
        info = _http(base + "/server_info", timeout=30)
        return [generate(base, p, n) for p, n in requests], info
    finally:
        stop(proc)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--backend", default="flashinfer", choices=["flashinfer", "triton"])
    ap.add_argument("--port", type=int, default=30177)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--ranks", default="0,0,1,-1", help="rank pattern, cycled")
    ap.add_argument("--profile", default="-0.01,-4,-5,-6", help="planted logp profile")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--extra-args", default="", help="more launch_server flags, space separated")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        pattern = [int(x) for x in a.ranks.split(",")]
        profile = [float(x) for x in a.profile.split(",")]
    except ValueError:
        print("gpu_smoke: --ranks and --profile take comma-separated numbers", file=sys.stderr)
        return 2
    if not 1 <= a.budget <= 1023 or a.max_new < 2:
        print("gpu_smoke: --budget must be in 1..1023 and --max-new >= 2", file=sys.stderr)
        return 2
    work = Path(a.workdir or tempfile.mkdtemp(prefix="ddtree-smoke-"))
    target, draft = model_configs(a.vocab, a.block)
    for name, cfg in (("target", target), ("draft", draft)):
        (work / name).mkdir(parents=True, exist_ok=True)
        (work / name / "config.json").write_text(json.dumps(cfg, indent=1))
    base = f"http://127.0.0.1:{a.port}"
    common = [
        "--model-path", str(work / "target"), "--load-format", "dummy",
        "--skip-tokenizer-init", "--attention-backend", a.backend, "--host", "127.0.0.1",
        "--port", str(a.port), "--context-length", "2048", "--mem-fraction-static", "0.5",
        "--cuda-graph-max-bs", "4", "--max-running-requests", "4", *a.extra_args.split(),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in (BUDGET_ENV, PLANT_ENV)}
    long_n = a.max_new + a.block + 1  # the plant must cover every drafted depth
    (planted_ref, other_ref), _ = serve(
        a.python, common, env, work / "baseline.log", base, a.timeout,
        [(PLANTED_PROMPT, long_n), (OTHER_PROMPT, a.max_new)],
    )  # fmt: skip
    continuation = planted_ref["output_ids"]
    doc = plant_doc(continuation, pattern, profile)
    (work / "plant.json").write_text(json.dumps(doc))

    from sglang_dflash.sglang_overlay.plant import parse_plant
    from sglang_dflash.sglang_overlay.plant_oracle import expected_rounds

    spec = parse_plant(json.dumps(doc))
    rounds = expected_rounds(
        spec.requests[0], spec.logp_profile, budget=a.budget, block_size=a.block,
        vocab=a.vocab, max_new_tokens=a.max_new,
    )  # fmt: skip
    dd_env = {**env, BUDGET_ENV: str(a.budget), PLANT_ENV: str(work / "plant.json")}
    spec_args = [
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
        str(work / "draft"), "--speculative-dflash-block-size", str(a.block),
    ]  # fmt: skip
    (planted, other), info = serve(
        a.python, common + spec_args, dd_env, work / "ddtree.log", base, a.timeout,
        [(PLANTED_PROMPT, a.max_new), (OTHER_PROMPT, a.max_new)],
    )  # fmt: skip
    want = continuation[: a.max_new]
    meta = planted.get("meta_info", {})
    report = judge(
        Report(
            verify_width=info.get("speculative_num_draft_tokens"),
            expected_verify_width=a.budget + 1,
            planted_identical=planted["output_ids"] == want,
            planted_first_diff=first_diff(planted["output_ids"], want),
            other_identical=other["output_ids"] == other_ref["output_ids"],
            other_first_diff=first_diff(other["output_ids"], other_ref["output_ids"]),
            expected_verify_ct=len(rounds),
            observed_verify_ct=meta.get("spec_verify_ct"),
            accept_length=meta.get("spec_accept_length"),
        )
    )
    print(json.dumps({"workdir": str(work), "rounds": rounds, **asdict(report)}, indent=1))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
