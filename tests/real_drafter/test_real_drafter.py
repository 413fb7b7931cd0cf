"""The real-drafter pipeline at toy size on the CPU: the same code as the H200 run.

One toy run (module fixture) of ``benchmarks/real_drafter/train.py --toy`` on a slice of the
stdlib, then: the target loads with transformers, the tokenizer round-trips the prompts, SGLang
0.5.17's own DFLASH code accepts the draft config and maps every checkpoint tensor, the
training-side drafter equals a per-anchor reference written from SGLang's dflash.py, the feature
tap equals HF's hidden states, the offline accept lengths obey the tree's invariants, and the
same command in another process writes the same bytes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/ has no __init__.py

from real_drafter import evaluate, train  # noqa: E402
from real_drafter.config import DraftSize, TargetSize, toy_plan  # noqa: E402
from real_drafter.drafter import DFlashDrafter, draft_logits  # noqa: E402
from real_drafter.generate import target_features  # noqa: E402

VENV_ENV = "SGLANG_DFLASH_SGLANG_SITE"
DEFAULT_VENV = Path.home() / ".cache/sglang-dflash/venv-sglang-cpu"


def _stdlib_corpus(root: Path) -> Path:
    """The toy corpus: the first 60 sorted ``*.py`` files of this Python's stdlib."""
    std = Path(sysconfig.get_paths()["stdlib"])
    picked = sorted(p for p in std.glob("*.py"))[:60]
    for p in picked:
        (root / p.name).write_bytes(p.read_bytes())
    return root


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = _stdlib_corpus(tmp_path_factory.mktemp("corpus"))
    out = tmp_path_factory.mktemp("run")
    rep = train.run(train._parse(["--out", str(out), "--device", "cpu", "--toy",
                                  "--corpus-root", str(root), "--seed", "0"]))
    return out, rep


def test_files_and_report(toy):
    out, rep = toy
    for f in ["target/config.json", "target/model.safetensors", "target/tokenizer.json",
              "target/tokenizer_config.json", "target/generation_config.json",
              "draft/config.json", "draft/model.safetensors", "prompts.jsonl", "report.json"]:
        assert (out / f).is_file(), f
    assert json.loads(json.dumps(rep)) == json.loads((out / "report.json").read_text())
    assert rep["offline_accept_length_dflash"] >= 1.0
    # every phase ran its planned steps, torch warned of no non-deterministic op, and the
    # settings in force (read back, not the intent) leave torch no non-deterministic choice
    assert rep["reproducible"] is True
    assert rep["stopped_early_phases"] == [] and rep["nondeterministic_ops"] == []
    assert rep["settings_not_deterministic"] == []
    det = rep["determinism"]
    assert det["use_deterministic_algorithms"] == "strict"
    assert det["cublas_workspace_config"] in (":4096:8", ":16:8")
    assert det["sdpa_cudnn_selectable"] is False
    assert det["cudnn_deterministic"] is True and det["cudnn_benchmark"] is False
    assert det["train_sdpa_backends"] == ["MATH"]
    assert "CUBLAS_WORKSPACE_CONFIG" in rep["reproducible_definition"]
    assert rep["target_train"]["steps"] == rep["plan"]["target_steps"]
    assert set(rep["offline_accept_length_ddtree"]) == {"8", "16", "32", "64"}
    assert all(v >= 1.0 for v in rep["offline_accept_length_ddtree"].values())
    for m in rep["modes"].values():
        assert sum(m["accepted_drafts_histogram"]) == m["rounds"] > 0
        assert m["committed"] == sum((i + 1) * c
                                     for i, c in enumerate(m["accepted_drafts_histogram"]))
    assert rep["corpus"]["files"] == 60 and len(rep["corpus"]["sha256"]) == 64


