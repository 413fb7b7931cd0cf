"""Runs INSIDE the SGLang CPU env: the adaptive policy's k-step no-draft round, its own logic.

``DDTreeWorkerV2._nodraft_round`` with SGLang's forward replaced by a deterministic stand-in
target (the token after ``t`` at position ``p`` is ``(7t + p) mod V``; the hidden row of a
step is ``(t, p)``) and the draft block, the drafter's KV writer and the next draft input
recorded. What the GPU cannot tell apart cheaply is checked here: every step feeds the
previous step's token at the next position and slot, the host bounds grow with the steps,
the committed tokens and the drafter's rows are in order, the batch comes back unchanged.
Prints one ``PROBE-JSON`` object.
"""

from __future__ import annotations

from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory


def main() -> dict:
    import torch

    from sglang_dflash.sglang_overlay import worker as W
    from sglang_dflash.sglang_overlay.verify import VerifyTensors

    vocab, block, steps, mask_id = 50, 6, 4, 49
    w = object.__new__(W.DDTreeWorkerV2)
    w.device = "cpu"
    w.block_size = block
    w._nodraft_steps = steps
    w._root_rounds = {}
    w._prof = None
    w._meter = None
    w.ddtree = SimpleNamespace(max_depth=block - 1)
    calls, appended = [], []

    def prepare(batch, draft_input, bs):
        ids = torch.full((bs, block), mask_id, dtype=torch.long)
        ids[:, 0] = draft_input.bonus_tokens
        pos = batch.seq_lens.view(-1, 1) + torch.arange(block)
        slots = 1000 * (torch.arange(bs).view(-1, 1) + 1) + pos
        return ids, pos, slots

    def verify_stage(batch, draft_input, tree, step, bs, width, prof, ranges):
        tok, pos = tree.tokens.view(bs), tree.positions.view(bs)
        calls.append({"width": width, "seq_lens": batch.seq_lens.tolist(),
                      "seq_lens_cpu": (None if batch.seq_lens_cpu is None
                                       else batch.seq_lens_cpu.tolist()),
                      "seq_lens_sum": batch.seq_lens_sum, "tokens": tok.tolist(),
                      "positions": pos.tolist(), "slots": step.cache_loc_2d.reshape(-1).tolist()})
        nxt = (tok * 7 + pos) % vocab
        logits = torch.full((bs, vocab), -10.0)
        logits[torch.arange(bs), nxt] = 10.0
        hidden = torch.stack([tok.float(), pos.float()], dim=-1)
        out = SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden),
            can_run_cuda_graph=True)
        return out, VerifyTensors(tok, pos, None)

    w._prepare_draft_block = prepare
    w._verify_stage = verify_stage
    w._append_target_hidden_to_draft_kv_by_loc = lambda **kw: appended.append(kw)
    w._make_next_draft_input_decode = lambda bonus_tokens, new_seq_lens: {
        "bonus": bonus_tokens.tolist(), "seq_lens": new_seq_lens.tolist()}
    prefix = torch.tensor([5, 9])
    batch = SimpleNamespace(seq_lens=prefix, seq_lens_cpu=torch.tensor([5, 9]),
                            seq_lens_sum=14, sampling_info=None)
    published, steps_before_publish = [], []

    def publish(new_seq_lens):
        published.append(new_seq_lens.clone())
        steps_before_publish.append(len(calls))

    res = w._nodraft_round(batch, SimpleNamespace(bonus_tokens=torch.tensor([3, 11])),
                           publish, W.stage_ranges(), 2, 2)
    app = appended[0]
    # SGLANG_DFLASH_DDTREE_HOST_LENS=bound: SGLang gives no host lengths; the steps keep none
    # (each verify plans from the reserved bound) and the batch comes back as it was
    first, n_appended = len(calls), len(appended)
    bare = SimpleNamespace(seq_lens=prefix, seq_lens_cpu=None, seq_lens_sum=None,
                           sampling_info=None)
    w._nodraft_round(bare, SimpleNamespace(bonus_tokens=torch.tensor([3, 11])), None,
                     W.stage_ranges(), 2, 2)
    bare_calls = calls[first:]
    del calls[first:]
    # a short round (round_steps: no request keeps more than 2 of the k = 4): 2 steps, not
    # metered, and the round before it drops its cost (it would span this one)
    meter_calls = []
    w._meter = SimpleNamespace(begin=lambda: meter_calls.append("begin"),
                               end=lambda *a: meter_calls.append("end"),
                               interrupt=lambda: meter_calls.append("interrupt"))
    mark, n_app = len(calls), len(appended)
    short = w._nodraft_round(batch, SimpleNamespace(bonus_tokens=torch.tensor([3, 11])), None,
                             W.stage_ranges(), 2, 2, 2)
    short_calls = calls[mark:]
    del calls[mark:]
    short_app = appended[n_app]
    del appended[n_app:]
    w._meter = None
    return {
        "short": {"steps": len(short_calls), "meter": meter_calls,
                  "next_token_ids": short.next_token_ids.view(2, block).tolist(),
                  "accept_lens": short.accept_lens.tolist(),
                  "new_seq_lens": short.new_seq_lens.tolist(),
                  "append_commit": short_app["commit_lens"].tolist(),
                  "append_positions": short_app["positions"].tolist(),
                  "batch_restored": batch.seq_lens is prefix
                  and batch.seq_lens_cpu.tolist() == [5, 9] and batch.seq_lens_sum == 14},
        "bare_steps": [(c["seq_lens"], c["seq_lens_cpu"], c["seq_lens_sum"]) for c in bare_calls],
        "bare_restored": bare.seq_lens is prefix and bare.seq_lens_cpu is None
        and bare.seq_lens_sum is None,
        "calls": calls,
        "next_token_ids": res.next_token_ids.view(2, block).tolist(),
        "accept_lens": res.accept_lens.tolist(),
        "accept_dtype": str(res.accept_lens.dtype),
        "new_seq_lens": res.new_seq_lens.tolist(),
        "published": [p.tolist() for p in published],
        "steps_before_publish": steps_before_publish,
        "next_draft_input": res.next_draft_input,
        "stride": res.speculative_num_draft_tokens,
        "appended": n_appended,
        "append_rows": app["target_hidden"].tolist(),
        "append_loc": app["cache_loc"].tolist(),
        "append_loc_2d": app["cache_loc_2d"].tolist(),
        "append_positions": app["positions"].tolist(),
        "append_commit": app["commit_lens"].tolist(),
        "batch_restored": batch.seq_lens is prefix and batch.seq_lens_cpu.tolist() == [5, 9]
        and batch.seq_lens_sum == 14,
        "hidden_cleared": res.logits_output.hidden_states is None,
    }


if __name__ == "__main__":
    report(main)
