"""End-to-end run on the GPU test host: the check, deliberate breakage, and servers per mode.

Runs ON the device (Python 3.12, staged site dir first on PYTHONPATH, no network) and writes
everything it sees as JSON and logs under --out (the device tool's $OUT). Each step is bounded
and independent: one failing step is recorded and the next one still runs, because device time
is scarce and a partial record is worth more than none.

    python3 scripts/gpu_e2e.py --out $OUT --site /root/site check break
    python3 scripts/gpu_e2e.py --out $OUT --site /root/site serve:none serve:dflash serve:ddtree:16

Steps: `check` (every layer but live), `break` (nested copy and a missing module, FAIL lines
expected), `serve:<algorithm>[:<budget>]` (start through `sglang-dflash serve`, `check --url`,
fixed greedy prompts, a short bench), then `compare` is always run on whatever serve steps
produced: greedy outputs must be token-identical across modes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
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
DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 4096,
    "intermediate_size": 12288, "num_hidden_layers": 1, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "hidden_act": "silu",
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False,
    "layer_types": ["full_attention"], "block_size": 16, "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 17, 33]},
}
PROMPTS = [[100 + i, 2000 + 7 * i, 31 * i + 5, 4242, 17 + i] for i in range(4)]
GEN_TOKENS = 64
PORT = 30000


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


def write_models(root: Path) -> tuple[Path, Path]:
    target, draft = root / "target", root / "draft"
    for path, cfg in ((target, TARGET_CONFIG), (draft, DRAFT_CONFIG)):
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
    subprocess.run(["cp", "-r", str(copy), str(pkg)], check=True)  # the seeds' mistake: nests
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


def instance_config(name: str, algorithm: str, budget: int | None, models: tuple[Path, Path],
                    extra_args: list[str]) -> dict:
    target, draft = models
    cfg = {
        "name": name, "model": str(target), "algorithm": algorithm, "port": PORT,
        "gpus": [0], "memFractionStatic": 0.7, "attentionBackend": "flashinfer",
        "loadFormat": "dummy", "skipTokenizerInit": True, "preflight": False,
        "startTimeout": 420,
        "extraArgs": ["--sampling-backend", "pytorch", "--cuda-graph-max-bs", "32",
                      "--cuda-graph-backend-prefill", "disabled", *extra_args],
    }
    if algorithm != "none":
        cfg |= {"draftModel": str(draft), "draftLoadFormat": "dummy",
                "draftAttentionBackend": "flashinfer"}
    if algorithm == "ddtree":
        cfg["ddtree"] = {"budget": budget}
    return cfg


def step_serve(out: Path, env: dict, mode: str, models: tuple[Path, Path],
               backend: str, bench: bool) -> dict:
    parts = mode.split(":")
    algorithm = parts[1]
    budget = int(parts[2]) if len(parts) > 2 else None
    name = "-".join(parts[1:])
    cfg = instance_config(name, algorithm, budget, models, [])
    cfg["attentionBackend"] = backend
    if algorithm != "none":
        cfg["draftAttentionBackend"] = backend
    cfg_path = out / f"config-{name}.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    log = open(out / f"serve-{name}.log", "w")  # noqa: SIM115 - closed in finally
    t0 = time.monotonic()
    proc = subprocess.Popen(cli(["serve", "--config", str(cfg_path), "--poll-interval", "0.5"]),
                            env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{PORT}"
    rec: dict = {"mode": mode, "config": cfg}
    while time.monotonic() - t0 < cfg["startTimeout"] + 10:
        if proc.poll() is not None:
            rec["serve_exit_before_ready"] = proc.returncode
            rec["ready_seconds"] = None
            break
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    rec["ready_seconds"] = round(time.monotonic() - t0, 1)
                    break
        except OSError:
            pass
        time.sleep(0.5)
    try:
        if rec.get("ready_seconds"):
            expect = ["--expect-algorithm", algorithm]
            if budget is not None:
                expect += ["--expect-ddtree-budget", str(budget)]
            rec["check_url"] = sh(cli(["check", "--url", url, "--layer", "live", *expect]),
                                  env=env, timeout=120)
            outputs, metas, t1 = [], [], time.monotonic()
            for ids in PROMPTS:
                r = http_json(url + "/generate", {
                    "input_ids": ids, "sampling_params": {
                        "temperature": 0, "max_new_tokens": GEN_TOKENS, "ignore_eos": True}})
                outputs.append(r["output_ids"])
                metas.append(r.get("meta_info", {}))
            rec["greedy"] = {"outputs": outputs, "meta": metas,
                             "seconds": round(time.monotonic() - t1, 3)}
            if bench:
                bench_json = out / f"bench-{name}.json"
                rec["bench"] = sh(cli(["bench", "--url", url, "--concurrency", "1,8,32",
                                       "--num-prompts", "32", "--max-new-tokens", "64",
                                       "--json", str(bench_json), "--quiet"]),
                                  env=env, timeout=240)
    except Exception as exc:  # recorded, never fatal: the next mode still runs
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rec["serve_exit"] = proc.returncode
        log.close()
        rec["log_tail"] = (out / f"serve-{name}.log").read_text()[-6000:]
    return rec


def compare(serves: dict) -> dict:
    """Greedy outputs must be token-identical across every mode that produced them."""
    got = {m: r["greedy"]["outputs"] for m, r in serves.items() if "greedy" in r}
    if len(got) < 2:
        return {"compared": list(got), "identical": None}
    base_mode, base = next(iter(got.items()))
    diffs = {m: [i for i, (a, b) in enumerate(zip(o, base, strict=True)) if a != b]
             for m, o in got.items() if m != base_mode}
    return {"baseline": base_mode, "compared": list(got),
            "identical": all(not d for d in diffs.values()), "differing_prompts": diffs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--site", type=Path, required=True, help="the staged site dir")
    ap.add_argument("--models", type=Path, default=Path("/root/models"))
    ap.add_argument("--backend", default="flashinfer", choices=["flashinfer", "triton"])
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("steps", nargs="+")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(args.site), PYTHONUNBUFFERED="1")
    models = write_models(args.models)
    results: dict = {"steps": args.steps, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                      time.gmtime())}
    serves: dict = {}
    for step in args.steps:
        t0 = time.monotonic()
        try:
            if step == "check":
                results["check"] = step_check(args.out, env)
            elif step == "break":
                results["break"] = step_break(args.out, env, args.site)
            elif step.startswith("serve:"):
                serves[step] = step_serve(args.out, env, step, models, args.backend,
                                          not args.no_bench)
            else:
                results[step] = {"error": f"unknown step {step!r}"}
        except Exception as exc:
            results[step] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[gpu_e2e] {step}: {time.monotonic() - t0:.1f}s", flush=True)
        results["serve"] = serves
        results["compare"] = compare(serves)
        # Written after every step: a call cut off at its time limit still returns the rest.
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({"compare": results["compare"],
                      "ready": {m: r.get("ready_seconds") for m, r in serves.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
