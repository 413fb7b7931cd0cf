"""The target: transformers' ``Qwen3ForCausalLM`` (the architecture SGLang serves), tied
embeddings, trained from scratch on random corpus windows with bf16 autocast."""

from __future__ import annotations

from dataclasses import dataclass

from .common import Phase, cosine_lr, sync
from .config import Plan, TargetSize


@dataclass(frozen=True)
class TargetTrainResult:
    steps: int
    planned_steps: int
    losses: list[float]  # mean loss per logged chunk
    log_every: int
    tokens: int
    wall_s: float
    stopped_early: bool


def qwen3_config(size: TargetSize, eos_id: int, pad_id: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=size.vocab,
        hidden_size=size.hidden,
        intermediate_size=size.intermediate,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads,
        head_dim=size.head_dim,
        hidden_act="silu",
        max_position_embeddings=size.max_positions,
        rms_norm_eps=size.rms_eps,
        rope_theta=size.rope_theta,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        architectures=["Qwen3ForCausalLM"],
    )


def build_target(size: TargetSize, eos_id: int, pad_id: int, device):
    import torch
    from transformers import Qwen3ForCausalLM

    cfg = qwen3_config(size, eos_id, pad_id)
    cfg._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(cfg).to(device=device, dtype=torch.float32)
    return model


def sample_windows(stream, n: int, length: int, gen):
    """``n`` random windows of ``length`` tokens from the flat token ``stream`` (1-D tensor)."""
    import torch

    starts = torch.randint(0, stream.numel() - length, (n,), generator=gen)
    idx = starts.unsqueeze(1) + torch.arange(length).unsqueeze(0)
    return stream[idx]


def train_target(model, stream, plan: Plan, device, gen, log_every: int = 50):
    """Next-token training on windows of ``plan.target_seq + 1`` tokens."""
    import torch
    import torch.nn.functional as F

    phase = Phase("target", plan.target_cap_s)
    opt = torch.optim.AdamW(model.parameters(), lr=plan.target_lr, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=str(device).startswith("cuda"))
    model.train()
    losses, chunk, steps = [], [], 0
    warmup = max(1, plan.target_steps // 20)
    use_amp = str(device).startswith("cuda")
    for step in range(plan.target_steps):
        if phase.over():
            break
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, plan.target_steps, plan.target_lr, warmup)
        batch = sample_windows(stream, plan.target_batch, plan.target_seq + 1, gen).to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=use_amp):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        chunk.append(loss.detach())
        steps += 1
        if len(chunk) == log_every:
            losses.append(float(torch.stack(chunk).mean()))
            chunk = []
    if chunk:
        losses.append(float(torch.stack(chunk).mean()))
    sync(device)
    model.eval()
    return TargetTrainResult(
        steps=steps, planned_steps=plan.target_steps, losses=losses, log_every=log_every,
        tokens=steps * plan.target_batch * plan.target_seq, wall_s=phase.elapsed(),
        stopped_early=phase.stopped_early,
    )
