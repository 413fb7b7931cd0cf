"""``real_drafter.serve_pair`` and ``benchmarks/trace_summary.py`` on the CPU.

serve_pair runs as a real process that starts real ``sglang-dflash serve`` processes; SGLang
cannot run here, so the SGLang stand-in (tests/standin) answers in its place. The same command
ran against the real server on the H200 (docs/real-drafter.md, docs/perf/real-drafter.json).
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

import trace_summary  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- trace_summary ------------------------------------------------------------------------


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_union_and_gaps():
    total, gaps = trace_summary.union_us([(0, 10), (5, 12), (20, 25), (25, 30), (40, 41)])
    assert total == 12 + 10 + 1
    assert gaps == [8, 10]


def test_summary_per_step_figures():
    """Two steps of 100 us: kernels busy 30 + 20 us in step one (overlapping), 50 in step two,
    one stream sync of 40 us and one graph launch."""
    events = [
        _x("kernel", "gemm", 0, 30), _x("kernel", "norm", 10, 10), _x("kernel", "gemm", 60, 20),
        _x("kernel", "gemm", 150, 50),
        _x("cuda_runtime", "cudaLaunchKernel", 0, 2), _x("cuda_runtime", "cudaLaunchKernel", 58, 2),
        _x("cuda_runtime", "cudaStreamSynchronize", 100, 40),
        _x("cuda_runtime", "cudaGraphLaunch", 148, 3),
        _x("cpu_op", "aten::argmax", 90, 5),
        {"ph": "i", "name": "instant", "ts": 1},  # not a complete event: ignored
    ]
    s = trace_summary.summarise({"traceEvents": events}, steps=2)
    assert s["wall_ms_per_step"] == pytest.approx(0.1)  # 0 .. 200 us over 2 steps
    assert s["gpu_busy_ms_per_step"] == pytest.approx((30 + 20 + 50) / 2000)
    assert s["gpu_idle_ms_per_step"] == pytest.approx((200 - 100) / 2000)
    assert s["idle_gaps_over_20us_per_step"] == 1.0  # 30->60 (30 us) and 80->150 (70 us)
    assert s["idle_in_gaps_over_20us_ms_per_step"] == pytest.approx(0.05)
    assert s["kernels_per_step"] == 2.0
    assert s["kernel_launch_calls_per_step"] == 1.0
    assert s["graph_launches_per_step"] == 0.5
    assert s["sync_calls_per_step"] == 0.5
    assert s["sync_host_ms_per_step"] == pytest.approx(0.02)
    assert s["top_kernels"][0] == {"name": "gemm", "ms_per_step": 0.05, "calls_per_step": 1.5}
    assert s["top_cpu_ops"][0]["name"] == "aten::argmax"
    with pytest.raises(ValueError):
        trace_summary.summarise({"traceEvents": events}, steps=0)


def _r(cat, name, ts, dur, corr=None, tid=1):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_ranges_get_their_host_time_and_their_kernels_gpu_time():
    """One step: ddtree.round 0..100 us holding ddtree.draft 0..20 (one launch -> 7 us kernel)
    and ddtree.verify_forward 30..60 (a graph launch -> two kernels, 10 + 15 us). A launch on
    another thread inside the span and one after the round are not the round's."""
    events = [
        _r("user_annotation", "ddtree.round", 0, 100),
        _r("user_annotation", "ddtree.draft", 0, 20),
        _r("user_annotation", "ddtree.verify_forward", 30, 30),
        _r("cuda_runtime", "cudaLaunchKernel", 5, 2, corr=1),
        _r("cuda_runtime", "cudaGraphLaunch", 40, 3, corr=2),
        _r("cuda_runtime", "cudaLaunchKernel", 45, 2, corr=3, tid=2),
        _r("cuda_runtime", "cudaLaunchKernel", 150, 2, corr=4),
        _r("kernel", "topk", 10, 7, corr=1),
        _r("kernel", "gemm", 50, 10, corr=2), _r("kernel", "attn", 60, 15, corr=2),
        _r("kernel", "other", 80, 4, corr=3), _r("kernel", "late", 160, 40, corr=4),
        _r("cuda_runtime", "cudaStreamSynchronize", 62, 30),  # in the round, after verify
        _r("cuda_runtime", "cudaStreamSynchronize", 12, 5),  # in draft (and so the round)
        _r("cuda_runtime", "cudaStreamSynchronize", 50, 9, tid=2),  # another thread's
        _r("cuda_runtime", "cudaStreamSynchronize", 170, 9),  # after the round
    ]
    s = trace_summary.summarise({"traceEvents": events}, steps=1)
    rows = {r["name"]: r for r in s["ranges"]}
    assert rows["ddtree.round"] == {"name": "ddtree.round", "host_ms_per_step": 0.1,
                                    "gpu_ms_per_step": 0.032, "calls_per_step": 1.0,
                                    "launches_per_step": 1.0,  # the graph launch is not one
                                    "syncs_per_step": 2.0, "sync_ms_per_step": 0.035}
    assert rows["ddtree.draft"]["syncs_per_step"] == 1.0
    assert rows["ddtree.draft"]["sync_ms_per_step"] == pytest.approx(0.005)
    assert rows["ddtree.verify_forward"]["syncs_per_step"] == 0.0
    assert rows["ddtree.draft"]["gpu_ms_per_step"] == pytest.approx(0.007)
    assert rows["ddtree.draft"]["launches_per_step"] == 1.0
    assert rows["ddtree.verify_forward"]["gpu_ms_per_step"] == pytest.approx(0.025)
    assert s["round_host_ms_per_step"] == 0.1
    # wall: the first to the last GPU event (10 .. 200 us)
    assert s["outside_round_host_ms_per_step"] == pytest.approx(0.19 - 0.1)


