"""Every row of the error-message catalogue (shared/research/nix-anchors.md §4) is accounted
for by `sglang-dflash check`: either a check line that names the cause and a fix, or an
entry in NOT_CHECK_TIME saying why the message cannot occur when the check runs.

Messages are fed through the real code paths: the import-error translator (pure), the GPU
layer's evaluation of recorded probe facts (pure), the host-fact finders on real files, and
`python -m sglang_dflash check --json` on one broken fake tree (a real subprocess).
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_dflash.check import abi, gpu
from sglang_dflash.check.result import FAIL, SKIP, Result, render_line
from sglang_dflash.pins import load_pins
from tests.check.fakes import REPO, make_dist, make_extension, pinned_stack, run_check

PINS = load_pins()
TORCH_OK = abi.TorchInfo("2.11.0+cu130", "13.0", Path("/site/torch"))
TORCH_CU128 = abi.TorchInfo("2.9.1+cu128", "12.8", Path("/site/torch"))

# row -> (message, verbatim or near, as users report it; source named in the catalogue)
CATALOGUE: dict[int, tuple[str, str]] = {
    1: ("ImportError: /site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: "
        "_ZN5torch3jit17parseSchemaOrNameERKSsb", "sgl-project/sglang#5100"),
    2: ("ImportError: /site/sgl_kernel/sm90/common_ops.abi3.so: undefined symbol: "
        "_ZN3c1013MessageLoggerC1EPKciib", "sgl-project/sglang PR #30562, #29317"),
    3: ("ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library!\n"
        "Attempted locations:\n  /site/sgl_kernel/sm100/common_ops.abi3.so\n"
        "  /site/sgl_kernel/common_ops.abi3.so (fallback)\n"
        "GPU Info: Compute capability: 100, Expected variant: SM100",
        "sgl-project/sglang PR #17460"),
    4: ("ImportError: libcudart.so.12: cannot open shared object file: No such file or "
        "directory", "sgl-project/sglang#2584; vllm-project/vllm#52300"),
    5: ("UserWarning: CUDA initialization: The NVIDIA driver on your system is too old "
        "(found version 12040). Please update your GPU driver by downloading and installing "
        "a new version from the URL: http://www.nvidia.com/Download/index.aspx",
        "sgl-project/sglang#11395; pytorch/pytorch#162531"),
    6: ("RuntimeError: flashinfer-cubin version (0.6.14) does not match flashinfer version "
        "(0.6.15.post1). Please install the same version of both packages. Set "
        "FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check.",
        "vllm-project/vllm#49804; NVIDIA-NeMo/Export-Deploy#679"),
    7: ("RuntimeError: Could not find nvcc and default cuda_home='/usr/local/cuda' doesn't "
        "exist", "NVIDIA-NeMo/Gym#1405; flashinfer-ai/flashinfer#1904"),
    8: ("RuntimeError: Ninja build failed: /cache/flashinfer/norm.cu:3:10: fatal error: "
        "cuda_fp8.h: No such file or directory",
        "sgl-project/sglang#5389; CarlSchader/sglang-nix docs/usage.md"),
    9: ("FileNotFoundError: [Errno 2] No such file or directory: '/sbin/ldconfig'",
        "sgl-project/sglang#1226; utensils/comfyui-nix#60"),
    10: ("AssertionError: libcuda.so cannot found!",
         "triton-lang/triton#1981, #3053, #8667"),
    11: ("RuntimeError: Error in dlopen for library libnvrtc.so.12and "
         "libnvrtc-1a2b3c4d.so.12", "utensils/comfyui-nix#71"),
    12: ("Failed to initialize NVML: Driver/library version mismatch",
         "abysssol/ollama-flake#4"),
    13: ("RuntimeError: CUDA driver is a stub library", "ggml-org/llama.cpp#4605"),
    14: ("Exception: flashinfer_python with minimum required version 0.2.5 is not installed. "
         "Please uninstall the old version and reinstall the latest version",
         "sgl-project/sglang#6160"),
    15: ("PyTorch version : 2.9.1+cpu", "vllm-project/vllm#36099"),
    16: ("auto-patchelf: 1 dependencies could not be satisfied: libnvJitLink.so.12 wanted by "
         "/nix/store/...-nvidia-cusparse-cu12/lib/libcusparse.so.12",
         "pyproject-nix/uv2nix#31"),
    17: ("UserWarning: CUDA initialization: CUDA unknown error - this may be due to an "
         "incorrectly set up environment, e.g. changing env variable CUDA_VISIBLE_DEVICES "
         "after program start. Setting the available devices to be zero.",
         "nix-community/dream2nix#698"),
}

# Rows whose message the check can never see, and why (asserted, not skipped).
NOT_CHECK_TIME: dict[int, str] = {
    16: "build time: autoPatchelfHook fails the Nix build of the nvidia wheel before any "
        "sglang-dflash exists to run; the fix is in the Nix package (the sibling nvidia-* "
        "wheels as buildInputs). If the build was forced through (autoPatchelfIgnoreMissingDeps) "
        "the library is missing at run time, which the abi import check reports",
}


def translate(text: str, torch: abi.TorchInfo | None = TORCH_OK, offline: bool = False,
              dist: str = "sglang-kernel", module: str = "sgl_kernel") -> Result:
    status, found, fix = abi.explain_import_error(dist, module, text, torch, PINS, offline)
    return Result(abi.LAYER, f"import.{module}", status, found, fix)


def by_id(results: list[Result]) -> dict[str, Result]:
    return {r.id: r for r in results}


def assert_line(r: Result | dict, cause: str, fix: str, status: str = FAIL) -> None:
    """The rendered line says FAIL/SKIP, names the cause and (for FAIL) carries a fix."""
    r = r if isinstance(r, Result) else Result(**r)
    line = render_line(r)
    assert r.status == status, line
    assert cause in r.found, line
    if status == FAIL:
        assert r.fix and fix in r.fix, line
        assert " — fix: " in line


def no_device_facts(warning: str) -> dict:
    """What the GPU probe records when torch's CUDA initialisation warns and finds nothing."""
    return {"driver_api": 13000, "torch_version": "2.11.0+cu130", "torch_cuda": "13.0",
            "cuda_available": False, "device_count": 0, "arch_list": [], "devices": [],
            "warnings": [warning.removeprefix("UserWarning: ")]}


