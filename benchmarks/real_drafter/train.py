"""CLI: train the tokenizer, the Qwen3 target and its DFlash drafter; save them; measure the
drafter's offline accept length (linear DFlash and DDTree N in the plan's budgets).

    PYTHONPATH=src:benchmarks python3 -m real_drafter.train --out DIR --seed 0 \\
        --device cuda --json DIR/report.json          # the H200 run (about 6-7 min)
    ... --device cpu --toy                            # the CPU test's tiny run (seconds)

Writes DIR/target (Qwen3ForCausalLM + tokenizer), DIR/draft (DFlashDraftModel),
DIR/prompts.jsonl (held-out prompts) and the JSON report. ``benchmarks/`` has no
``__init__.py``, and on the GPU image a site-packages ``benchmarks`` package shadows the
namespace package, so the package is imported as ``real_drafter`` from ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import time
from pathlib import Path


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json", type=Path, default=None, help="report path (default OUT/report.json)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="scale the phase wall-clock caps to fit this total (above the "
                        "default's ~565 s it raises them: same steps, same pair, on a slower "
                        "or shared GPU)")
    p.add_argument("--toy", action="store_true", help="tiny sizes and a few steps (CPU test)")
    p.add_argument("--corpus-root", type=Path, default=None,
                   help="tree of *.py files (default: this Python's stdlib)")
    return p.parse_args(argv)


def _scaled(plan, budget_s):
    """The plan with its phase caps scaled to ``budget_s``. The caps only stop a phase early;
    the steps are the plan's, so a larger budget makes the same pair where the default caps
    would cut a slow phase short (and the report's ``reproducible`` false)."""
    if budget_s is None:
        return plan
    if not budget_s > 0:
        raise SystemExit(f"train: --budget-s {budget_s}: seconds, more than 0")
    caps = plan.target_cap_s + plan.gen_cap_s + plan.draft_cap_s + plan.eval_cap_s
    f = 0.85 * budget_s / caps  # 15% for corpus, tokenizer, saving
    return dataclasses.replace(plan, target_cap_s=plan.target_cap_s * f,
                               gen_cap_s=plan.gen_cap_s * f, draft_cap_s=plan.draft_cap_s * f,
                               eval_cap_s=plan.eval_cap_s * f)


def _eval_prompts(tok, docs_ids, plan, rng):
    """Held-out prompts as text whose encoding is the prompt (so the server, which tokenizes
    the text, sees exactly these ids): a random window of the wanted length, decoded, encoded
    again."""
    long_docs = [d for d in docs_ids if len(d) >= plan.eval_prompt_max + 8]
    prompts = []
    while len(prompts) < plan.eval_prompts:
        doc = long_docs[rng.randrange(len(long_docs))]
        n = rng.randint(plan.eval_prompt_min, plan.eval_prompt_max)
        s = rng.randrange(len(doc) - n)
        text = tok.decode(doc[s : s + n], skip_special_tokens=False)
        ids = tok.encode(text, add_special_tokens=False).ids
        if plan.eval_prompt_min <= len(ids) <= plan.eval_prompt_max and 1 not in ids:
            prompts.append({"id": len(prompts), "text": text, "input_ids": ids,
                            "prompt_tokens": len(ids), "max_new_tokens": plan.eval_new_tokens})
    return prompts


def _log(t_all: float, msg: str) -> None:
    print(f"[real_drafter {time.perf_counter() - t_all:7.1f}s] {msg}", file=sys.stderr, flush=True)


def run(args) -> dict:
    """The whole command; every warning shown meanwhile is recorded (and still printed), so
    the report can name the non-deterministic ops torch warned of. torch's determinism flags,
    which the run sets process-wide, are restored afterwards (for in-process callers)."""
    from .common import recording_warnings, restoring_determinism

    with restoring_determinism(), recording_warnings() as shown:
        return _run(args, shown)


def _run(args, shown: list[str]) -> dict:
    import torch

    from . import checkpoint, corpus, evaluate, generate, target, tokenizer, train_drafter
    from .common import (
        REPRODUCIBLE_DEFINITION,
        Phase,
        determinism_in_force,
        deterministic_attention,
        nondeterministic_ops,
        reproducibility,
        seed_everything,
        sync,
    )
    from .config import EOS_TOKEN, MASK_TOKEN, PAD_TOKEN, full_plan, toy_plan
    from .drafter import DFlashDrafter

    t_all = time.perf_counter()
    plan = _scaled(toy_plan() if args.toy else full_plan(), args.budget_s)
    device = torch.device(args.device)
    seed_everything(args.seed)  # before any CUDA work (cuBLAS reads its workspace config once)
    gen = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)
    walls: dict[str, float] = {}
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    corp = corpus.load_corpus(args.corpus_root)
    tok = tokenizer.train_tokenizer(corp.train, plan.target.vocab, plan.tokenizer_max_chars)
    mask_id, eos_id, pad_id = (tok.token_to_id(s) for s in (MASK_TOKEN, EOS_TOKEN, PAD_TOKEN))
    train_ids = tokenizer.encode_docs(tok, corp.train)
    held_ids = tokenizer.encode_docs(tok, corp.held_out)
    flat = []
    for d in train_ids:
        flat.extend(d)
        flat.append(eos_id)
    stream = torch.tensor(flat, dtype=torch.long)
    walls["corpus_tokenizer"] = time.perf_counter() - t0
    _log(t_all, f"corpus {corp.files} files, {stream.numel()} train tokens")

    # target
    model = target.build_target(plan.target, eos_id, pad_id, device)
    with deterministic_attention():
        t_res = target.train_target(model, stream, plan, device, gen)
    walls["target_train"] = t_res.wall_s
    _log(t_all, f"target {t_res.steps} steps, loss {t_res.losses[-1]:.3f}")
    t0 = time.perf_counter()
    tdir = out / "target"
    checkpoint.save_target(model, tdir)  # casts to bf16: everything after runs as served
    tokenizer.save_tokenizer(tok, tdir, plan.target.max_positions)
    walls["target_save"] = time.perf_counter() - t0

    # drafter data: greedy continuations of training windows + their target features
    phase = Phase("generate", plan.gen_cap_s)
    seqs, starts = [], []
    for p_len in plan.gen_prompt_lens:
        if phase.over():
            break
        windows = target.sample_windows(stream, plan.gen_per_len, p_len, gen).tolist()
        cont = generate.greedy_continue(model, windows, plan.seq_total - p_len, device,
                                        plan.gen_batch)
        seqs += [w + c for w, c in zip(windows, cont, strict=True)]
        starts += [p_len] * len(windows)
    tokens = torch.tensor(seqs, dtype=torch.long, device=device)
    starts_t = torch.tensor(starts, dtype=torch.long)
    feats = generate.target_features(model, tokens, plan.draft.target_layer_ids, 64)
    sync(device)
    walls["generate"] = phase.elapsed()
    gen_stopped = phase.stopped_early
    _log(t_all, f"generated {len(seqs)} sequences")

    # drafter
    drafter = DFlashDrafter(plan.target, plan.draft).to(device)
    embed_w = model.get_input_embeddings().weight.detach()
    with deterministic_attention():
        d_res = train_drafter.train_drafter(drafter, embed_w, feats, tokens, starts_t, plan,
                                            device, gen, mask_id)
    walls["draft_train"] = d_res.wall_s
    _log(t_all, f"drafter {d_res.steps} steps, loss {d_res.losses[-1]:.3f}, "
                f"acc1 {d_res.top1_depth1[-1]:.3f}")
    del feats
    drafter = drafter.to(torch.bfloat16)
    ddir = out / "draft"
    dcfg = checkpoint.draft_config(json.loads((tdir / "config.json").read_text()), plan, mask_id)
    checkpoint.save_draft(drafter, dcfg, ddir)

    # offline evaluation on held-out prompts
    phase = Phase("eval", plan.eval_cap_s)
    prompts = _eval_prompts(tok, held_ids, plan, rng)
    checkpoint.save_prompts(out / "prompts.jsonl", prompts)
    look = plan.eval_new_tokens + plan.draft.block_size
    conts = generate.greedy_continue(model, [p["input_ids"] for p in prompts], look, device,
                                     plan.eval_batch)
    results: dict[str, list] = {}
    modes = [("dflash", None)] + [(f"ddtree-{n}", n) for n in plan.budgets]
    for i in range(0, len(prompts), plan.eval_batch):
        chunk = prompts[i : i + plan.eval_batch]
        full = [p["input_ids"] + c for p, c in zip(chunk, conts[i : i + plan.eval_batch],
                                                   strict=True)]
        width = max(len(f) for f in full)
        seq_t = torch.full((len(full), width), pad_id, dtype=torch.long)
        for r, f in enumerate(full):
            seq_t[r, : len(f)] = torch.tensor(f)
        seq_t = seq_t.to(device)
        p_lens = torch.tensor([p["prompt_tokens"] for p in chunk], dtype=torch.long)
        e_feats = generate.target_features(model, seq_t, plan.draft.target_layer_ids, 64)
        for name, budget in modes:
            results.setdefault(name, []).append(evaluate.simulate(
                drafter, embed_w, e_feats, seq_t, p_lens, plan.eval_new_tokens, mask_id,
                "dflash" if budget is None else "ddtree", budget, phase))
    merged = {k: evaluate.merge(v, plan.eval_new_tokens, len(prompts))
              for k, v in results.items()}
    walls["eval"] = phase.elapsed()
    _log(t_all, f"eval done: dflash {merged['dflash'].accept_length:.3f}")
    walls["total"] = time.perf_counter() - t_all

    import tokenizers
    import transformers

    determinism = determinism_in_force()
    rep = {
        "offline_accept_length_dflash": merged["dflash"].accept_length,
        "offline_accept_length_ddtree": {str(n): merged[f"ddtree-{n}"].accept_length
                                         for n in plan.budgets},
        "accept_length_definition": "tokens committed per verify round (accepted drafts + "
                                    "bonus), mean over rounds; SGLang's avg_spec_accept_length",
        "served_formula": {k: v.served_formula for k, v in merged.items()},
        "served_formula_per_request": {k: v.served_formula_per_request
                                       for k, v in merged.items()},
        "served_formula_definition": "max_new_tokens / verify rounds (SGLang's per-request "
                                     "meta_info spec_accept_length = completion_tokens / "
                                     "verify_ct)",
        "modes": {k: dataclasses.asdict(v) for k, v in merged.items()},
        "target_train": dataclasses.asdict(t_res),
        "draft_train": dataclasses.asdict(d_res),
        "generate": {"sequences": len(seqs), "seq_total": plan.seq_total,
                     "prompt_lens": list(plan.gen_prompt_lens), "stopped_early": gen_stopped},
        "eval": {"prompts": len(prompts), "new_tokens": plan.eval_new_tokens,
                 "prompt_tokens_mean": sum(p["prompt_tokens"] for p in prompts) / len(prompts)},
        "wall_s": walls,
        # the pair follows from the seed alone only if no phase was cut by its wall-clock cap,
        # torch warned of no non-deterministic op and the settings in force leave it no
        # non-deterministic choice (common.reproducibility)
        **reproducibility({"target_train": t_res.stopped_early, "generate": gen_stopped,
                           "draft_train": d_res.stopped_early}, nondeterministic_ops(shown),
                          determinism),
        "reproducible_definition": REPRODUCIBLE_DEFINITION,
        "determinism": determinism,
        "corpus": corp.id(),
        "corpus_train_tokens": int(stream.numel()),
        "seed": args.seed,
        "toy": bool(args.toy),
        "plan": plan.to_json(),
        "mask_token_id": mask_id, "eos_token_id": eos_id,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version()},
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else platform.processor() or "cpu"),
        "sha256": {
            "target/model.safetensors": checkpoint.sha256_file(tdir / "model.safetensors"),
            "target/tokenizer.json": checkpoint.sha256_file(tdir / "tokenizer.json"),
            "draft/model.safetensors": checkpoint.sha256_file(ddir / "model.safetensors"),
            "prompts.jsonl": checkpoint.sha256_file(out / "prompts.jsonl"),
        },
    }
    path = args.json or out / "report.json"
    path.write_text(json.dumps(rep, indent=2) + "\n")
    return rep


def main(argv=None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    rep = run(args)
    short = {k: rep[k] for k in ("offline_accept_length_dflash", "offline_accept_length_ddtree",
                                 "wall_s")}
    print(json.dumps(short, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