def test_no_ranges_no_round_figures():
    s = trace_summary.summarise({"traceEvents": [_r("kernel", "k", 0, 5)]}, steps=1)
    assert s["ranges"] == [] and s["round_host_ms_per_step"] is None
    assert s["outside_round_host_ms_per_step"] is None


def test_the_worker_ranges_in_a_real_trace(tmp_path):
    """stage_ranges under torch.profiler, read back by the summary (CPU: no GPU time)."""
    torch = pytest.importorskip("torch")
    from sglang_dflash.sglang_overlay.timing import stage_ranges

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            ranges = stage_ranges()
            with ranges("round"), ranges("draft"):
                torch.randn(32, 32).sum()
    plain = tmp_path / "t.json"
    prof.export_chrome_trace(str(plain))
    s = trace_summary.summarise(trace_summary.load(plain), steps=2)
    rows = {r["name"]: r for r in s["ranges"]}
    assert rows["ddtree.round"]["calls_per_step"] == 1.0
    assert rows["ddtree.draft"]["host_ms_per_step"] > 0
    assert s["outside_round_host_ms_per_step"] is not None


def test_real_torch_profiler_trace(tmp_path):
    """A chrome trace written by torch.profiler itself (CPU activity), gzip'd as SGLang's."""
    torch = pytest.importorskip("torch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            x = torch.randn(64, 64)
            (x @ x).argmax()
    plain = tmp_path / "t.json"
    prof.export_chrome_trace(str(plain))
    gz = tmp_path / "t.trace.json.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    s = trace_summary.summarise(trace_summary.load(gz), steps=3)
    names = {r["name"] for r in s["top_cpu_ops"]}
    assert {"aten::mm", "aten::argmax"} <= names or {"aten::matmul", "aten::argmax"} <= names
    assert s["wall_ms_per_step"] > 0 and s["gpu_busy_ms_per_step"] == 0.0


def test_trace_summary_cli_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "trace_summary.py"), str(bad),
                        "--steps", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad.json" in r.stderr


# ---- serve_pair against the stand-in ------------------------------------------------------


