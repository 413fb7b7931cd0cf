"""Two DDTree servers on one GPU behind ``sglang-dflash router`` against one reference server
(issue 17 item 5): greedy identity, output tok/s at c = 32, ``check --url`` through the router,
every request counted. The command is ``python -m router_pair.router_pair`` (module docstring
there); it reuses ``scripts/gpu_e2e.py``'s server helpers and ``real_drafter.serve_pair``'s
instance configs.
"""
