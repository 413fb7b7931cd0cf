"""On-disk formats: the target as transformers saves a Qwen3ForCausalLM (what SGLang's Qwen3
loader reads), the draft as SGLang 0.5.17's DFLASH loader reads it, the held-out prompts."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from .config import MASK_TOKEN, Plan


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save_target(model, out: Path) -> None:
    """bf16 safetensors + config.json (``architectures: [Qwen3ForCausalLM]``, dtype bf16)
    + generation_config.json; tied embeddings, so only ``model.embed_tokens.weight``."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config.do_sample = False
    model.save_pretrained(str(out), safe_serialization=True)


def draft_config(target_cfg: dict, plan: Plan, mask_token_id: int) -> dict:
    """The target's Qwen3 config with the draft's depth and MLP width, plus the DFLASH fields
    ``parse_dflash_draft_config`` reads. No ``is_causal``: SGLang then makes the draft layers
    ENCODER_ONLY (non-causal block attention), the attention ``drafter`` trains."""
    d = plan.draft
    cfg = {k: v for k, v in target_cfg.items()
           if k not in {"auto_map", "_name_or_path", "transformers_version"}}
    cfg.update(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=d.layers,
        intermediate_size=d.intermediate,
        layer_types=["full_attention"] * d.layers,
        tie_word_embeddings=False,
        dtype="bfloat16",
        block_size=d.block_size,
        num_target_layers=plan.target.layers,
        dflash_config={
            "block_size": d.block_size,
            "mask_token": MASK_TOKEN,
            "mask_token_id": int(mask_token_id),
            "target_layer_ids": list(d.target_layer_ids),
            "num_target_layers": plan.target.layers,
        },
    )
    return cfg


def save_draft(drafter, cfg: dict, out: Path) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in drafter.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def save_prompts(path: Path, prompts: list[dict]) -> None:
    with open(path, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
