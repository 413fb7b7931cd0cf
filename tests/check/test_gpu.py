"""GPU layer: pure evaluation of recorded facts, plus the real probe subprocess.

This machine has no GPU, so the real path must give a clear FAIL; device failures and
hangs are reproduced with a fake `torch` package that the probe subprocess imports.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from sglang_dflash.check import gpu
from sglang_dflash.pins import load_pins
from tests.check.fakes import run_check

# Recorded on the H200 host (shared/research/gpu-probe.md): driver 580.159.04, torch
# 2.11.0+cu130. The arch list is torch 2.11.0+cu130's.
H200_PROC = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
             "Build  (dvs-builder@U22-I3-AE18-23-3)  Thu Nov 20 02:02:03 UTC 2025\n"
             "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
H200_FACTS = {
    "driver_api": 13000, "torch_version": "2.11.0+cu130", "torch_cuda": "13.0",
    "cuda_available": True, "device_count": 1, "warnings": [],
    "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
    "devices": [{"index": 0, "name": "NVIDIA H200", "capability": [9, 0], "ok": True}],
}
HOST_OK = gpu.HostFacts(proc_driver=H200_PROC, nvcc="/usr/local/cuda/bin/nvcc",
                        nvcc_release="13.0",
                        libcuda_dirs=["/usr/lib/x86_64-linux-gnu"],
                        nvrtc="/site/nvidia/cu13/lib/libnvrtc.so.13")

FAKE_TORCH = '''
import os, time
__version__ = "2.11.0+cu130"
class version:
    cuda = "13.0"
float32 = "float32"
class _T:
    def __init__(self, vals): self.vals = vals
    def __mul__(self, k): return _T([v * k for v in self.vals])
    def sum(self): return _T([sum(self.vals)])
    def item(self): return self.vals[0]
def arange(n, device, dtype):
    i = int(device.split(":")[1])
    if str(i) == os.environ.get("FAKE_GPU_HANG"):
        time.sleep(60)
    if str(i) == os.environ.get("FAKE_GPU_BAD"):
        raise RuntimeError("CUDA error: unspecified launch failure")
    return _T(list(range(n)))
class cuda:
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: int(os.environ.get("FAKE_GPU_N", "2")))
    get_arch_list = staticmethod(lambda: ["sm_80", "sm_90"])
    get_device_name = staticmethod(lambda i: "Fake H200")
    get_device_capability = staticmethod(lambda i: (9, 0))
    synchronize = staticmethod(lambda i=None: None)
'''


def ids(results) -> dict[str, tuple[str, str]]:
    return {r.id: (r.status, r.found) for r in results}


def test_h200_recording_passes() -> None:
    res = gpu.evaluate(H200_FACTS, "", HOST_OK, load_pins())
    assert all(r.status == "PASS" for r in res), [r for r in res if r.status != "PASS"]
    got = ids(res)
    assert got["gpu.driver"][1] == "driver branch 580 >= 580"
    assert got["gpu.arch0"][1] == "GPU 0 compute capability 9.0: sm_90"


def test_old_driver_fails_with_both_numbers() -> None:
    facts = dict(H200_FACTS, driver_api=12040, warnings=[
        "CUDA initialization: The NVIDIA driver on your system is too old (found version "
        "12040)."])
    proc = H200_PROC.replace("580.159.04", "550.54.15")
    res = ids(gpu.evaluate(facts, "", gpu.HostFacts(**{**HOST_OK.__dict__,
                                                      "proc_driver": proc}), load_pins()))
    assert res["gpu.driver_api"][0] == "FAIL" and "12040 < 13000" in res["gpu.driver_api"][1]
    assert res["gpu.driver"] == ("FAIL", "driver branch 550 < 580")


def test_failing_device_is_named_by_index() -> None:
    facts = dict(H200_FACTS, device_count=2, devices=[
        {"index": 0, "name": "NVIDIA RTX A6000", "capability": [8, 6], "ok": True},
        {"index": 1, "name": "NVIDIA RTX A6000", "capability": [8, 6], "ok": False,
         "error": "RuntimeError: CUDA error: unspecified launch failure"}])
    res = ids(gpu.evaluate(facts, "", HOST_OK, load_pins()))
    assert res["gpu.device0"][0] == "PASS"
    assert res["gpu.device1"][0] == "FAIL"
    assert res["gpu.device1"][1].startswith("GPU 1 (NVIDIA RTX A6000): kernel failed")


def test_arch_not_in_torch_list_and_ptx_fallback() -> None:
    assert gpu.arch_supported([12, 0], ["sm_80", "sm_90"]) is None
    assert gpu.arch_supported([12, 1], ["sm_90", "compute_90"]) == "compute_90 (PTX JIT)"
    assert gpu.arch_supported([10, 0], ["sm_100a"]) == "sm_100"
    facts = dict(H200_FACTS, arch_list=["sm_80", "sm_90"], devices=[
        {"index": 0, "name": "RTX PRO 6000 Blackwell", "capability": [12, 0], "ok": True}])
    assert ids(gpu.evaluate_arch(facts))["gpu.arch0"][0] == "FAIL"


def test_missing_jit_needs_each_named() -> None:
    res = ids(gpu.evaluate_jit(gpu.HostFacts(nvrtc_tried=["libnvrtc.so.13"]), load_pins()))
    assert res["gpu.nvcc"][0] == "FAIL" and "Could not find nvcc" in res["gpu.nvcc"][1]
    assert res["gpu.libcuda"][0] == "FAIL" and "TRITON_LIBCUDA_PATH" in res["gpu.libcuda"][1]
    assert res["gpu.nvrtc"] == ("FAIL", "libnvrtc.so.13 not loadable (tried libnvrtc.so.13)")
    old = gpu.HostFacts(nvcc="/usr/local/cuda-12.8/bin/nvcc", nvcc_release="12.8")
    assert ids(gpu.evaluate_jit(old, load_pins()))["gpu.nvcc"] == (
        "FAIL", "nvcc at /usr/local/cuda-12.8/bin/nvcc is CUDA 12.8, JIT needs CUDA 13.0")


def test_probe_failure_and_hang_message() -> None:
    res = ids(gpu.evaluate(None, "GPU 3 hung: no answer within 120 s", HOST_OK, load_pins()))
    assert res["gpu.probe"] == ("FAIL", "GPU 3 hung: no answer within 120 s")
    assert gpu.hang_message("START 0\nDONE 0\nSTART 1\n", 5) == "GPU 1 hung: no answer within 5 s"
    assert gpu.hang_message("", 5) == "CUDA initialisation hung: no answer within 5 s"
    assert gpu.driver_branch(H200_PROC) == 580
    assert gpu.driver_branch("garbage") is None


def test_real_probe_on_this_machine_fails_clearly(tmp_path: Path) -> None:
    """No GPU here: the real subprocess path must say so, not crash or pass."""
    rc, res, err, _ = run_check("--layer", "gpu", cwd=tmp_path)
    assert rc == 1, err
    devices = res.get("gpu.devices") or res.get("gpu.probe")
    assert devices["status"] == "FAIL"
    if "gpu.devices" in res:
        # the probe imports torch; without it the line says so (the README's set-up has it)
        no_torch = importlib.util.find_spec("torch") is None
        want = "import torch failed: ModuleNotFoundError" if no_torch else "no CUDA device visible"
        assert want in devices["found"], devices
    assert {"gpu.nvcc", "gpu.libcuda", "gpu.nvrtc"} <= res.keys()


def test_offline_skips_gpu_layer(tmp_path: Path) -> None:
    rc, res, _, _ = run_check("--layer", "gpu", "--offline", cwd=tmp_path)
    assert rc == 0
    assert res["gpu.all"]["status"] == "SKIP" and "--offline" in res["gpu.all"]["found"]


@pytest.fixture
def fake_torch_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return site


def test_probe_subprocess_names_failing_device(fake_torch_site: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_torch_site))
    monkeypatch.setenv("FAKE_GPU_N", "3")
    monkeypatch.setenv("FAKE_GPU_BAD", "2")
    facts, err = gpu.run_probe(timeout=30)
    assert err == ""
    res = ids(gpu.evaluate_devices(facts))
    assert [res[f"gpu.device{i}"][0] for i in range(3)] == ["PASS", "PASS", "FAIL"]
    assert "unspecified launch failure" in res["gpu.device2"][1]


def test_probe_subprocess_hang_is_bounded_and_named(fake_torch_site: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_torch_site))
    monkeypatch.setenv("FAKE_GPU_HANG", "1")
    start = time.monotonic()
    facts, err = gpu.run_probe(timeout=3)
    assert time.monotonic() - start < 8
    assert facts is None
    assert err == "GPU 1 hung: no answer within 3 s"