HOST_OK = gpu.HostFacts(proc_driver="NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                        "580.159.04  Release Build", nvcc="/usr/local/cuda/bin/nvcc",
                        nvcc_release="13.0", libcuda_dirs=["/usr/lib/x86_64-linux-gnu"],
                        nvrtc="/site/nvidia/cu13/lib/libnvrtc.so.13")


@pytest.fixture(scope="module")
def broken_tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """One fake site that reproduces rows 1, 6, 14 and 15 at once; checked in a subprocess."""
    site = tmp_path_factory.mktemp("catalogue") / "site"
    pinned_stack(site, torch="2.9.1+cpu", cuda=None)                      # row 15
    make_extension(site, "sgl_kernel", CATALOGUE[1][0].removeprefix("ImportError: "))  # row 1
    make_extension(site, "flashinfer", CATALOGUE[6][0])                    # row 6 (import)
    shutil.rmtree(next(site.glob("flashinfer_python-*.dist-info")))
    make_dist(site, "flashinfer-python", "0.2.4")                          # row 14
    make_dist(site, "flashinfer-cubin", "0.6.14")                          # row 6 (metadata)
    rc, res, err, _ = run_check("--layer", "abi", "--offline", sites=(site,))
    assert rc == 1, err
    return res


# --- one case per catalogue row ---------------------------------------------------------

