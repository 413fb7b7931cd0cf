"""ABI layer: fake torch/version.py, fake dist-infos, fake extensions raising real errors."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from sglang_dflash.check import abi
from sglang_dflash.pins import load_pins
from tests.check.fakes import (
    assert_passes_but_for_python,
    make_dist,
    make_extension,
    make_torch,
    pinned_stack,
    run_check,
)

# Verbatim (or near) from shared/research/nix-anchors.md §4.
UNDEFINED_SYMBOL = ("/site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: "
                    "_ZN5torch3jit17parseSchemaOrNameERKSsb")
CUDART_12 = "libcudart.so.12: cannot open shared object file: No such file or directory"
LIBCUDA = "libcuda.so.1: cannot open shared object file: No such file or directory"


def test_pinned_stack_passes(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site)
    rc, res, _err, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert_passes_but_for_python(rc, res)
    assert "torch 2.11.0+cu130, torch.version.cuda 13.0" in res["abi.torch"]["found"]
    assert res["abi.import.sgl_kernel"]["status"] == "PASS"
    assert res["abi.flashinfer-python"]["found"] == "flashinfer-python 0.6.15.post1 == pin"


def test_cpu_torch_fails(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site, torch="2.13.0+cpu", cuda=None)
    rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert rc == 1
    assert res["abi.torch"]["found"].startswith("CPU build of torch: torch 2.13.0+cpu")
    assert "torch==2.11.0" in res["abi.torch"]["fix"]


def test_wrong_torch_and_cuda_fail(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site, torch="2.11.0+cu128", cuda="12.8")
    _rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert "pin is CUDA 13.0" in res["abi.torch"]["found"]


def test_seed_extension_built_for_other_torch(tmp_path: Path) -> None:
    """Seed: extensions for torch 2.11.0+cu130 loaded by torch 2.9.1+cu128."""
    site = tmp_path / "site"
    pinned_stack(site, torch="2.9.1+cu128", cuda="12.8")
    make_extension(site, "sgl_kernel", UNDEFINED_SYMBOL)
    rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert rc == 1
    assert "pin is torch 2.11.0" in res["abi.torch"]["found"]
    imp = res["abi.import.sgl_kernel"]
    assert imp["status"] == "FAIL"
    assert "built for a different torch (found torch 2.9.1+cu128)" in imp["found"]
    assert "_ZN5torch3jit17parseSchemaOrNameERKSsb" in imp["found"]


def test_cudart_major_mismatch(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site)
    make_extension(site, "flashinfer", CUDART_12)
    _rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    found = res["abi.import.flashinfer"]["found"]
    assert "built for CUDA 12, torch has CUDA 13.0 (CUDA major mismatch)" in found


def test_missing_libcuda_skips_offline_fails_online(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site)
    make_extension(site, "sgl_kernel", LIBCUDA)
    rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert_passes_but_for_python(rc, res)
    assert res["abi.import.sgl_kernel"]["status"] == "SKIP"
    assert "driver library not available in this sandbox" in res["abi.import.sgl_kernel"]["found"]
    rc, res, _, _ = run_check("--layer", "abi", sites=(site,))
    assert rc == 1 and res["abi.import.sgl_kernel"]["status"] == "FAIL"


def test_versions_by_distribution_name_and_lockstep(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site)
    (site / "sglang_kernel-0.4.5.dist-info").rename(site / "unused")
    make_dist(site, "sglang-kernel", "0.4.4")
    make_dist(site, "flashinfer-cubin", "0.6.14")
    make_dist(site, "flashinfer-jit-cache", "0.6.15.post1")
    _rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert res["abi.sglang-kernel"]["found"] == "sglang-kernel 0.4.4, pin is 0.4.5"
    lock = res["abi.lockstep"]
    assert lock["status"] == "FAIL"
    assert lock["found"] == "flashinfer-cubin 0.6.14 != flashinfer-python 0.6.15.post1"


def test_not_installed_extension_is_skipped_not_imported(tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_torch(site, "2.11.0+cu130", "13.0")
    _rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    # The child sees this machine's site-packages too (CI installs triton for the Triton
    # interpreter tests), so what it reports for triton depends on the machine.
    triton_here = importlib.util.find_spec("triton") is not None
    expected = ("triton 3.6.0 == pin" if triton_here
                else "triton is not installed (pin 3.6.0)")
    assert res["abi.triton"]["found"] == expected
    assert res["abi.import.sgl_kernel"] == {
        "layer": "abi", "name": "import.sgl_kernel", "status": "SKIP",
        "found": "sglang-kernel is not installed", "fix": ""}


def test_hanging_import_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    make_extension(site, "imports_fine")
    make_extension(site, "hangs_at_import", sleep=30)
    make_extension(site, "never_reached")
    monkeypatch.setenv("PYTHONPATH", str(site))
    start = time.monotonic()
    out = abi.ExtensionImports(["imports_fine", "hangs_at_import", "never_reached"]).wait(1.5)
    assert time.monotonic() - start < 5
    assert out["imports_fine"] == abi.ImportOutcome("ok")
    assert out["hangs_at_import"] == abi.ImportOutcome("hung", "timed out after 1.5 s")
    assert out["never_reached"] == abi.ImportOutcome(
        "not-run", "not tried: importing hangs_at_import hung first")


def test_crashing_import_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site)
    (site / "sgl_kernel" / "__init__.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert rc == 1
    assert res["abi.import.sgl_kernel"]["found"].startswith(
        "import sgl_kernel crashed the interpreter (signal 11)")
    assert res["abi.import.flashinfer"]["status"] == "SKIP"
    assert "importing sgl_kernel crashed first" in res["abi.import.flashinfer"]["found"]


def test_import_errors_in_one_process_are_kept_apart(tmp_path: Path) -> None:
    site = tmp_path / "site"
    pinned_stack(site)
    make_extension(site, "sgl_kernel", UNDEFINED_SYMBOL)
    make_extension(site, "flashinfer", CUDART_12)
    _rc, res, _, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert "built for a different torch" in res["abi.import.sgl_kernel"]["found"]
    assert "CUDA major mismatch" in res["abi.import.flashinfer"]["found"]


@pytest.mark.parametrize(("text", "expected"), [
    (UNDEFINED_SYMBOL, "built for a different torch (found torch 2.9.1+cu128)"),
    ("ImportError: /x/common_ops.abi3.so: undefined symbol: "
     "_ZN3c1013MessageLoggerC1EPKciib", "built for a different torch"),
    ("[sgl_kernel] CRITICAL: Could not load any common_ops library! Attempted: "
     "sm100/common_ops.abi3.so", "built for a different torch"),
    ("ImportError: libcudart.so.13: cannot open shared object file", "built for CUDA 13"),
    ("RuntimeError: flashinfer-cubin version (0.6.14) does not match flashinfer version "
     "(0.6.15.post1). Set FLASHINFER_DISABLE_VERSION_CHECK=1", "flashinfer-cubin version"),
    ("RuntimeError: Error in dlopen for library libnvrtc.so.12and libnvrtc-1a2b3c4d.so.12",
     "libnvrtc.so.12 not loadable"),
    ("OSError: libnvJitLink.so.13: cannot open shared object file: No such file",
     "libnvJitLink.so.13 not loadable"),
    ("RuntimeError: CUDA driver is a stub library", "stub library"),
    ("UserWarning: CUDA initialization: The NVIDIA driver on your system is too old "
     "(found version 12040)", "driver too old"),
    ("RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't exist",
     "nvcc not found"),
    ("ModuleNotFoundError: No module named 'torch'", "no module named 'torch'"),
    # sgl_kernel's report lists the real cause beneath the CRITICAL line
    ("ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library!\n"
     "- ImportError: libnvrtc.so.13: cannot open shared object file\n"
     "- ModuleNotFoundError: No module named 'common_ops'\n"
     "GPU Info: Compute capability: 86, Expected variant: SM86, CUDA version: 13.0",
     "libnvrtc.so.13 not loadable"),
    ("RuntimeError: Found no NVIDIA driver on your system.", "needs a GPU"),
    ("ValueError: something else entirely", "failed: ValueError: something else entirely"),
])
def test_error_catalogue_translation(text: str, expected: str) -> None:
    torch = abi.TorchInfo("2.9.1+cu128", "12.8", Path("/t"))
    status, found, fix = abi.explain_import_error("sglang-kernel", "sgl_kernel", text, torch,
                                                  load_pins(), offline=False)
    assert status == "FAIL"
    assert expected in found
    assert fix


@pytest.mark.parametrize("text", [LIBCUDA, "RuntimeError: Found no NVIDIA driver on your system."])
def test_driverless_sandbox_errors_skip_only_offline(text: str) -> None:
    torch = abi.TorchInfo("2.11.0+cu130", "13.0", Path("/t"))
    status, found, _ = abi.explain_import_error("sglang-kernel", "sgl_kernel", text, torch,
                                                load_pins(), offline=True)
    assert status == "SKIP" and "sandbox" in found
    status, _, fix = abi.explain_import_error("sglang-kernel", "sgl_kernel", text, torch,
                                              load_pins(), offline=False)
    assert status == "FAIL" and fix
