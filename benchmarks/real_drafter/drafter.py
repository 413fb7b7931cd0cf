"""The DFlash drafter: the math of SGLang 0.5.17's ``DFlashDraftModel`` (srt/models/dflash.py)
written as a trainable torch module, with the checkpoint's parameter names.

What SGLang computes at decode time (dflash_worker_v2.py) and this module reproduces:

* context features: the target's residual stream after each layer in
  ``dflash_config.target_layer_ids`` (SGLang captures "before layer id+1"), concatenated per
  token, then ``hidden_norm(fc(.))``. Every committed token's features become draft K/V in
  every draft layer: ``k_norm(k_proj(ctx))`` roped at the token's position, ``v_proj(ctx)``, with
  no input layernorm (``prepare_context_hidden_for_kv`` is the identity for this class).
* the block: ``[bonus token, MASK x (B-1)]`` at positions ``S .. S+B-1`` (S = committed
  length), embedded with the target's embedding, through pre-norm Qwen3-style layers
  (per-head q/k RMSNorm, neox RoPE, SiLU MLP). Attention is non-causal (no ``layer_types``:
  ``AttentionType.ENCODER_ONLY``): each block query sees all committed context tokens
  (positions < S) and all B block tokens.
* final ``norm``, then the target's (tied) ``lm_head``; depths 1..B-1 are the draft.

The checkpoint holds no embedding and no lm_head: SGLang borrows the target's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import DraftSize, TargetSize


class RMSNorm(nn.Module):
    """Qwen/SGLang RMSNorm: float32 statistics, ``weight * x`` (weight starts at one)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding (SGLang's default ``is_neox_style=True``, HF Qwen3's
    rotate_half). ``x`` is ``[..., T, heads, head_dim]``, ``positions`` ``[..., T]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    ang = positions.to(torch.float32).unsqueeze(-1) * inv  # [..., T, d/2]
    cos = ang.cos().unsqueeze(-2)
    sin = ang.sin().unsqueeze(-2)
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, t: TargetSize):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = t.heads, t.kv_heads, t.head_dim
        self.theta = t.rope_theta
        self.q_proj = nn.Linear(t.hidden, t.heads * t.head_dim, bias=False)
        self.k_proj = nn.Linear(t.hidden, t.kv_heads * t.head_dim, bias=False)
        self.v_proj = nn.Linear(t.hidden, t.kv_heads * t.head_dim, bias=False)
        self.o_proj = nn.Linear(t.heads * t.head_dim, t.hidden, bias=False)
        self.q_norm = RMSNorm(t.head_dim, t.rms_eps)
        self.k_norm = RMSNorm(t.head_dim, t.rms_eps)

    def kv(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, roped) and V of ``h`` ``[B, T, H]``: ``[B, kv_heads, T, head_dim]``."""
        b, n, _ = h.shape
        k = self.k_norm(self.k_proj(h).view(b, n, self.kv_heads, self.head_dim))
        k = rope(k, positions, self.theta)
        v = self.v_proj(h).view(b, n, self.kv_heads, self.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, h, positions, ctx_k, ctx_v, mask):
        """Block queries ``h`` [B, Q, H] over keys [context, block]; ``mask`` [B, Q, T+Q]."""
        b, n, _ = h.shape
        q = self.q_norm(self.q_proj(h).view(b, n, self.heads, self.head_dim))
        q = rope(q, positions, self.theta).transpose(1, 2)
        bk, bv = self.kv(h, positions)
        k = torch.cat([ctx_k, bk], dim=2)
        v = torch.cat([ctx_v, bv], dim=2)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
        return self.o_proj(o.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, t: TargetSize, d: DraftSize):
        super().__init__()
        self.input_layernorm = RMSNorm(t.hidden, t.rms_eps)
        self.self_attn = Attention(t)
        self.post_attention_layernorm = RMSNorm(t.hidden, t.rms_eps)
        self.mlp = MLP(t.hidden, d.intermediate)


class DFlashDrafter(nn.Module):
    """``state_dict()`` keys are the draft checkpoint's keys (``layers.*``, ``fc``,
    ``hidden_norm``, ``norm``): exactly what ``DFlashDraftModel.load_weights`` maps."""

    def __init__(self, t: TargetSize, d: DraftSize):
        super().__init__()
        self.t, self.d = t, d
        self.layers = nn.ModuleList(Layer(t, d) for _ in range(d.layers))
        self.norm = RMSNorm(t.hidden, t.rms_eps)
        self.fc = nn.Linear(len(d.target_layer_ids) * t.hidden, t.hidden, bias=False)
        self.hidden_norm = RMSNorm(t.hidden, t.rms_eps)

    def context_kv(self, feats: torch.Tensor, positions: torch.Tensor):
        """Per-layer context K/V of target features ``[B, T, F*H]`` at ``positions`` ``[B, T]``.

        Depends only on each token, never on the anchor: computed once per sequence and shared
        by every block that sees it (SGLang writes the same K/V into the draft KV cache)."""
        ctx = self.hidden_norm(self.fc(feats.to(self.fc.weight.dtype)))
        return [layer.self_attn.kv(ctx, positions) for layer in self.layers]

    def block_hidden(self, ctx_kv, ctx_len: torch.Tensor, block_embeds: torch.Tensor,
                     block_pos: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden states of ``A`` blocks per row.

        ``ctx_kv``: from ``context_kv`` over ``T`` tokens; ``ctx_len`` ``[B, A]`` the committed
        length S of each block (it sees context tokens ``< S``); ``block_embeds``
        ``[B, A, L, H]`` (target embedding of [bonus, MASK...]); ``block_pos`` ``[B, A, L]``.
        Returns ``[B, A, L, H]``.
        """
        b, a, n, hdim = block_embeds.shape
        t_ctx = ctx_kv[0][0].shape[2]
        dev = block_embeds.device
        ctx_vis = torch.arange(t_ctx, device=dev).view(1, 1, t_ctx) < ctx_len.view(b, a, 1)
        ctx_vis = ctx_vis.unsqueeze(2).expand(b, a, n, t_ctx).reshape(b, a * n, t_ctx)
        blk = torch.arange(a, device=dev).repeat_interleave(n)
        blk_vis = (blk.view(-1, 1) == blk.view(1, -1)).expand(b, a * n, a * n)
        mask = torch.cat([ctx_vis, blk_vis], dim=2)  # [B, A*L, T + A*L]
        pos = block_pos.reshape(b, a * n)
        x = block_embeds.reshape(b, a * n, hdim)
        for layer, (ck, cv) in zip(self.layers, ctx_kv, strict=True):
            x = x + layer.self_attn(layer.input_layernorm(x), pos, ck, cv, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x).view(b, a, n, hdim)


def block_inputs(tokens: torch.Tensor, anchors: torch.Tensor, mask_id: int, block: int):
    """Block ids ``[B, A, L]`` = [tokens[S], MASK...] and positions S..S+L-1 for anchors S."""
    bonus = tokens.gather(1, anchors)  # [B, A]
    ids = torch.full((*anchors.shape, block), mask_id, dtype=torch.long, device=tokens.device)
    ids[..., 0] = bonus
    pos = anchors.unsqueeze(-1) + torch.arange(block, device=tokens.device)
    return ids, pos


def draft_logits(drafter: DFlashDrafter, embed_w: torch.Tensor, ctx_kv, tokens, anchors,
                 mask_id: int) -> torch.Tensor:
    """Logits ``[B, A, L-1, V]`` at block depths 1..L-1 for anchors ``[B, A]``: the one draft
    forward used by training, the offline evaluation and the CPU test."""
    block = drafter.d.block_size
    ids, pos = block_inputs(tokens, anchors, mask_id, block)
    emb = F.embedding(ids, embed_w).to(drafter.fc.weight.dtype)
    h = drafter.block_hidden(ctx_kv, anchors, emb, pos)
    return h[:, :, 1:] @ embed_w.t().to(h.dtype)
