"""Train the drafter on the target's own greedy continuations, conditioned as SGLang serves it.

A training sequence is a prompt (length P) and the target's greedy continuation up to
``seq_total``. An anchor S in [P, T-L] plays a decode round with S committed tokens: the block
is [tokens[S], MASK...] at positions S.., the context is the target features of tokens < S, and
the labels are tokens[S+1 .. S+L-1] (the target's greedy tokens, what greedy verify accepts).
Loss: cross-entropy per depth k weighted exp(-(k-1)/gamma) (DFlash: early depths gate the rest).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .common import Phase, cosine_lr, sync
from .config import Plan
from .drafter import DFlashDrafter, draft_logits


@dataclass(frozen=True)
class DraftTrainResult:
    steps: int
    planned_steps: int
    losses: list[float]
    top1_depth1: list[float]  # training accuracy at depth 1 per logged chunk
    log_every: int
    wall_s: float
    stopped_early: bool


def sample_anchors(starts: torch.Tensor, total: int, block: int, n: int, gen) -> torch.Tensor:
    """``n`` anchors per row, uniform in [start, total - block] (with replacement)."""
    hi = total - block  # last anchor whose labels all exist
    span = (hi - starts + 1).clamp(min=1).float()
    u = torch.rand((starts.shape[0], n), generator=gen)
    return starts.unsqueeze(1) + (u * span.unsqueeze(1)).long()


def draft_loss(drafter: DFlashDrafter, embed_w, feats, tokens, anchors, mask_id: int,
               gamma: float):
    """Weighted CE of the block depths 1..L-1 against tokens[S+1..S+L-1]; also depth-1 acc."""
    b, t = tokens.shape
    pos = torch.arange(t, device=tokens.device).expand(b, t)
    ctx_kv = drafter.context_kv(feats, pos)
    logits = draft_logits(drafter, embed_w, ctx_kv, tokens, anchors, mask_id)  # [B,A,L-1,V]
    depth = torch.arange(1, drafter.d.block_size, device=tokens.device)
    labels = tokens.gather(1, (anchors.unsqueeze(-1) + depth).reshape(b, -1)).view_as(
        logits[..., 0])
    ce = F.cross_entropy(logits.float().flatten(0, 2), labels.flatten(), reduction="none")
    w = torch.exp(-(depth.float() - 1) / gamma)
    loss = (ce.view_as(labels) * w).sum(-1).mean() / w.sum()
    acc1 = (logits[:, :, 0].argmax(-1) == labels[:, :, 0]).float().mean()
    return loss, acc1


def train_drafter(drafter: DFlashDrafter, embed_w, feats, tokens, starts, plan: Plan, device,
                  gen, mask_id: int, log_every: int = 50) -> DraftTrainResult:
    """``feats`` [N, T, F*H], ``tokens`` [N, T], ``starts`` [N] (the prompt lengths)."""
    phase = Phase("drafter", plan.draft_cap_s)
    opt = torch.optim.AdamW(drafter.parameters(), lr=plan.draft_lr, betas=(0.9, 0.95),
                            weight_decay=0.01, fused=str(device).startswith("cuda"))
    use_amp = str(device).startswith("cuda")
    drafter.train()
    embed_w = embed_w.detach()
    losses, accs, chunk_l, chunk_a, steps = [], [], [], [], 0
    warmup = max(1, plan.draft_steps // 20)
    n = tokens.shape[0]
    for step in range(plan.draft_steps):
        if phase.over():
            break
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, plan.draft_steps, plan.draft_lr, warmup)
        rows = torch.randint(0, n, (plan.draft_batch,), generator=gen)
        anchors = sample_anchors(starts[rows], tokens.shape[1], drafter.d.block_size,
                                 plan.draft_anchors, gen)
        rows_d = rows.to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            loss, acc1 = draft_loss(drafter, embed_w, feats[rows_d], tokens[rows_d],
                                    anchors.to(device), mask_id, plan.draft_gamma)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        chunk_l.append(loss.detach())
        chunk_a.append(acc1.detach())
        steps += 1
        if len(chunk_l) == log_every:
            losses.append(float(torch.stack(chunk_l).mean()))
            accs.append(float(torch.stack(chunk_a).mean()))
            chunk_l, chunk_a = [], []
    if chunk_l:
        losses.append(float(torch.stack(chunk_l).mean()))
        accs.append(float(torch.stack(chunk_a).mean()))
    sync(device)
    drafter.eval()
    return DraftTrainResult(steps=steps, planned_steps=plan.draft_steps, losses=losses,
                            top1_depth1=accs, log_every=log_every, wall_s=phase.elapsed(),
                            stopped_early=phase.stopped_early)
