"""A tiny pure-torch target LM and a DFlash-style drafter, for end-to-end DDTree decoding.

The target is a one-layer attention LM in float64 that takes an explicit boolean attention
matrix and explicit positions, so a tree verify forward (prefix + tree rows under the FULL_MASK
block) and plain causal decoding run the very same code: greedy DDTree output must then be
token-identical to greedy decoding.

The drafter mimics DFlash's shape, not its weights: one call returns L per-position
distributions for the block after the bonus token. It peeks at the target's true greedy
continuation and places each true token at rank 0, at rank 1-3, or far down (a miss), with
seeded randomness, so trees sometimes help only when they branch.
"""

from __future__ import annotations

import torch


class TinyLM:
    def __init__(self, vocab: int = 32, dim: int = 32, seed: int = 0, max_pos: int = 512):
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale=1.0):
            return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

        self.vocab = vocab
        self._memo: dict[tuple[int, ...], int] = {}
        self.emb = w(vocab, dim)
        self.pos = w(max_pos, dim, scale=0.5)
        self.wq, self.wk, self.wv, self.wo = (w(dim, dim, scale=dim**-0.5) for _ in range(4))
        self.head = w(dim, vocab, scale=3 * dim**-0.5)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor):
        """Logits ``[T, V]``; ``allowed[i, j]`` = row i may attend to column j."""
        h = self.emb[tokens] + self.pos[positions]
        q, k, v = h @ self.wq, h @ self.wk, h @ self.wv
        att = (q @ k.T) / q.shape[-1] ** 0.5
        att = torch.softmax(att.masked_fill(~allowed, float("-inf")), -1)
        return (h + torch.tanh(att @ v) @ self.wo) @ self.head

    def next_logits(self, seq: list[int]) -> torch.Tensor:
        t = torch.tensor(seq)
        n = len(seq)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        return self.forward(t, torch.arange(n), causal)[-1]

    def greedy(self, seq: list[int], steps: int) -> list[int]:
        seq = list(seq)
        for _ in range(steps):
            key = tuple(seq)
            if key not in self._memo:  # plain causal forward; memoised per exact prefix
                self._memo[key] = int(self.next_logits(seq).argmax())
            seq.append(self._memo[key])
        return seq


class OracleDrafter:
    """Per-position logits for the L tokens after ``seq[-1]`` (one 'block forward')."""

    def __init__(self, target: TinyLM, depth: int, seed: int, p_rank=(0.6, 0.12, 0.08, 0.05)):
        self.target, self.depth, self.seed = target, depth, seed
        self.p_rank = p_rank  # P(true token at rank 0..3); the rest: a miss (last rank)

    def block_logits(self, seq: list[int]) -> torch.Tensor:
        vocab = self.target.vocab
        truth = self.target.greedy(seq, self.depth)[len(seq) :]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + len(seq) * 7919 + seq[-1])
        out = torch.empty(self.depth, vocab)
        cdf = torch.cumsum(torch.tensor(self.p_rank), 0)
        for i, tok in enumerate(truth):
            vals = torch.sort(torch.randn(vocab, generator=g) * 2, descending=True).values
            u = torch.rand(1, generator=g)
            rank = int((u > cdf).sum())  # 0..3, or 4 = miss
            rank = vocab - 1 if rank >= len(self.p_rank) else rank
            others = [t for t in torch.randperm(vocab, generator=g).tolist() if t != tok]
            order = [*others[:rank], tok, *others[rank:]]
            out[i, torch.tensor(order)] = vals
        return out


def toy_gumbel(seeds, positions, m: int):
    """The stand-in sampler's Gumbel noise, ``[rows, m]`` float64: a hash of (seed, position,
    column) per row and column, as ``toy_multinomial_with_seed`` adds it."""
    cols = torch.arange(m, dtype=torch.int64).view(1, -1)
    h = (seeds.view(-1, 1).long() * 0x9E3779B1 + positions.view(-1, 1).long() * 0x85EBCA77
         + cols * 0xC2B2AE3D) & 0xFFFFFFFF
    for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, 1)):
        h = ((h ^ (h >> shift)) * mul) & 0xFFFFFFFF
    u = (h.double() + 0.5) / 2**32
    return -torch.log(-torch.log(u))


def toy_multinomial_with_seed(logprobs, seeds, positions):
    """A stand-in for SGLang's ``multinomial_with_seed`` (which hashes seed, position and column
    with murmur3, a CUDA-only Triton kernel): Gumbel-max over a hash of the same three keys.
    The probe against real SGLang (tests/overlay/sglang_seeded_probe.py) uses the real one."""
    noise = toy_gumbel(seeds, positions, logprobs.shape[1])
    return (logprobs.double() + noise).argmax(-1, keepdim=True)
