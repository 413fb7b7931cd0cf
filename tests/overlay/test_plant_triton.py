"""The one-launch Triton plant rewrites exactly what ``DevicePlant.apply``'s torch ops do (and
so what the host plant and the CPU oracle model): swaps, inserts, removals with the smallest
free id, rows off the continuation, unknown requests, the log-prob profile. Under the Triton
interpreter on the CPU; lowered for sm_90 in a subprocess."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the device plant is torch")

from sglang_dflash.sglang_overlay.diagnostics import plant as p  # noqa: E402
from tests.ddtree.triton_env import (  # noqa: E402
    DEV,
    import_triton_module,
    lower_for_sm90,
)
from tests.overlay.test_plant import _random_case  # noqa: E402

pt = import_triton_module("sglang_dflash.sglang_overlay.diagnostics.plant_triton")
pytestmark = pytest.mark.usefixtures("triton_interpret")


@pytest.mark.parametrize("seed", range(60))
def test_triton_plant_equals_the_torch_plant(seed):
    spec, batch, prefix, roots, logp, ids = _random_case(seed, profile=seed % 2 == 0)
    dev = p.DevicePlant(spec, "cpu")
    rows = dev.row_index(batch)
    want_lp, want_ids = dev.apply(rows, torch.tensor(prefix), torch.tensor(roots), logp, ids)
    prof = dev._profile(ids.shape[-1], logp) if spec.logp_profile is not None else None
    plant = p.DevicePlant(spec, DEV)
    got_lp, got_ids = pt.apply_triton(
        plant, rows.to(DEV), torch.tensor(prefix, device=DEV), torch.tensor(roots, device=DEV),
        logp.to(DEV), ids.to(DEV), None if prof is None else prof.to(DEV))
    assert got_ids.dtype == want_ids.dtype and torch.equal(got_ids.cpu(), want_ids)
    assert torch.equal(got_lp.cpu(), want_lp)


def test_int32_ids_keep_their_dtype():
    spec, batch, prefix, roots, logp, ids = _random_case(3, profile=False)
    plant = p.DevicePlant(spec, DEV)
    want = plant.apply(plant.row_index(batch), torch.tensor(prefix, device=DEV),
                       torch.tensor(roots, device=DEV), logp.to(DEV), ids.to(DEV))[1]
    got = pt.apply_triton(plant, plant.row_index(batch), torch.tensor(prefix, device=DEV),
                          torch.tensor(roots, device=DEV), logp.to(DEV),
                          ids.int().to(DEV), None)[1]
    assert got.dtype == torch.int32 and torch.equal(got.long().cpu(), want.cpu())


def test_plant_kernel_compiles_for_sm90():
    code = """
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        from sglang_dflash.sglang_overlay.diagnostics import plant_triton as pt
        sig = {"rows_ptr": "*i64", "seq_ptr": "*i64", "roots_ptr": "*i64", "ids_ptr": "*i64",
               "logp_ptr": "*fp32", "cont_ptr": "*i64", "ranks_ptr": "*i64", "clen_ptr": "*i64",
               "prof_ptr": "*fp32", "out_ids_ptr": "*i64", "out_logp_ptr": "*fp32",
               "L": "i32", "WC": "i32", "HAS_PROFILE": "constexpr", "K": "constexpr",
               "KP": "constexpr", "VP": "constexpr"}
        for k in (16, 64):
            src = ASTSource(pt._plant_kernel, sig, constexprs={
                "HAS_PROFILE": True, "K": k, "KP": triton.next_power_of_2(k),
                "VP": triton.next_power_of_2(k + 2)})
            assert triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["cubin"]
        print("ok")
    """
    lower_for_sm90(code)
