"""DDTree algorithm core: top-K head, best-first tree under a node budget, masks, walks.

Everything here is batched torch on whatever device the inputs live on and never syncs with
the host (no ``.item()``/``.tolist()``/``.cpu()``), so it can run inside SGLang's overlap
scheduler. Import the submodules directly; this package file stays torch-free so that
``import sglang_dflash`` works in environments without torch.
"""
