"""Walk a verified tree: greedy (T=0) and lossless sampling (T>0), batched, no host syncs.

Same semantics as SGLang's ``verify_tree_greedy``: from the root, repeatedly move to the child
whose token equals the target's choice at the current node; the choice at the last accepted
node is the bonus. For T>0 the target's choice at every node is an independent draw from its
own distribution, which makes every committed token an exact sample from the target (the draft
only decides how many draws one forward validates) -- the rule of the DDTree reference and of
``tree_speculative_sampling_target_only`` with thresholds 1 and zero draft probs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .tree import DDTree


class WalkResult(NamedTuple):
    """Unpacks as (accept_index, accept_len, out_tokens, commit_lens); ``.bonus`` derived."""

    accept_index: torch.Tensor  # [bs, L+1] global flat node indices, root first, -1 padded
    accept_len: torch.Tensor  # [bs] accepted drafts, root excluded
    out_tokens: torch.Tensor  # [bs, L+1] committed tokens (bonus last), -1 padded
    commit_lens: torch.Tensor  # [bs] accept_len + 1

    @property
    def bonus(self) -> torch.Tensor:
        """[bs] the last committed token (the target's choice at the deepest accepted node)."""
        return self.out_tokens.gather(1, self.accept_len.unsqueeze(1)).squeeze(1)


def greedy_walk(tree: DDTree, target_predict: torch.Tensor) -> WalkResult:
    """Accept the longest root path whose tokens equal ``target_predict`` ``[bs, W]``.

    No loop over depth: a node is matched when its parent's prediction is its token (the
    first such sibling in link order, like the kernel's sibling scan), and it is accepted when
    every node on its root path is matched, i.e. its visibility row holds no unmatched node.
    A constant number of batched ops on ``[bs, W, W]``.
    """
    bs, width = tree.tokens.shape
    dev = tree.tokens.device
    depth_max = tree.max_depth
    pred = target_predict.to(device=dev, dtype=torch.long).reshape(bs, width)
    par = tree.parents.clamp(min=0)
    match = (tree.tokens == pred.gather(1, par)) & tree.valid & (tree.parents >= 0)
    # keep only the first matching sibling (duplicate sibling tokens never come from
    # build_tree, but the kernel's scan order decides them, so we do too)
    same_par = tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)  # [bs, i, j]
    earlier = torch.ones(width, width, dtype=torch.bool, device=dev).tril(-1)
    match &= ~(same_par & earlier & match.unsqueeze(1)).any(2)
    match[:, 0] = True  # the root is always accepted
    accepted = ~(tree.visibility & ~match.unsqueeze(1)).any(2)  # [bs, W]
    accept_len = accepted.sum(1) - 1
    # accepted nodes have distinct depths 0..accept_len: place each at its depth
    ar = torch.arange(width, device=dev).expand(bs, -1)
    slot = torch.where(accepted, tree.depths, depth_max + 1)
    local = torch.full((bs, depth_max + 2), -1, dtype=torch.long, device=dev)
    local = local.scatter(1, slot, ar)[:, : depth_max + 1]
    out = torch.where(local >= 0, pred.gather(1, local.clamp(min=0)), -1)
    rows = torch.arange(bs, device=dev).unsqueeze(1) * width
    accept_index = torch.where(local >= 0, local + rows, -1)
    return WalkResult(accept_index, accept_len, out, accept_len + 1)


def sample_targets(
    target: torch.Tensor,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    target_is_probs: bool = False,
) -> torch.Tensor:
    """One independent draw per node from ``target`` ``[bs, W, V]`` (logits or probs).

    ``temperature`` is a float or a ``[bs]`` tensor; rows with T <= 1e-5 take the argmax.
    """
    bs, width, vocab = target.shape
    flat = target.reshape(bs * width, vocab).float()
    if target_is_probs:
        return torch.multinomial(flat, 1, generator=generator).view(bs, width)
    if isinstance(temperature, torch.Tensor):
        temp = temperature.to(device=target.device, dtype=torch.float32).expand(bs)
    else:  # a Python float: no host-to-device copy
        temp = torch.full((bs,), float(temperature), device=target.device)
    greedy = temp <= 1e-5
    t_rows = torch.where(greedy, 1.0, temp).repeat_interleave(width).unsqueeze(1)
    probs = torch.softmax(flat / t_rows, dim=-1)
    drawn = torch.multinomial(probs, 1, generator=generator).view(bs, width)
    return torch.where(greedy.unsqueeze(1), flat.argmax(-1).view(bs, width), drawn)


def sample_walk(
    tree: DDTree,
    target: torch.Tensor,
    temperature: float | torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    target_is_probs: bool = False,
) -> WalkResult:
    """Lossless T>0 walk: draw y ~ target at the current node, follow the child equal to y."""
    y = sample_targets(target, temperature, generator, target_is_probs=target_is_probs)
    return greedy_walk(tree, y)
