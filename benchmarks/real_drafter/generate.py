"""The target's greedy continuations (the drafter's labels and the evaluation's ground truth)
and its context features (the residual stream after the ``target_layer_ids`` layers)."""

from __future__ import annotations

import torch


@torch.no_grad()
def greedy_continue(model, prompts: list[list[int]], new_tokens: int, device,
                    batch: int) -> list[list[int]]:
    """Greedy ``new_tokens`` after each prompt (EOS ignored, as a server with ``ignore_eos``).

    Batches are left-padded with an attention mask and explicit positions, so a prompt's
    continuation does not depend on its batch-mates; KV-cached decoding.
    """
    out: list[list[int]] = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        att = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, p in enumerate(chunk):
            ids[r, width - len(p) :] = torch.tensor(p)
            att[r, width - len(p) :] = 1
        ids, att = ids.to(device), att.to(device)
        pos = (att.cumsum(1) - 1).clamp(min=0)
        res = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True)
        past = res.past_key_values
        nxt = res.logits[:, -1].argmax(-1)
        gen = [nxt]
        last = pos[:, -1]
        for _ in range(new_tokens - 1):
            att = torch.cat([att, torch.ones_like(att[:, :1])], dim=1)
            last = last + 1
            res = model(input_ids=nxt[:, None], attention_mask=att, position_ids=last[:, None],
                        past_key_values=past, use_cache=True)
            past = res.past_key_values
            nxt = res.logits[:, -1].argmax(-1)
            gen.append(nxt)
        g = torch.stack(gen, 1).cpu().tolist()
        out.extend(g)
    return out


class FeatureTap:
    """Forward hooks on the target's decoder layers that keep the outputs of ``layer_ids``
    (HF's layer output = the residual stream = SGLang's ``hidden + residual`` before layer+1)."""

    def __init__(self, model, layer_ids):
        self.layer_ids = list(layer_ids)
        self.store: dict[int, torch.Tensor] = {}
        layers = model.model.layers
        self.handles = [layers[i].register_forward_hook(self._hook(i)) for i in self.layer_ids]

    def _hook(self, i):
        def fn(_mod, _inp, out):
            self.store[i] = out[0] if isinstance(out, tuple) else out
        return fn

    def features(self) -> torch.Tensor:
        return torch.cat([self.store[i] for i in self.layer_ids], dim=-1)

    def close(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def target_features(model, tokens: torch.Tensor, layer_ids, batch: int) -> torch.Tensor:
    """Context features ``[N, T, F*H]`` (model dtype) of right-padded ``tokens`` ``[N, T]``;
    causal attention makes right padding invisible to real positions."""
    tap = FeatureTap(model, layer_ids)
    try:
        outs = []
        for i in range(0, tokens.shape[0], batch):
            model.model(input_ids=tokens[i : i + batch], use_cache=False)  # no lm_head
            outs.append(tap.features())
        return torch.cat(outs, 0)
    finally:
        tap.close()