@pytest.fixture
def pair(tmp_path):
    """A pair directory as real_drafter.train leaves it (configs only: the stand-in loads
    nothing) with held-out prompts carrying both text and ids, as train writes them."""
    root = tmp_path / "pair"
    for sub in ("target", "draft"):
        (root / sub).mkdir(parents=True)
        (root / sub / "config.json").write_text("{}")
    lines = [json.dumps({"id": i, "text": f"p{i}", "input_ids": [3 + i, 7, 11 + i],
                         "max_new_tokens": 256}) for i in range(8)]
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (root / "report.json").write_text("{}")
    return root


def _run(pair: Path, out: Path, *modes: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, STANDIN_TOKEN_DELAY="0.0002",
               PYTHONPATH=os.pathsep.join([str(STANDIN), str(REPO / "src"),
                                           str(REPO / "benchmarks")]))
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [sys.executable, "-m", "real_drafter.serve_pair", "--pair", str(pair), "--out", str(out),
         "--site", f"{STANDIN}{os.pathsep}{REPO / 'src'}", "--port", str(_free_port()),
         "--requests-per-level", "1", "--greedy-prompts", "3", "--seeded-prompts", "2",
         "--profile-steps", "6", *modes],
        env=env, capture_output=True, text=True, timeout=600)


def test_serve_pair_every_step_kind(pair, tmp_path):
    out = tmp_path / "out"
    r = _run(pair, out, "none", "dflash", "ddtree:16", "adaptive:16", "seeded:ddtree:16",
             "profile:dflash")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert not res.get("errors"), res.get("errors")
    serve = res["serve"]
    assert [serve[m]["label"] for m in serve] == ["none", "dflash", "ddtree-16",
                                                  "ddtree-adaptive-16"]
    for m, rec in serve.items():
        assert rec["check_url"]["rc"] == 0, (m, rec["check_url"])
        assert len(rec["greedy"]) == 3 and len(rec["greedy"][0]["output"]) == 256
    # the adaptive server runs the adaptive policy (check --url expects it from the config)
    assert serve["adaptive:16"]["config"]["ddtree"] == {"budget": 16, "policy": "adaptive"}
    assert serve["ddtree:16"]["config"]["ddtree"] == {"budget": 16, "policy": "fixed"}
    assert "policy adaptive 1:0,3,7,16" in serve["adaptive:16"]["check_url"]["stdout"]
    # the stand-in is deterministic: every comparison must say identical
    assert res["compare"]["greedy"]["triton"]["identical"] is True
    assert res["compare"]["greedy_parallel"]["triton"]["identical"] is True
    rows = {(x["mode"], x["concurrency"]) for x in res["served"]}
    assert rows == {(m, c) for m in ("none", "dflash", "ddtree-16", "ddtree-adaptive-16")
                    for c in (1, 8, 32)}
    seeded = res["seeded"]["seeded:ddtree:16"]
    assert seeded["summary"]["all_identical"] is True and seeded["summary"]["prompts"] == 2
    row = seeded["rows"][1]  # what tie_margin needs to judge a seeded divergence
    assert row["params"] == {"temperature": 0.8, "top_p": 0.95, "sampling_seed": 1001}
    assert row["output"] == row["reference"] and len(row["output"]) == 256
    assert "--enable-deterministic-inference" in \
        json.loads((out / "config-seeded-ddtree-16-triton.json").read_text())["extraArgs"]
    levels = res["profile"]["profile:dflash"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 8]
    for lv in levels:
        assert lv["summary"]["kernels_per_step"] == 1.0  # the stand-in's one event per token
        assert lv["summary"]["steps"] == 6
    assert not list(out.glob("**/*.trace.json.gz"))  # traces reduced, then deleted


def test_serve_pair_bad_mode_one_line(pair, tmp_path):
    r = _run(pair, tmp_path / "o", "none", "ddtree:x")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "ddtree:x" in r.stderr


