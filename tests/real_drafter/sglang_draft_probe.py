"""Run in the SGLang 0.5.17 CPU venv: feed a saved draft checkpoint to SGLang's own DFLASH code.

argv: DRAFT_DIR TARGET_DIR. Prints one JSON line. Uses SGLang's ``parse_dflash_draft_config``,
``_get_dflash_layer_attention_params`` and ``DFlashDraftModel.load_weights`` (called on a
stand-in holding SGLang's fused parameter names: qkv_proj, gate_up_proj; every other name is the
checkpoint's), so what is checked is SGLang's mapping code, not ours.
"""

import json
import sys
from types import SimpleNamespace

import torch
from safetensors.torch import load_file
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.models.dflash import DFlashDraftModel, _get_dflash_layer_attention_params
from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
from transformers import AutoConfig

draft_dir, target_dir = sys.argv[1], sys.argv[2]
cfg = AutoConfig.from_pretrained(draft_dir)
tcfg = AutoConfig.from_pretrained(target_dir)
dc = parse_dflash_draft_config(draft_hf_config=cfg)
layer_ids = dc.resolve_target_layer_ids(target_num_layers=tcfg.num_hidden_layers,
                                        draft_num_layers=dc.num_hidden_layers)
attn = [_get_dflash_layer_attention_params(cfg, i) for i in range(cfg.num_hidden_layers)]

# SGLang's parameter names for this config (dflash.py module tree, fused linears)
h, hd = cfg.hidden_size, cfg.head_dim
q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
shapes = {"norm.weight": (h,), "fc.weight": (h, len(layer_ids) * h), "hidden_norm.weight": (h,)}
for i in range(cfg.num_hidden_layers):
    p = f"layers.{i}."
    shapes.update({
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.qkv_proj.weight": (q + 2 * kv, h), p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_up_proj.weight": (2 * cfg.intermediate_size, h),
        p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
    })
loaded: dict[str, list] = {}


def make_param(name, shape):
    t = torch.nn.Parameter(torch.zeros(shape), requires_grad=False)

    def loader(param, w, shard=None):
        loaded.setdefault(name, []).append(shard)
        if shard is None:
            assert tuple(w.shape) == tuple(param.shape), (name, w.shape, param.shape)
            param.data.copy_(w)
        else:
            off = {"q": 0, "k": q, "v": q + kv, 0: 0, 1: cfg.intermediate_size}[shard]
            param.data[off : off + w.shape[0]].copy_(w)

    t.weight_loader = loader
    return t


params = {n: make_param(n, s) for n, s in shapes.items()}
stand_in = SimpleNamespace(named_parameters=lambda: params.items(),
                           num_context_features=len(layer_ids), config=cfg)
weights = load_file(f"{draft_dir}/model.safetensors")
DFlashDraftModel.load_weights(stand_in, weights.items())
print(json.dumps({
    "block_size": dc.block_size, "mask_token": dc.mask_token, "mask_token_id": dc.mask_token_id,
    "target_layer_ids": layer_ids, "num_hidden_layers": dc.num_hidden_layers,
    "encoder_only": all(a == (-1, AttentionType.ENCODER_ONLY) for a in attn),
    "checkpoint_keys": sorted(weights),
    "loaded": {k: sorted(map(str, v)) for k, v in loaded.items()},
    "sglang_params": sorted(shapes),
    "all_nonzero": all(bool(p.data.abs().sum() > 0) for p in params.values()),
}))
