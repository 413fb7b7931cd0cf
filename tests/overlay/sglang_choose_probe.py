"""Runs INSIDE the SGLang CPU env: the worker tells the policy which round follows a prefill.

``DDTreeWorkerV2.forward_batch_generation`` on an extend batch (SGLang's own forward replaced
by a stand-in) and then ``_choose_budget`` round after round, with the real ``AdaptivePolicy``
wrapped to record its arguments. The policy's slot is set as after a chain request at bs 1
(current 15, every cost measured), so what comes out is what the GPU run depends on: the
round after the prefill is chosen with ``after_prefill`` and keeps 15, the next one probes 64,
and the flag does not stick. Prints one ``PROBE-JSON`` object.
"""

from __future__ import annotations

from types import SimpleNamespace

from probe_output import report  # a sibling: the scripts run from this directory


def main() -> dict:
    from sglang_dflash.sglang_overlay import policy as P
    from sglang_dflash.sglang_overlay import worker as W

    parent = W.DDTreeWorkerV2.__mro__[1]
    parent.forward_batch_generation = lambda self, batch, *a, **k: "extend-forward"
    pol = P.AdaptivePolicy(P.parse_schedule("1:0,15,64", 64), fresh_gap=4)
    s = pol.slot(1)
    s.accept, s.cost, s.current = {0: 1.0, 15: 16.0, 64: 16.0}, {0: 5, 15: 6, 64: 6.5}, 15
    pol._cost_seen = {(1, n): 9 for n in (0, 15, 64)}
    s.since_probe, s.probe_every = 16, 256
    seen_args = []
    real_choose = pol.choose

    def choose(key, fresh=0.0, **kw):
        seen_args.append({"key": key, "fresh": fresh, **kw})
        return real_choose(key, fresh, **kw)

    pol.choose = choose
    w = object.__new__(W.DDTreeWorkerV2)
    w._policy = pol
    w._meter = SimpleNamespace(drain=lambda: [], interrupt=lambda: None)
    w._round_steps = None
    w._graph_bs = [1, 2, 4, 8]
    w._seen_rids = {"a"}
    w._wall_prev = None
    w._after_prefill = False
    w._policy_rounds = 0
    w.ps = SimpleNamespace(tp_rank=1)
    w._active_budget = 15
    w._targets = {n: (f"backend-{n}", f"graphs-{n}") for n in (0, 15, 64)}
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace())
    mode = SimpleNamespace(is_extend=lambda: True, is_idle=lambda: False)
    extend = SimpleNamespace(forward_mode=mode, is_extend_in_batch=True)
    out = w.forward_batch_generation(extend)
    flag_after_extend = w._after_prefill
    batch = SimpleNamespace(reqs=[SimpleNamespace(rid="b")])
    budgets = [w._choose_budget(batch, 1)[0] for _ in range(3)]
    return {"extend_result": out, "flag_after_extend": flag_after_extend,
            "budgets": budgets, "after_prefill": [a.get("after_prefill") for a in seen_args],
            "fresh": [a["fresh"] for a in seen_args], "flag_now": w._after_prefill,
            "runner_backend": w._target_worker.model_runner.attn_backend}


if __name__ == "__main__":
    report(main)
