"""Model sizes and step plans: one ``Plan`` for the H200 run, one tiny one for the CPU test.

Fixed step counts make a run reproducible; the wall-clock caps in ``Plan`` only stop a phase
early on a slower machine (the report records it), they never decide the result on the H200.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MASK_TOKEN = "<|MASK|>"  # SGLang's DEFAULT_DFLASH_MASK_TOKEN
EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (EOS_TOKEN, MASK_TOKEN, PAD_TOKEN)  # ids 0, 1, 2


@dataclass(frozen=True)
class TargetSize:
    """Qwen3ForCausalLM sizes (head_dim 64: FlashInfer and Triton both support it)."""

    layers: int = 8
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 64
    intermediate: int = 1536
    vocab: int = 8192
    max_positions: int = 4096
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6


@dataclass(frozen=True)
class DraftSize:
    """DFlashDraftModel sizes; hidden/heads/head_dim equal the target's (shared embedding)."""

    layers: int = 3
    intermediate: int = 1536
    target_layer_ids: tuple[int, ...] = (1, 3, 5)
    block_size: int = 16


@dataclass(frozen=True)
class Plan:
    """Every size and step count of one run."""

    target: TargetSize = field(default_factory=TargetSize)
    draft: DraftSize = field(default_factory=DraftSize)
    tokenizer_max_chars: int = 12_000_000  # text the BPE trainer sees (a prefix of train)
    # target pre-training
    target_seq: int = 1024
    target_batch: int = 32
    # every phase is sized to finish well inside its cap: the caps are a safety net, so the
    # step counts (and the pair) follow from the seed alone, not from the machine's speed
    # (2026-12-03 the target stopped by its wall-clock cap at 1,563 of 3,000 steps)
    target_steps: int = 1500
    target_lr: float = 2e-3
    # 112 s on the H200 with cuDNN attention (2026-12-05); the math SDPA backend that training
    # now uses for determinism (common.deterministic_attention) is slower, by an amount not yet
    # measured. The caps add up to 480 s, issue 15's "at most 8 minutes of GPU time in all"
    # (phases on the H200 on 2026-12-05: target 112, generate 59, drafter 98, eval 48 s): a
    # phase that would overrun is cut and the report says "reproducible": false
    target_cap_s: float = 200.0
    # drafter data: greedy continuations of training windows, total length seq_total
    gen_prompt_lens: tuple[int, ...] = (64, 192, 320, 448)
    gen_per_len: int = 384
    gen_batch: int = 384
    seq_total: int = 768
    gen_cap_s: float = 70.0
    # drafter training
    draft_batch: int = 32
    draft_anchors: int = 32
    draft_steps: int = 3000
    draft_lr: float = 1.5e-3
    draft_gamma: float = 7.0  # DFlash's per-depth loss weight exp(-(k-1)/gamma)
    draft_cap_s: float = 130.0
    # offline evaluation
    eval_prompts: int = 64
    eval_prompt_min: int = 64
    eval_prompt_max: int = 496
    eval_new_tokens: int = 256
    eval_batch: int = 64
    budgets: tuple[int, ...] = (8, 16, 32, 64)
    eval_cap_s: float = 80.0

    def to_json(self) -> dict:
        return asdict(self)


def full_plan() -> Plan:
    """The H200 run (sizes from the issue; steps sized for ~7 min in all)."""
    return Plan()


def toy_plan() -> Plan:
    """The CPU test: the same code with tiny sizes and a few steps (seconds)."""
    return Plan(
        target=TargetSize(layers=4, hidden=64, heads=2, kv_heads=1, head_dim=32,
                          intermediate=128, vocab=384, max_positions=512),
        draft=DraftSize(layers=1, intermediate=128, target_layer_ids=(0, 2), block_size=16),
        tokenizer_max_chars=200_000,
        target_seq=64, target_batch=4, target_steps=4, target_lr=3e-3, target_cap_s=60,
        gen_prompt_lens=(16, 24), gen_per_len=4, gen_batch=4, seq_total=64, gen_cap_s=60,
        draft_batch=4, draft_anchors=4, draft_steps=4, draft_lr=3e-3, draft_cap_s=60,
        eval_prompts=3, eval_prompt_min=16, eval_prompt_max=24, eval_new_tokens=24,
        eval_batch=3, budgets=(8, 16, 32, 64), eval_cap_s=60,
    )