def test_serve_pair_refuses_a_mode_given_twice(pair, tmp_path):
    """Results are keyed by the mode, logs by its base and backend: a mode given twice would
    overwrite the first run's record and log, so it is refused before anything starts; so is
    one given once with and once without the default @backend (the same run)."""
    out = tmp_path / "o"
    r = _run(pair, out, "none", "profile:ddtree:15+pad@flashinfer",
             "profile:ddtree:15+pad@flashinfer")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "serve_pair: mode 'profile:ddtree:15+pad@flashinfer' given twice: each mode's " \
        "record and log are keyed by its name; run it again in its own --out" in r.stderr
    r = _run(pair, out, "ddtree:16", "dflash", "ddtree:16@triton")  # triton: the default
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "mode 'ddtree:16@triton' given twice (first as 'ddtree:16')" in r.stderr
    assert not out.exists()
    # another backend or another kind of step is another run: past the check (to the
    # missing pair, before any server)
    r = _run(tmp_path / "nothing", out, "ddtree:16", "ddtree:16@flashinfer",
             "seeded:ddtree:16", "profile:ddtree:16")
    assert r.returncode == 2 and "given twice" not in r.stderr
    assert "real_drafter.train" in r.stderr


def test_serve_pair_missing_pair(tmp_path):
    r = _run(tmp_path / "nothing", tmp_path / "o", "none")
    assert r.returncode == 2 and "real_drafter.train" in r.stderr


def test_modifiers_parse_label_and_render():
    import real_drafter.serve_pair as sp

    assert sp.split_modifiers("none+no-overlap") == ("none", ("no-overlap",))
    assert sp.parse_mode("ddtree:16+no-overlap") == ("ddtree", 16, False)
    assert sp.mode_label("none+no-overlap") == "none+no-overlap"
    assert sp.mode_label("adaptive:16+no-overlap") == "ddtree-adaptive-16+no-overlap"
    assert sp.file_name("profile:none+no-overlap") == "profile-none-no-overlap"
    with_flag = sp.pair_config(Path("/p"), "n", "none+no-overlap", "triton")["extraArgs"]
    without = sp.pair_config(Path("/p"), "n", "none", "triton")["extraArgs"]
    assert with_flag == [*without, "--disable-overlap-schedule"]
    with pytest.raises(ValueError, match=r"\+fast"):
        sp.parse_mode("none+fast")


def test_steps_modifier_sets_the_no_draft_step_count():
    import real_drafter.serve_pair as sp

    from sglang_dflash.sglang_overlay import settings

    assert sp.parse_mode("adaptive:16+k16") == ("ddtree", 16, True)
    assert sp.mode_label("adaptive:16+k16") == "ddtree-adaptive-16+k16"
    assert sp.file_name("profile:adaptive:16+k16") == "profile-adaptive-16-k16"
    cfg = sp.pair_config(Path("/p"), "n", "adaptive:16+k16", "flashinfer")
    assert cfg["environment"] == {settings.NODRAFT_STEPS_ENV: "16"}
    plain = sp.pair_config(Path("/p"), "n", "adaptive:16", "flashinfer")
    assert "environment" not in plain and cfg["extraArgs"] == plain["extraArgs"]
    both = sp.pair_config(Path("/p"), "n", "ddtree:8+no-overlap+k4", "triton")
    assert both["environment"] == {settings.NODRAFT_STEPS_ENV: "4"}
    assert "--disable-overlap-schedule" in both["extraArgs"]
    with pytest.raises(ValueError, match="needs a DDTree mode"):
        sp.parse_mode("none+k16")
    with pytest.raises(ValueError, match=r"outside 1\.\.64"):
        sp.parse_mode("adaptive:16+k0")