def row1(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[1][0], TORCH_CU128),
                "undefined symbol _ZN5torch3jit17parseSchemaOrNameERKSsb — sglang-kernel was "
                "built for a different torch (found torch 2.9.1+cu128)", "torch==2.11.0+cu130")
    assert_line(tree["abi.import.sgl_kernel"], "built for a different torch (found torch "
                "2.9.1+cpu)", "install sglang-kernel==0.4.5 together with torch==2.11.0+cu130")


def row2(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[2][0]), "undefined symbol _ZN3c1013MessageLogger",
                "torch==2.11.0+cu130")
    demangled = "ImportError: common_ops.abi3.so: undefined symbol: c10::MessageLogger::" \
        "MessageLogger(char const*, int, int, bool)"
    assert_line(translate(demangled), "built for a different torch", "torch==2.11.0+cu130")


def row3(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[3][0], TORCH_CU128),
                "import sgl_kernel failed — sglang-kernel was built for a different torch "
                "(found torch 2.9.1+cu128)", "together with torch==2.11.0+cu130")


def row4(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[4][0], TORCH_OK),
                "libcudart.so.12 not loadable — sglang-kernel was built for CUDA 12, torch has "
                "CUDA 13.0 (CUDA major mismatch)", "install the CUDA 13.0 builds of torch")
    cudart13 = CATALOGUE[4][0].replace(".so.12", ".so.13")
    assert_line(translate(cudart13, TORCH_CU128), "built for CUDA 13, torch has CUDA 12.8",
                "CUDA 13.0 builds")
    # same major as torch: not a mismatch, the runtime library itself is missing
    assert_line(translate(cudart13, TORCH_OK), "the CUDA 13 runtime torch 2.11.0+cu130 needs "
                "is not on the loader path", "nvidia-cuda-runtime for CUDA 13")


def row5(tree: dict, tmp: Path) -> None:
    facts = dict(no_device_facts(CATALOGUE[5][0]), driver_api=12040)
    res = by_id(gpu.evaluate(facts, "", HOST_OK, PINS))
    assert_line(res["gpu.driver_api"], "driver API 12040 < 13000", "driver >= 580")
    assert_line(res["gpu.devices"], "NVIDIA driver too old for CUDA 13.0 (found version "
                "12040)", "upgrade the driver to >= 580")
    assert_line(translate(CATALOGUE[5][0]), "driver too old for CUDA 13.0", ">= 580")


def row6(tree: dict, tmp: Path) -> None:
    assert_line(tree["abi.lockstep"], "flashinfer-cubin 0.6.14 != flashinfer-python 0.2.4",
                "same version of every flashinfer package")
    assert_line(tree["abi.import.flashinfer"], "flashinfer-cubin version (0.6.14) does not "
                "match", "FLASHINFER_DISABLE_VERSION_CHECK=1 only hides it")
    jit = CATALOGUE[6][0].replace("flashinfer-cubin", "flashinfer-jit-cache")
    assert_line(translate(jit, dist="flashinfer-python", module="flashinfer"),
                "flashinfer-jit-cache version (0.6.14) does not match flashinfer version "
                "(0.6.15.post1)", "same version")


def row7(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[7][0], dist="flashinfer-python", module="flashinfer"),
                "nvcc not found", "set CUDA_HOME to a CUDA 13.0 toolkit")
    res = by_id(gpu.evaluate_jit(gpu.HostFacts(nvrtc_tried=["libnvrtc.so.13"]), PINS))
    assert_line(res["gpu.nvcc"], "nvcc not found in $CUDA_HOME/bin or PATH (FlashInfer JIT: "
                "'Could not find nvcc')", "set CUDA_HOME to a CUDA 13.0 toolkit")


