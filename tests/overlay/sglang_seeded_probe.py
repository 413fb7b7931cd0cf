"""Runs in the SGLang CPU env with TRITON_INTERPRET=1 (SGLang's murmur hash is a Triton kernel):
DDTree's seeded per-node draw against SGLang's own deterministic sampler. Prints one
``PROBE-JSON`` line."""

from __future__ import annotations

import json

import torch
from probe_output import PREFIX  # a sibling: the scripts run from this directory
from sglang.srt.layers import sampler as sgl_sampler

from sglang_dflash.sglang_overlay.verify import seeded_node_targets

g = torch.Generator().manual_seed(0)
bs, width, vocab = 3, 4, 300
logits = torch.randn(bs * width, vocab, generator=g) * 3
temps = torch.tensor([0.7, 1.0, 1.3])
seeds = torch.tensor([5, 6, 7])
positions = torch.arange(bs * width) + 40
rows_t = temps.repeat_interleave(width).view(-1, 1)
rows_s = seeds.repeat_interleave(width)
probs = torch.softmax(logits / rows_t, dim=-1)
top_ks = torch.tensor([vocab, 20, 5])
top_ps = torch.tensor([0.9, 1.0, 0.5])
want_simple = sgl_sampler.sampling_from_probs_torch(probs.clone(), rows_s, positions)
want_filtered = sgl_sampler.top_k_top_p_min_p_sampling_from_probs_torch(
    probs.clone(), top_ks.repeat_interleave(width), top_ps.repeat_interleave(width),
    torch.zeros(bs * width), False, rows_s, positions,
)  # fmt: skip
got_simple = seeded_node_targets(logits, width, temps, seeds, positions,
                                 sgl_sampler.multinomial_with_seed)
got_filtered = seeded_node_targets(logits, width, temps, seeds, positions,
                                   sgl_sampler.multinomial_with_seed, top_ks, top_ps)
out = {
    "simple_equal": torch.equal(got_simple.view(-1).long(), want_simple.long()),
    "filtered_equal": torch.equal(got_filtered.view(-1).long(), want_filtered.long()),
    "distinct_draws": len(set(want_simple.tolist())),
    "other_seed_differs": not torch.equal(
        seeded_node_targets(logits, width, temps, seeds + 100, positions,
                            sgl_sampler.multinomial_with_seed), got_simple),
}
print(PREFIX + json.dumps(out))