def test_tree_modifier_runs_the_policy_on_the_budget_alone():
    import real_drafter.serve_pair as sp

    from sglang_dflash.sglang_overlay.policy import parse_policy

    assert sp.mode_label("adaptive:64+tree") == "ddtree-adaptive-64+tree"
    cfg = sp.pair_config(Path("/p"), "n", "adaptive:64+tree", "flashinfer")
    assert cfg["ddtree"] == {"budget": 64, "policy": "adaptive:1:64"}
    spec = parse_policy(cfg["ddtree"]["policy"], 64, "ddtree.policy")
    assert spec.adaptive and spec.schedule.candidates(1) == spec.schedule.candidates(32) == (64,)
    assert sp.pair_config(Path("/p"), "n", "adaptive:64", "flashinfer")["ddtree"]["policy"] \
        == "adaptive"
    with pytest.raises(ValueError, match="needs an adaptive mode"):
        sp.parse_mode("ddtree:64+tree")


def test_bound_and_sync_modifiers_set_the_host_lengths_switch():
    import real_drafter.serve_pair as sp

    from sglang_dflash.sglang_overlay import settings

    assert sp.mode_label("adaptive:64+tree+bound") == "ddtree-adaptive-64+tree+bound"
    cfg = sp.pair_config(Path("/p"), "n", "ddtree:15+bound", "flashinfer")
    assert cfg["environment"] == {settings.HOST_LENS_ENV: "bound"}
    both = sp.pair_config(Path("/p"), "n", "adaptive:16+k16+bound", "flashinfer")
    assert both["environment"] == {settings.NODRAFT_STEPS_ENV: "16",
                                   settings.HOST_LENS_ENV: "bound"}
    assert sp.pair_config(Path("/p"), "n", "ddtree:15+sync", "flashinfer")["environment"] \
        == {settings.HOST_LENS_ENV: "sync"}
    for bad in ("dflash+bound", "none+sync"):
        with pytest.raises(ValueError, match="needs a DDTree mode"):
            sp.parse_mode(bad)


def test_split_modifier_sets_the_split_verify_on_flashinfer_only(tmp_path):
    import real_drafter.serve_pair as sp

    from sglang_dflash.sglang_overlay import settings

    assert sp.mode_label("ddtree:15+split") == "ddtree-15+split"
    cfg = sp.pair_config(Path("/p"), "n", "ddtree:15+split", "flashinfer")
    assert cfg["environment"] == {settings.SPLIT_VERIFY_ENV: "1"}
    # what the worker reads from that environment: the split verify on
    assert settings.split_verify_from_env(cfg["environment"]) is True
    assert sp.file_name("seeded:ddtree:16+split") == "seeded-ddtree-16-split"
    with pytest.raises(ValueError, match="needs a DDTree mode"):
        sp.parse_mode("dflash+split")
    # with Triton the worker refuses it at start: serve_pair says so before any server starts
    (tmp_path / "pair").mkdir()
    r = subprocess.run([sys.executable, "-m", "real_drafter.serve_pair", "--pair",
                        str(tmp_path / "pair"), "--out", str(tmp_path / "o"), "--site", "x",
                        "ddtree:15+split@flashinfer", "ddtree:15+split"],
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           [str(REPO / "src"), str(REPO / "benchmarks")])),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "ddtree:15+split: +split splits FlashInfer's verify attention; add @flashinfer" \
        in r.stderr
    assert not (tmp_path / "o").exists()


def test_pad_modifier_runs_the_bound_with_the_drafter_on_triton():
    import real_drafter.serve_pair as sp

    from sglang_dflash.config import parse_config
    from sglang_dflash.sglang_overlay import settings

    cfg = sp.pair_config(Path("/p"), "n", "ddtree:15+pad", "flashinfer")
    assert cfg["environment"] == {settings.HOST_LENS_ENV: "bound"}
    assert cfg["attentionBackend"] == "flashinfer" and cfg["draftAttentionBackend"] == "triton"
    assert sp.mode_label("adaptive:16+pad") == "ddtree-adaptive-16+pad"
    # the instance config this renders passes the launcher's rule (the padded verify)
    env = dict(parse_config(cfg | {"model": "/p/target"}).environment)
    assert env[settings.HOST_LENS_ENV] == "bound"
    plain = sp.pair_config(Path("/p"), "n", "ddtree:15", "flashinfer")
    assert plain["draftAttentionBackend"] == "flashinfer" and "environment" not in plain
    with pytest.raises(ValueError, match="needs a DDTree mode"):
        sp.parse_mode("dflash+pad")