def row8(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[8][0], dist="flashinfer-python", module="flashinfer"),
                "JIT compile cannot find cuda_fp8.h — CUDA toolkit headers are not on the "
                "include path", "cuda_cudart's dev output")
    assert_line(translate("fatal error: cuda_runtime.h: No such file or directory"),
                "cannot find cuda_runtime.h", "CPATH")
    # a real toolkit tree whose include/ lacks cuda_fp8.h (nvcc alone, as in a bare cuda_nvcc)
    nvcc = tmp / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    (tmp / "cuda" / "include").mkdir()
    (tmp / "cuda" / "include" / "cuda_runtime.h").write_text("")
    missing = gpu.missing_headers(str(nvcc), {})
    assert missing == ["cuda_fp8.h"]
    host = gpu.HostFacts(nvcc=str(nvcc), nvcc_release="13.0", missing_headers=missing)
    assert_line(by_id(gpu.evaluate_jit(host, PINS))["gpu.cuda_headers"],
                f"cuda_fp8.h not found beside {nvcc}", "add its include/ to CPATH")
    extra = tmp / "cudart-dev" / "include"
    extra.mkdir(parents=True)
    (extra / "cuda_fp8.h").write_text("")
    assert gpu.missing_headers(str(nvcc), {"CPATH": str(extra)}) == []


def row9(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[9][0], dist="triton", module="triton"),
                "Triton looked for libcuda with /sbin/ldconfig, which does not exist",
                "TRITON_LIBCUDA_PATH")
    assert_line(translate(CATALOGUE[9][0], offline=True), "no driver in this sandbox",
                "", status=SKIP)
    res = by_id(gpu.evaluate_jit(gpu.HostFacts(nvcc="/x/nvcc", nvcc_release="13.0"), PINS))
    assert_line(res["gpu.libcuda"], "libcuda.so not found via TRITON_LIBCUDA_PATH, "
                "/run/opengl-driver/lib or ldconfig", "set TRITON_LIBCUDA_PATH")


def row10(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[10][0], dist="triton", module="triton"),
                "needs libcuda.so: driver library not available", "TRITON_LIBCUDA_PATH")
    assert_line(translate("/usr/bin/ld: cannot find -lcuda: No such file or directory\n"
                          "collect2: error: ld returned 1 exit status", dist="triton",
                          module="triton"), "needs -lcuda", "TRITON_LIBCUDA_PATH")
    res = by_id(gpu.evaluate_jit(gpu.HostFacts(), PINS))
    assert_line(res["gpu.libcuda"], "(Triton: 'libcuda.so cannot found')", "TRITON_LIBCUDA_PATH")


def row11(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[11][0]), "libnvrtc.so.12 not loadable",
                "put their lib dirs on the loader path")
    tried = [str(tmp / "nvidia" / "cu13" / "lib" / "libnvrtc.so.13")]
    assert gpu.find_nvrtc(tried) is None  # real dlopen of a path that is not there
    res = by_id(gpu.evaluate_jit(gpu.HostFacts(nvrtc_tried=tried), PINS))
    assert_line(res["gpu.nvrtc"], f"libnvrtc.so.13 not loadable (tried {tried[0]})",
                "nvidia-cuda-nvrtc for CUDA 13")


def row12(tree: dict, tmp: Path) -> None:
    torch_warning = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did "
                     "you run some cuda functions before calling NumCudaDevices() that might "
                     "have already set an error? Error 803: system has unsupported display "
                     "driver / cuda driver combination")
    res = by_id(gpu.evaluate_devices(no_device_facts(torch_warning), PINS))
    assert_line(res["gpu.devices"], "driver libraries do not match the loaded kernel module",
                "reboot (or reload the nvidia kernel module)")
    assert_line(translate(CATALOGUE[12][0]), "(Driver/library version mismatch)", "reboot")
    assert_line(translate("nvml vram init failure: 18"), "do not match the loaded kernel",
                "/run/opengl-driver/lib")


def row13(tree: dict, tmp: Path) -> None:
    assert_line(translate(CATALOGUE[13][0]), "the CUDA driver loaded is a stub library",
                "remove the stub libcuda.so")
    warning = ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 34: "
               "CUDA driver is a stub library")
    assert_line(by_id(gpu.evaluate_devices(no_device_facts(warning), PINS))["gpu.devices"],
                "stub library", "LD_LIBRARY_PATH/RUNPATH")