def _file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` but the report (it holds wall times)."""
    from real_drafter.checkpoint import sha256_file

    return {p.relative_to(root).as_posix(): sha256_file(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "report.json"}


def test_toy_run_is_bitwise_reproducible_in_another_process(toy, tmp_path):
    """The same command in a fresh process (another hash seed, so no set/dict order of str
    can hide in it) writes the same bytes: every checkpoint, config, tokenizer and prompt file,
    and the report's own sha256."""
    out, rep = toy
    env = {**os.environ, "PYTHONHASHSEED": "12345",
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "benchmarks")])}
    again = tmp_path / "again"
    res = subprocess.run([sys.executable, "-m", "real_drafter.train", "--out", str(again),
                          "--device", "cpu", "--toy", "--corpus-root", rep["corpus"]["root"],
                          "--seed", "0"], capture_output=True, text=True, timeout=600, env=env,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    rep2 = json.loads((again / "report.json").read_text())
    assert rep2["sha256"] == rep["sha256"]
    assert _file_hashes(again) == _file_hashes(out)
    assert rep2["offline_accept_length_dflash"] == rep["offline_accept_length_dflash"]
    assert rep2["reproducible"] is True


def test_toy_run_trains_on_math_sdpa_and_reports_a_nondeterminism_warning(
        tmp_path, monkeypatch):
    """train.run's wiring: both training phases run inside deterministic_attention; every
    phase after the target (generation, features, drafter, evaluation) runs in torch's strict
    deterministic mode, in which torch never selects cuDNN attention (warn_only let the
    forward-only phases run it); a warning that mentions "deterministic" during the run lands
    in nondeterministic_ops and makes the run not reproducible although no phase was cut; the
    process-wide flags are restored afterwards."""
    from real_drafter import generate, target, train_drafter

    seen = {}
    strict = {}
    flags_before = (torch.are_deterministic_algorithms_enabled(),
                    torch.is_deterministic_algorithms_warn_only_enabled())

    def strict_spy(name, fn):
        def wrapped(*a, **k):
            strict.setdefault(name, set()).add(
                torch.are_deterministic_algorithms_enabled()
                and not torch.is_deterministic_algorithms_warn_only_enabled())
            return fn(*a, **k)
        return wrapped

    def spy(name, fn, warn=None):
        fn = strict_spy(name, fn)

        def wrapped(*a, **k):
            b = torch.backends.cuda
            seen[name] = (b.math_sdp_enabled(), b.flash_sdp_enabled(),
                          b.mem_efficient_sdp_enabled(), b.cudnn_sdp_enabled())
            if warn:
                import warnings

                warnings.warn(warn, UserWarning, stacklevel=1)
            return fn(*a, **k)
        return wrapped

    flash = ("Flash Attention defaults to a non-deterministic algorithm. To explicitly enable "
             "determinism call torch.use_deterministic_algorithms(True, warn_only=False).")
    monkeypatch.setattr(target, "train_target", spy("target", target.train_target))
    monkeypatch.setattr(train_drafter, "train_drafter",
                        spy("drafter", train_drafter.train_drafter, flash))
    monkeypatch.setattr(generate, "greedy_continue",
                        strict_spy("greedy", generate.greedy_continue))
    monkeypatch.setattr(generate, "target_features",
                        strict_spy("features", generate.target_features))
    (tmp_path / "corpus").mkdir()
    corpus_root = _stdlib_corpus(tmp_path / "corpus")
    out = tmp_path / "run"
    rep = train.run(train._parse(["--out", str(out), "--device", "cpu", "--toy",
                                  "--corpus-root", str(corpus_root), "--seed", "0"]))
    assert seen == {"target": (True, False, False, False), "drafter": (True, False, False, False)}
    assert torch.backends.cuda.flash_sdp_enabled()  # restored after training
    # generation and features run twice (drafter data, evaluation); every call strict
    assert strict == {"target": {True}, "drafter": {True}, "greedy": {True}, "features": {True}}
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled()) == flags_before
    assert rep["nondeterministic_ops"] == [flash]
    assert rep["stopped_early_phases"] == []
    assert rep["reproducible"] is False
    assert json.loads((out / "report.json").read_text())["reproducible"] is False


def test_target_and_tokenizer_load_with_transformers(toy):
    from transformers import AutoConfig, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    out, rep = toy
    cfg = AutoConfig.from_pretrained(out / "target")
    assert isinstance(cfg, Qwen3Config) and cfg.architectures == ["Qwen3ForCausalLM"]
    assert cfg.head_dim in (32, 64, 128) and cfg.tie_word_embeddings
    model = Qwen3ForCausalLM.from_pretrained(out / "target")
    assert model.config.vocab_size == toy_plan().target.vocab
    tok = AutoTokenizer.from_pretrained(out / "target")
    assert tok.convert_tokens_to_ids("<|MASK|>") == rep["mask_token_id"]
    assert tok.eos_token_id == rep["eos_token_id"]
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == toy_plan().eval_prompts
    for p in prompts:  # what a server tokenizing the text sees
        assert tok(p["text"])["input_ids"] == p["input_ids"]


def _venv_python() -> Path | None:
    venv = Path(os.environ.get(VENV_ENV, "").strip() or DEFAULT_VENV)
    py = venv / "bin" / "python"
    return py if py.is_file() else None


def test_sglang_accepts_draft_checkpoint(toy):
    py = _venv_python()
    if py is None:
        pytest.skip(f"no SGLang CPU venv ({VENV_ENV} or {DEFAULT_VENV}); "
                    "tests/overlay/install_sglang_cpu.sh builds it")
    out, rep = toy
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(py), str(Path(__file__).with_name("sglang_draft_probe.py")),
                          str(out / "draft"), str(out / "target")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    plan = toy_plan()
    assert got["block_size"] == 16 and got["mask_token"] == "<|MASK|>"
    assert got["mask_token_id"] == rep["mask_token_id"]
    assert got["target_layer_ids"] == list(plan.draft.target_layer_ids)
    assert got["num_hidden_layers"] == plan.draft.layers
    assert got["encoder_only"]  # non-causal block attention, as trained
    # every SGLang parameter loaded, fused ones from all their shards, nothing ignored
    assert sorted(got["loaded"]) == got["sglang_params"]
    for name, shards in got["loaded"].items():
        if "qkv_proj" in name:
            assert shards == ["k", "q", "v"], name
        elif "gate_up_proj" in name:
            assert shards == ["0", "1"], name
        else:
            assert shards == ["None"], name
    assert got["all_nonzero"]
    n_ckpt = len(got["checkpoint_keys"])
    n_loaded = sum(len(s) for s in got["loaded"].values())
    assert n_ckpt == n_loaded


def _rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _rope_ref(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    f = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat([f.cos(), f.cos()], -1), torch.cat([f.sin(), f.sin()], -1)
    rot = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)  # rotate_half (neox)
    return x * cos[:, None] + rot * sin[:, None]


def _reference_block(dr: DFlashDrafter, embed_w, feats, tokens, s, mask_id):
    """One anchor, written from SGLang's dflash.py / dflash_worker_v2.py step by step:
    ctx = hidden_norm(fc(target_hidden[:S])); per layer K/V of ctx without input layernorm;
    block [tokens[S], MASK...] at S..; fused add+RMSNorm residual; softmax over ctx + block."""
    t, d = dr.t, dr.d
    ctx = _rms(feats[:s] @ dr.fc.weight.t(), dr.hidden_norm.weight, t.rms_eps)
    ids = torch.tensor([int(tokens[s])] + [mask_id] * (d.block_size - 1))
    x = embed_w[ids]
    pos_b = torch.arange(s, s + d.block_size)
    pos_c = torch.arange(s)
    residual = None
    for layer in dr.layers:
        a = layer.self_attn
        if residual is None:
            residual, h = x, _rms(x, layer.input_layernorm.weight, t.rms_eps)
        else:
            residual = x + residual
            h = _rms(residual, layer.input_layernorm.weight, t.rms_eps)

        def heads(z, n):
            return z.view(z.shape[0], n, t.head_dim)

        q = _rms(heads(h @ a.q_proj.weight.t(), t.heads), a.q_norm.weight, t.rms_eps)
        k = _rms(heads(h @ a.k_proj.weight.t(), t.kv_heads), a.k_norm.weight, t.rms_eps)
        v = heads(h @ a.v_proj.weight.t(), t.kv_heads)
        kc = _rms(heads(ctx @ a.k_proj.weight.t(), t.kv_heads), a.k_norm.weight, t.rms_eps)
        vc = heads(ctx @ a.v_proj.weight.t(), t.kv_heads)
        q, k, kc = (_rope_ref(q, pos_b, t.rope_theta), _rope_ref(k, pos_b, t.rope_theta),
                    _rope_ref(kc, pos_c, t.rope_theta))
        kk, vv = torch.cat([kc, k]), torch.cat([vc, v])
        g = t.heads // t.kv_heads
        outs = []
        for hh in range(t.heads):
            sc = (q[:, hh] @ kk[:, hh // g].t()) / math.sqrt(t.head_dim)
            outs.append(torch.softmax(sc, -1) @ vv[:, hh // g])
        attn = torch.cat(outs, -1) @ a.o_proj.weight.t()
        residual = attn + residual
        h = _rms(residual, layer.post_attention_layernorm.weight, t.rms_eps)
        m = layer.mlp
        x = (torch.nn.functional.silu(h @ m.gate_proj.weight.t()) * (h @ m.up_proj.weight.t())
             ) @ m.down_proj.weight.t()
    out = _rms(x + residual, dr.norm.weight, t.rms_eps)
    return out[1:] @ embed_w.t()


def test_drafter_matches_per_anchor_reference():
    torch.manual_seed(0)
    t = TargetSize(layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96,
                   vocab=50)
    d = DraftSize(layers=2, intermediate=96, target_layer_ids=(0, 2), block_size=16)
    dr = DFlashDrafter(t, d)
    for p in dr.parameters():  # non-trivial norms too
        p.data.add_(0.1 * torch.randn_like(p))
    embed_w = torch.randn(t.vocab, t.hidden)
    b, tt = 2, 48
    feats = torch.randn(b, tt, 2 * t.hidden)
    tokens = torch.randint(3, t.vocab, (b, tt))
    anchors = torch.tensor([[5, 20, 31], [1, 12, 32]])
    with torch.no_grad():
        kv = dr.context_kv(feats, torch.arange(tt).expand(b, tt))
        got = draft_logits(dr, embed_w, kv, tokens, anchors, mask_id=1)
        for i in range(b):
            for j in range(anchors.shape[1]):
                ref = _reference_block(dr, embed_w, feats[i], tokens[i], int(anchors[i, j]), 1)
                torch.testing.assert_close(got[i, j], ref, rtol=1e-4, atol=1e-4)
    # the context after S must not matter (SGLang's draft KV holds only committed tokens)
    feats2 = feats.clone()
    feats2[0, 6:] = torch.randn_like(feats2[0, 6:])
    with torch.no_grad():
        kv2 = dr.context_kv(feats2, torch.arange(tt).expand(b, tt))
        got2 = draft_logits(dr, embed_w, kv2, tokens, anchors, mask_id=1)
    torch.testing.assert_close(got2[0, 0], got[0, 0])
    assert not torch.allclose(got2[0, 1], got[0, 1])


def test_feature_tap_is_hf_residual_stream_after_layer():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    m = Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        hs = m(input_ids=ids, output_hidden_states=True).hidden_states
        got = target_features(m, ids, (0, 2), batch=1)
    # hidden_states[k+1] = output of layer k (layer 2 < the last, so before the final norm)
    torch.testing.assert_close(got, torch.cat([hs[1], hs[3]], -1))


def _peaked(n, depth, vocab, y, hit, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, depth, vocab, generator=g)
    for b in range(n):
        for k in range(depth):
            if torch.rand((), generator=g) < hit:
                logits[b, k, y[b, k + 1]] += 4.0
    return logits


def test_tree_accept_invariants_on_shared_distributions():
    torch.manual_seed(1)
    n, depth, vocab = 24, 15, 30
    y = torch.randint(0, vocab, (n, depth + 2))
    logits = _peaked(n, depth, vocab, y, hit=0.8, seed=3)
    seq = torch.full((n,), 7)
    lin = evaluate.linear_accept(logits, y[:, 1 : depth + 1])
    trees = {nb: evaluate.tree_accept(logits, y[:, 0], seq, y[:, : depth + 1], nb)
             for nb in (8, 16, 32, 64, 128)}
    for a, b in [(8, 16), (16, 32), (32, 64), (64, 128)]:
        assert (trees[a] <= trees[b]).all()  # budget-N tree = first N pops of budget-2N
    # DDTree >= linear on every round whose tree holds the argmax chain down to linear's
    # accepted depth (the chain = the rank-0 child at every depth)
    from sglang_dflash.ddtree.topk import topk_logprobs
    from sglang_dflash.ddtree.tree import build_tree

    checked = 0
    for nb in (16, 64, 128):
        lp, ids = topk_logprobs(logits.reshape(n * depth, vocab), nb if nb < vocab else vocab)
        tree = build_tree(lp.view(n, depth, -1), ids.view(n, depth, -1), y[:, 0], seq, nb)
        for b in range(n):
            node, ok = 0, True
            for _ in range(int(lin[b])):
                kids = [i for i in range(tree.width) if int(tree.parents[b, i]) == node
                        and int(tree.ranks[b, i]) == 0 and bool(tree.valid[b, i])]
                if not kids:
                    ok = False
                    break
                node = kids[0]
            if ok:
                checked += int(lin[b]) > 0
                assert int(trees[nb][b]) >= int(lin[b]), (nb, b)
    assert checked > 0
    assert int(lin.max()) >= 1  # the planted hits are accepted sometimes


def test_toy_eval_accepts_at_least_one_token_per_round(toy):
    _, rep = toy
    for m in rep["modes"].values():
        assert m["accept_length"] >= 1.0
        assert m["rounds_per_request"] and min(m["rounds_per_request"]) >= 1


def test_the_full_plan_fits_issue_15s_eight_minutes():
    """Issue 15: training takes at most 8 minutes of GPU time in all. The phases' wall-clock
    caps add up to that, so a slower machine (or the math attention backend, not yet timed on
    a GPU) cuts a phase and reports "reproducible": false rather than overrunning."""
    from real_drafter.config import full_plan

    p = full_plan()
    assert p.target_cap_s + p.gen_cap_s + p.draft_cap_s + p.eval_cap_s <= 8 * 60


def test_budget_scales_the_caps_both_ways_and_never_the_steps():
    from real_drafter.config import full_plan

    plan = full_plan()
    caps = ("target_cap_s", "gen_cap_s", "draft_cap_s", "eval_cap_s")
    total = sum(getattr(plan, c) for c in caps)
    for factor in (0.5, 1.5):  # a short lease, and a shared or slower GPU
        scaled = train._scaled(plan, factor * total / 0.85)
        for c in caps:
            assert math.isclose(getattr(scaled, c), factor * getattr(plan, c))
        assert (scaled.target_steps, scaled.draft_steps) == (plan.target_steps, plan.draft_steps)
    assert train._scaled(plan, None) is plan
    with pytest.raises(SystemExit, match="--budget-s 0"):
        train._scaled(plan, 0)


def test_dummy_pair_of_the_pair_shape_is_what_train_writes(tmp_path):
    """serve_pair --dummy --shape pair: the configs real_drafter.train writes at full size (the
    kernels a lease compiles while the pair trains), checked against the H100 lease's report."""
    import real_drafter.serve_pair as sp
    from real_drafter import checkpoint
    from real_drafter.config import full_plan

    sp.write_dummy_pair(tmp_path, shape="pair")
    target = json.loads((tmp_path / "target" / "config.json").read_text())
    draft = json.loads((tmp_path / "draft" / "config.json").read_text())
    summary = json.loads((REPO / "docs/gpu-runs/2026-12-06-h100-g/call7-prof-train.json")
                         .read_text())
    trained = summary["files"]["call7-prof-train/report.json"]["plan"]["target"]
    assert {k: target[f] for k, f in (("layers", "num_hidden_layers"), ("hidden", "hidden_size"),
                                      ("heads", "num_attention_heads"), ("vocab", "vocab_size"),
                                      ("kv_heads", "num_key_value_heads"),
                                      ("head_dim", "head_dim"))} == \
        {k: trained[k] for k in ("layers", "hidden", "heads", "vocab", "kv_heads", "head_dim")}
    assert target["architectures"] == ["Qwen3ForCausalLM"] and target["dtype"] == "bfloat16"
    assert draft == checkpoint.draft_config(target, full_plan(), 1)
    assert draft["dflash_config"]["target_layer_ids"] == [1, 3, 5]
    ids = [i for line in (tmp_path / "prompts.jsonl").read_text().splitlines()
           for i in json.loads(line)["input_ids"]]
    assert len(ids) > 64 and max(ids) < trained["vocab"] - 1000