def test_draft_triton_modifier_moves_only_the_drafter():
    import real_drafter.serve_pair as sp

    cfg = sp.pair_config(Path("/p"), "n", "dflash+draft-triton", "flashinfer")
    assert cfg["attentionBackend"] == "flashinfer" and cfg["draftAttentionBackend"] == "triton"
    assert "environment" not in cfg  # no host-lengths switch: only the drafter moves
    assert sp.mode_label("dflash+draft-triton") == "dflash+draft-triton"
    assert sp.file_name("profile:dflash+draft-triton") == "profile-dflash-draft-triton"
    tree = sp.pair_config(Path("/p"), "n", "ddtree:15+draft-triton", "flashinfer")
    assert tree["draftAttentionBackend"] == "triton" and "environment" not in tree
    with pytest.raises(ValueError, match="needs a speculative mode"):
        sp.parse_mode("none+draft-triton")


def test_profile_with_a_step_count_starts_its_server_with_it(pair, tmp_path):
    from sglang_dflash.sglang_overlay import settings

    out = tmp_path / "out"
    r = _run(pair, out, "profile:adaptive:16+k16")
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((out / "results.json").read_text())["profile"]["profile:adaptive:16+k16"]
    assert rec["label"] == "ddtree-adaptive-16+k16" and rec["ready_seconds"]
    cfg = json.loads((out / "config-profile-adaptive-16-k16-triton.json").read_text())
    assert cfg["environment"] == {settings.NODRAFT_STEPS_ENV: "16"}


def test_serve_pair_unknown_modifier_one_line(pair, tmp_path):
    r = _run(pair, tmp_path / "o", "profile:none+fast")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "+no-overlap" in r.stderr


def test_profile_of_a_modified_mode_names_its_files_plainly(pair, tmp_path):
    out = tmp_path / "out"
    r = _run(pair, out, "profile:none+no-overlap")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    rec = res["profile"]["profile:none+no-overlap"]
    assert rec["label"] == "none+no-overlap"
    cfg = json.loads((out / "config-profile-none-no-overlap-triton.json").read_text())
    assert "--disable-overlap-schedule" in cfg["extraArgs"]
    assert all("+" not in p.name for p in out.rglob("*"))


def test_dummy_pair_of_the_grid_shape(tmp_path):
    import adaptive_grid
    import real_drafter.serve_pair as sp

    sp.write_dummy_pair(tmp_path, shape="4b")
    target = json.loads((tmp_path / "target" / "config.json").read_text())
    assert target == adaptive_grid.shape_configs("4b")[0]
    assert target != adaptive_grid.shape_configs("8b")[0]
    assert len((tmp_path / "prompts.jsonl").read_text().splitlines()) == 64


def test_profile_levels_option(pair, tmp_path):
    out = tmp_path / "out"
    r = _run(pair, out, "--profile-levels", "2", "profile:ddtree:16")
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((out / "results.json").read_text())["profile"]["profile:ddtree:16"]
    assert [lv["concurrency"] for lv in rec["levels"]] == [2]
    assert [t["concurrency"] for t in rec["timed"]] == [2]
    bad = _run(pair, tmp_path / "o2", "--profile-levels", "0,x", "profile:none")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0


def test_median_run_is_the_figure_not_the_stall():
    import real_drafter.serve_pair as sp

    runs = [{"wall_s": 11.9, "n": "stall"}, {"wall_s": 1.9, "n": "a"}, {"wall_s": 2.0, "n": "b"}]
    assert sp.median_run(runs)["n"] == "b"
    assert sp.median_run(runs[:2])["n"] == "a"  # even count: the lower middle
    assert sp.median_run(runs[:1])["n"] == "stall"