def row14(tree: dict, tmp: Path) -> None:
    assert_line(tree["abi.flashinfer-python"], "flashinfer-python 0.2.4, pin is 0.6.15.post1",
                "install flashinfer-python==0.6.15.post1")
    assert_line(translate(CATALOGUE[14][0], module="sglang", dist="sglang"),
                "flashinfer_python >= 0.2.5 required but its distribution metadata is missing "
                "or older", "install flashinfer-python at its pin")
    assert_line(abi.check_distribution("flashinfer-python", None, "0.6.15.post1"),
                "flashinfer-python is not installed", "flashinfer-python==0.6.15.post1")


def row15(tree: dict, tmp: Path) -> None:
    assert_line(tree["abi.torch"], "CPU build of torch: torch 2.9.1+cpu, torch.version.cuda "
                "None", "install torch==2.11.0 built for CUDA 13.0")
    # `torch.version.cuda is None` without a +cpu tag (a default non-CUDA wheel)
    plain = abi.TorchInfo("2.11.0", None, Path("/site/torch"))
    assert_line(abi.check_torch(plain, PINS), "CPU build of torch", "cu130")


def row16(tree: dict, tmp: Path) -> None:
    reason = NOT_CHECK_TIME[16]
    assert "build time" in reason and "autoPatchelf" in reason
    assert "auto-patchelf" in CATALOGUE[16][0]
    # the run-time consequence of forcing the build through is reported by the import check
    assert_line(translate("ImportError: libnvJitLink.so.12: cannot open shared object file: "
                          "No such file or directory"), "libnvJitLink.so.12 not loadable",
                "lib dirs on the loader path")


def row17(tree: dict, tmp: Path) -> None:
    res = by_id(gpu.evaluate(no_device_facts(CATALOGUE[17][0]), "", HOST_OK, PINS))
    assert_line(res["gpu.devices"], "'CUDA unknown error' (no access to the device nodes",
                "DeviceAllow")
    assert res["gpu.driver_api"].status == "PASS"  # the driver itself is fine
    assert_line(translate(CATALOGUE[17][0]), "CUDA unknown error", "/dev/nvidia-uvm")


CASES: dict[int, Callable[[dict, Path], None]] = {
    1: row1, 2: row2, 3: row3, 4: row4, 5: row5, 6: row6, 7: row7, 8: row8, 9: row9,
    10: row10, 11: row11, 12: row12, 13: row13, 14: row14, 15: row15, 16: row16, 17: row17,
}


@pytest.mark.parametrize("row", sorted(CATALOGUE), ids=lambda r: f"row{r:02d}")
def test_catalogue_row(row: int, broken_tree: dict, tmp_path: Path) -> None:
    CASES[row](broken_tree, tmp_path)


def test_every_row_is_either_checked_or_documented_as_not_check_time() -> None:
    assert sorted(CATALOGUE) == list(range(1, 18))
    assert sorted(CASES) == sorted(CATALOGUE)
    assert set(NOT_CHECK_TIME) <= set(CATALOGUE)
    assert all(len(reason) > 40 for reason in NOT_CHECK_TIME.values())


def test_unrecognised_message_still_fails_with_its_last_line() -> None:
    """Guard: the translator does not claim to know messages it does not."""
    r = translate("Traceback...\nValueError: something else entirely")
    assert_line(r, "failed: ValueError: something else entirely", "reinstall sglang-kernel")


def test_troubleshooting_doc_names_every_source() -> None:
    doc = (REPO / "docs" / "troubleshooting.md").read_text()
    for row, (_msg, source) in CATALOGUE.items():
        for ref in source.split("; "):
            assert ref.split(" docs/")[0] in doc, (row, ref)
    for seed in ("000_", "001_", "004_"):
        assert seed in doc