def test_timed_only_with_repeats(pair, tmp_path):
    out = tmp_path / "out"
    r = _run(pair, out, "--profile-levels", "1,2", "--profile-steps", "0",
             "--timed-repeats", "3", "profile:ddtree:16")
    assert r.returncode == 0, r.stderr[-2000:]
    rec = json.loads((out / "results.json").read_text())["profile"]["profile:ddtree:16"]
    assert rec["levels"] == []  # no profiler run, no trace
    assert [len(runs) for runs in rec["timed_runs"]] == [3, 3]
    assert [[x["concurrency"] for x in runs] for runs in rec["timed_runs"]] == [[1] * 3, [2] * 3]
    for med, runs in zip(rec["timed"], rec["timed_runs"], strict=True):
        assert med in runs and med["output_tokens"] > 0
    assert not list(out.rglob("*.trace.json*"))
    bad = _run(pair, tmp_path / "o2", "--timed-repeats", "0", "profile:none")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0


def test_skip_done_leaves_out_what_an_earlier_call_finished(pair, tmp_path):
    first = tmp_path / "first" / "results.json"
    first.parent.mkdir()
    first.write_text(json.dumps({
        "serve": {"none": {"label": "none", "ready_seconds": 31.0,
                           "bench": [{"concurrency": 1, "tok_s": 600.0}]},
                  "dflash": {"label": "dflash", "ready_seconds": 30.0,  # a level cut off
                             "bench": [{"concurrency": 1, "tok_s": 300.0},
                                       {"concurrency": 8, "skipped": "time budget: 40s left"}]},
                  "ddtree:8": {"skipped": "time budget: 3s left"},
                  "ddtree:32": {"label": "ddtree-32", "ready_seconds": 38.1},
                  "ddtree:64": {"label": "ddtree-64", "ready_seconds": None}},  # never ready
        "seeded": {"seeded:dflash": {"rows": [{"identical": True}]},
                   "seeded:ddtree:16": {"error": "the seeded no-speculation server gave no "
                                                  "outputs"}},
        "errors": {"ddtree:32": "boom"}}))
    out = tmp_path / "out"
    r = _run(pair, out, "--skip-done", str(first), "--skip-done", str(tmp_path / "never.json"),
             "none", "dflash", "ddtree:8", "ddtree:32", "ddtree:64", "seeded:dflash",
             "seeded:ddtree:16")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "done earlier, not run: none seeded:dflash" in r.stdout
    res = json.loads((out / "results.json").read_text())
    assert list(res["serve"]) == ["dflash", "ddtree:8", "ddtree:32", "ddtree:64"]
    assert list(res["seeded"]) == ["seeded:ddtree:16"]


def test_step_min_s_skips_what_the_budget_cannot_start(pair, tmp_path):
    """--step-min-s is the budget a mode needs to start: under the default (100 s) a 90 s
    budget still starts a mode when the option says 30, and starts none when it says 95; a
    negative value is one line and exit 2."""
    for need, runs in (("30", True), ("95", False)):
        out = tmp_path / f"out{need}"
        r = _run(pair, out, "--time-budget-s", "90", "--step-min-s", need, "none")
        assert r.returncode == 0, r.stderr[-2000:]
        rec = json.loads((out / "results.json").read_text())["serve"]["none"]
        assert bool(rec.get("ready_seconds")) is runs, rec
        assert ("skipped" in rec) is not runs
    bad = _run(pair, tmp_path / "o2", "--step-min-s", "-1", "none")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--step-min-s" in bad.stderr


def test_a_seeded_mode_needs_the_step_budget_for_each_of_its_two_servers(pair, tmp_path):
    """§34: a seeded mode started with one step's budget left was stopped half-started by the
    call's limit. With 90 s and 50 s a step, the seeded mode (2 servers) is skipped, saying
    why, and the plain mode after it still runs."""
    out = tmp_path / "out"
    r = _run(pair, out, "--time-budget-s", "90", "--step-min-s", "50", "seeded:ddtree:16",
             "none")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    skipped = res["seeded"]["seeded:ddtree:16"]["skipped"]
    assert skipped.startswith("time budget:") and skipped.endswith("100s needed"), skipped
    assert res["serve"]["none"]["ready_seconds"]


def test_skip_done_broken_file_one_line(pair, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = _run(pair, tmp_path / "o", "--skip-done", str(bad), "none")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad.json" in r.stderr


def test_worker_lines_keep_how_the_rounds_planned(tmp_path):
    """§30: the server logs said `host lengths: bound` on FlashInfer; results.json keeps it.
    The lines are copied from that lease's server log (raw at c0d1031)."""
    import real_drafter.serve_pair as sp

    lines = [
        "[2026-12-05 23:58:19] DDTree drafter: sync-free FlashInfer plan on 20 graph wrapper(s).",
        "[2026-12-05 23:58:19] DDTree verify at width 65: sync-free FlashInfer plan on 20 graph "
        "wrapper(s).",
        "[2026-12-05 23:58:19] DDTree host lengths: bound (SGLang does not copy each round's "
        "lengths to the host; every plan reads the reserved bound).",
        "[2026-12-05 23:58:20] Capture cuda graph end. Time elapsed: 3.21 s",
    ]
    log = tmp_path / "serve-x.log"
    log.write_text("\n".join(lines + lines[2:3]) + "\n")  # a second rank repeats one
    assert sp.server_log_fields(log)["worker"] == [
        "DDTree drafter: sync-free FlashInfer plan on 20 graph wrapper(s).",
        "DDTree verify at width 65: sync-free FlashInfer plan on 20 graph wrapper(s).",
        "DDTree host lengths: bound (SGLang does not copy each round's lengths to the host; "
        "every plan reads the reserved bound).",
    ]
    assert sp.server_log_fields(tmp_path / "absent.log") == {"policy": [], "worker": []}


def test_freeze_gc_reaches_every_bench_level(pair, tmp_path):
    """--freeze-gc: each level's bench freezes the server's collector after its warm-up (the
    stand-in runs a real gc.freeze() and logs it as SGLang does); off by default."""
    out = tmp_path / "out"
    r = _run(pair, out, "--freeze-gc", "none")
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["freeze_gc"] is True
    for c in (1, 8, 32):
        assert "--freeze-gc" in json.loads((out / f"bench-none-triton-c{c}.json").read_text())[
            "argv"]
    log = (out / "serve-none-triton.log").read_text()
    # once by serve when the server is ready (freezeGc, on by default), once per level
    assert log.count("froze SGLang's garbage collectors after its warm-up") == 1
    assert log.count("Freezing GC in Scheduler process") == 1 + 3
    plain = tmp_path / "plain"
    r = _run(pair, plain, "none")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((plain / "results.json").read_text())["freeze_gc"] is False
    # serve's own freeze at readiness only; no bench level asked for one
    assert (plain / "serve-none-triton.log").read_text().count("Freezing GC") == 1


def test_a_seeded_mode_without_rows_is_not_called_different():
    """A speculative server stopped before it answered (§33: the budget ran out while it
    captured graphs) has no verdict: None, not False."""
    from real_drafter.serve_pair import seeded_summary

    base = {"outputs": [[1, 2], [3, 4]], "greedy": [[1, 2], [3, 5]]}
    empty = seeded_summary([], base)
    assert empty["all_identical"] is None and empty["prompts"] == 0
    assert empty["accept_length_mean"] is None and empty["sampled"] is True
    rows = [{"identical": True, "accept_length": 2.0}, {"identical": False, "accept_length": 1.0}]
    got = seeded_summary(rows, base)
    assert got["all_identical"] is False and got["prompts"] == 2
    assert got["accept_length_mean"] == 1.5
    assert seeded_summary(rows[:1], base)["all_identical"] is True
