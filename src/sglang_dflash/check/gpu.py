"""GPU layer: driver, every visible device, compute capability, runtime JIT needs.

Everything that touches CUDA runs in ONE subprocess with a timeout (a dead GPU can
hang forever, e.g. a device left faulted by a failed Triton launch); it prints
facts, and pure functions below turn recorded facts into results.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sglang_dflash.check.driver_msgs import explain_driver_message
from sglang_dflash.check.finder import find_spec_in
from sglang_dflash.check.result import Result, failed, passed, skipped
from sglang_dflash.pins import Pins

LAYER = "gpu"
PROBE_TIMEOUT_S = 120.0
# FlashInfer/sgl-kernel JIT includes these; a toolkit without them fails at the first
# compile ("fatal error: cuda_fp8.h: No such file or directory").
JIT_HEADERS = ("cuda_runtime.h", "cuda_fp8.h")

# Runs in the subprocess. Progress goes to stderr so a hang names the device.
PROBE = r"""
import ctypes, json, sys, warnings
facts = {"devices": [], "warnings": []}
facts["driver_api"] = None
for name in ("libcuda.so.1", "/run/opengl-driver/lib/libcuda.so.1"):
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        facts.setdefault("driver_api_error", str(exc))
        continue
    v = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(v))
    if rc == 0:
        facts["driver_api"] = v.value
        facts.pop("driver_api_error", None)
    else:
        facts["driver_api_error"] = f"cuDriverGetVersion returned {rc}"
    break
try:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch
        facts["torch_version"] = torch.__version__
        facts["torch_cuda"] = torch.version.cuda
        facts["cuda_available"] = torch.cuda.is_available()
        facts["device_count"] = torch.cuda.device_count() if facts["cuda_available"] else 0
        facts["arch_list"] = torch.cuda.get_arch_list() if facts["cuda_available"] else []
    facts["warnings"] = [str(w.message) for w in caught]
except Exception as exc:
    facts["torch_error"] = f"{type(exc).__name__}: {exc}"
for i in range(facts.get("device_count", 0)):
    print(f"START {i}", file=sys.stderr, flush=True)
    d = {"index": i}
    try:
        d["name"] = torch.cuda.get_device_name(i)
        d["capability"] = list(torch.cuda.get_device_capability(i))
        x = torch.arange(1024, device=f"cuda:{i}", dtype=torch.float32)
        s = float((x * 2).sum().item())
        torch.cuda.synchronize(i)
        d["ok"] = s == 1047552.0
        if not d["ok"]:
            d["error"] = f"wrong result {s}"
    except Exception as exc:
        d["ok"] = False
        d["error"] = f"{type(exc).__name__}: {exc}"
    facts["devices"].append(d)
    print(f"DONE {i}", file=sys.stderr, flush=True)
print(json.dumps(facts))
"""


@dataclass
class HostFacts:
    """What the parent process finds without CUDA: files, PATH, loadable libraries."""

    proc_driver: str | None = None  # /proc/driver/nvidia/version text
    nvcc: str | None = None
    nvcc_release: str | None = None  # "13.0" from `nvcc --version`
    libcuda_dirs: list[str] = field(default_factory=list)
    nvrtc: str | None = None
    nvrtc_tried: list[str] = field(default_factory=list)
    missing_headers: list[str] = field(default_factory=list)  # of JIT_HEADERS, beside nvcc


def run_probe(timeout: float = PROBE_TIMEOUT_S) -> tuple[dict | None, str]:
    """(facts, error). On a hang, error names the device that was being tested."""
    try:
        p = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                           timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return None, hang_message(err, timeout)
    try:
        return json.loads(p.stdout.strip().splitlines()[-1]), ""
    except (json.JSONDecodeError, IndexError):
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"GPU probe exited {p.returncode}: {tail}"


def hang_message(stderr: str, timeout: float) -> str:
    started = [int(m) for m in re.findall(r"^START (\d+)$", stderr, re.M)]
    done = {int(m) for m in re.findall(r"^DONE (\d+)$", stderr, re.M)}
    hung = [i for i in started if i not in done]
    where = f"GPU {hung[0]} hung" if hung else "CUDA initialisation hung"
    return f"{where}: no answer within {timeout:.0f} s"


def driver_branch(proc_text: str | None) -> int | None:
    """580 from '... Kernel Module  580.159.04  ...' in /proc/driver/nvidia/version."""
    if not proc_text:
        return None
    m = re.search(r"Kernel Module(?: for \w+)?\s+(\d+)\.\d+", proc_text)
    return int(m.group(1)) if m else None


def evaluate_driver(facts: dict, proc_text: str | None, pins: Pins) -> list[Result]:
    out = []
    api = facts.get("driver_api")
    need = pins.driver_api_min
    fix = f"install an NVIDIA driver >= {pins.driver_min} (CUDA {pins.cuda_version})"
    too_old = [w for w in facts.get("warnings", []) if "too old" in w]
    if api is None:
        out.append(failed(LAYER, "driver_api", "cuDriverGetVersion unavailable: "
                          f"{facts.get('driver_api_error', 'libcuda.so.1 not loadable')}", fix))
    elif api < need or too_old:
        extra = f" ({too_old[0]})" if too_old else ""
        out.append(failed(LAYER, "driver_api", f"driver API {api} < {need}{extra}", fix))
    else:
        out.append(passed(LAYER, "driver_api", f"driver API {api} >= {need}"))
    branch = driver_branch(proc_text)
    if proc_text is None:
        out.append(failed(LAYER, "driver", "/proc/driver/nvidia/version missing: no NVIDIA "
                          "kernel module loaded", fix))
    elif branch is None:
        out.append(failed(LAYER, "driver", "cannot parse /proc/driver/nvidia/version", fix))
    elif branch < int(pins.driver_min):
        out.append(failed(LAYER, "driver", f"driver branch {branch} < {pins.driver_min}", fix))
    else:
        out.append(passed(LAYER, "driver", f"driver branch {branch} >= {pins.driver_min}"))
    return out


def evaluate_devices(facts: dict, pins: Pins | None = None) -> list[Result]:
    if "torch_error" in facts:
        return [failed(LAYER, "devices", f"import torch failed: {facts['torch_error']}",
                       "fix the abi layer first")]
    if not facts.get("cuda_available") or not facts.get("device_count"):
        why = "; ".join(facts.get("warnings", [])) or f"torch {facts.get('torch_version')}, " \
            f"CUDA {facts.get('torch_cuda')}"
        diag = explain_driver_message(why, pins) if pins is not None else None
        if diag is not None:
            return [failed(LAYER, "devices", f"no CUDA device visible: {diag.cause} ({why})",
                           diag.fix)]
        return [failed(LAYER, "devices", f"no CUDA device visible ({why})",
                       "check CUDA_VISIBLE_DEVICES, the driver, device access "
                       "(/dev/nvidia*, DeviceAllow) and that torch is a CUDA build")]
    out = []
    for d in facts.get("devices", []):
        i = d["index"]
        label = f"GPU {i} ({d.get('name', '?')})"
        if d.get("ok"):
            out.append(passed(LAYER, f"device{i}", f"{label}: tiny kernel ran and synchronized"))
        else:
            out.append(failed(LAYER, f"device{i}", f"{label}: kernel failed: {d.get('error')}",
                              f"GPU {i} is unusable; take it out of CUDA_VISIBLE_DEVICES "
                              "and reset or reboot the host"))
    return out


def arch_supported(capability: list[int], arch_list: list[str]) -> str | None:
    """The arch entry that covers this capability: exact SASS, or older PTX to JIT from."""
    cc = capability[0] * 10 + capability[1]
    if f"sm_{cc}" in arch_list or f"sm_{cc}a" in arch_list:
        return f"sm_{cc}"
    ptx = [int(a[8:]) for a in arch_list if re.fullmatch(r"compute_\d+", a)]
    ok = [p for p in ptx if p <= cc]
    return f"compute_{max(ok)} (PTX JIT)" if ok else None


def evaluate_arch(facts: dict) -> list[Result]:
    arch = facts.get("arch_list") or []
    out = []
    for d in facts.get("devices", []):
        cap = d.get("capability")
        if not cap:
            continue
        i, cc = d["index"], f"{cap[0]}.{cap[1]}"
        hit = arch_supported(cap, arch)
        if hit:
            out.append(passed(LAYER, f"arch{i}", f"GPU {i} compute capability {cc}: {hit}"))
        else:
            out.append(failed(LAYER, f"arch{i}", f"GPU {i} compute capability {cc} not in "
                              f"torch's arch list {arch}", "install a torch built for this GPU"))
    return out


def evaluate_jit(host: HostFacts, pins: Pins) -> list[Result]:
    out = []
    major = pins.cuda_version.split(".")[0]
    if host.nvcc and host.nvcc_release and host.nvcc_release.split(".")[0] != major:
        out.append(failed(LAYER, "nvcc", f"nvcc at {host.nvcc} is CUDA {host.nvcc_release}, "
                          f"JIT needs CUDA {pins.cuda_version}",
                          f"set CUDA_HOME to a CUDA {pins.cuda_version} toolkit"))
    elif host.nvcc:
        out.append(passed(LAYER, "nvcc", f"nvcc at {host.nvcc} (CUDA {host.nvcc_release})"))
    else:
        out.append(failed(LAYER, "nvcc", "nvcc not found in $CUDA_HOME/bin or PATH (FlashInfer "
                          "JIT: 'Could not find nvcc')",
                          f"set CUDA_HOME to a CUDA {pins.cuda_version} toolkit"))
    if host.nvcc and host.missing_headers:
        out.append(failed(LAYER, "cuda_headers", f"{', '.join(host.missing_headers)} not found "
                          f"beside {host.nvcc}, in $CUDA_HOME/include or $CPATH (JIT: 'fatal "
                          f"error: {host.missing_headers[0]}: No such file or directory')",
                          f"set CUDA_HOME to a complete CUDA {pins.cuda_version} toolkit "
                          "(Nix: join cuda_nvcc with cuda_cudart's dev output) or add its "
                          "include/ to CPATH"))
    elif host.nvcc:
        out.append(passed(LAYER, "cuda_headers", f"{', '.join(JIT_HEADERS)} found"))
    if host.libcuda_dirs:
        out.append(passed(LAYER, "libcuda", "libcuda for Triton in " + host.libcuda_dirs[0]))
    else:
        out.append(failed(LAYER, "libcuda", "libcuda.so not found via TRITON_LIBCUDA_PATH, "
                          "/run/opengl-driver/lib or ldconfig (Triton: 'libcuda.so cannot "
                          "found')", "set TRITON_LIBCUDA_PATH to the directory holding the "
                          "driver's libcuda.so"))
    if host.nvrtc:
        out.append(passed(LAYER, "nvrtc", f"libnvrtc.so.{major} loaded from {host.nvrtc}"))
    else:
        out.append(failed(LAYER, "nvrtc", f"libnvrtc.so.{major} not loadable (tried "
                          f"{', '.join(host.nvrtc_tried)})",
                          f"install nvidia-cuda-nvrtc for CUDA {major} or add its lib dir to "
                          "LD_LIBRARY_PATH"))
    return out


# --- host facts (I/O) -------------------------------------------------------------------

def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def find_nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.access(Path(home) / "bin" / "nvcc", os.X_OK):
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def nvcc_release(nvcc: str | None) -> str | None:
    if not nvcc:
        return None
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+)", text)
    return m.group(1) if m else None


def missing_headers(nvcc: str | None, env: dict[str, str]) -> list[str]:
    """JIT_HEADERS found in none of: nvcc's toolkit include dirs, $CUDA_HOME/include, $CPATH."""
    if not nvcc:
        return []
    root = Path(nvcc).resolve().parent.parent
    dirs = [root / "include", *root.glob("targets/*/include")]
    if env.get("CUDA_HOME"):
        dirs.append(Path(env["CUDA_HOME"]) / "include")
    dirs += [Path(d) for d in env.get("CPATH", "").split(":") if d]
    return [h for h in JIT_HEADERS if not any((d / h).is_file() for d in dirs)]


def find_libcuda_dirs() -> list[str]:
    dirs = []
    for d in [*os.environ.get("TRITON_LIBCUDA_PATH", "").split(":"), "/run/opengl-driver/lib"]:
        if d and any(Path(d).glob("libcuda.so*")):
            dirs.append(d)
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if Path("/sbin/ldconfig").exists()
                                            else None)
    if ldconfig:
        try:
            text = subprocess.run([ldconfig, "-p"], capture_output=True, text=True,
                                  timeout=5).stdout
            dirs += [str(Path(m).parent) for m in re.findall(r"=> (\S*libcuda\.so\S*)", text)]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return dirs


def nvrtc_candidates(major: str, entries: list[str]) -> list[str]:
    name = f"libnvrtc.so.{major}"
    out = [name]
    spec = find_spec_in("nvidia", [e or os.getcwd() for e in entries])
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for sub in (f"cu{major}/lib", "cuda_nvrtc/lib"):
            out.append(str(Path(loc) / sub / name))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home:
            out.append(str(Path(home) / "lib64" / name))
    return out


def find_nvrtc(candidates: list[str]) -> str | None:
    for c in candidates:
        try:
            ctypes.CDLL(c)
            return c
        except OSError:
            continue
    return None


def host_facts(pins: Pins, entries: list[str]) -> HostFacts:
    cands = nvrtc_candidates(pins.cuda_version.split(".")[0], entries)
    nvcc = find_nvcc()
    return HostFacts(proc_driver=_read("/proc/driver/nvidia/version"), nvcc=nvcc,
                     nvcc_release=nvcc_release(nvcc), libcuda_dirs=find_libcuda_dirs(),
                     nvrtc=find_nvrtc(cands), nvrtc_tried=cands,
                     missing_headers=missing_headers(nvcc, dict(os.environ)))


def evaluate(facts: dict | None, probe_error: str, host: HostFacts, pins: Pins) -> list[Result]:
    """All GPU results from recorded facts (pure; the tests feed it H200 recordings)."""
    if facts is None:
        out = [failed(LAYER, "probe", probe_error, "check the driver and `nvidia-smi`; a hung "
                      "GPU needs a reset or a reboot")]
    else:
        out = evaluate_driver(facts, host.proc_driver, pins)
        out += evaluate_devices(facts, pins)
        out += evaluate_arch(facts)
    return out + evaluate_jit(host, pins)


def run_layer(pins: Pins, entries: list[str], offline: bool) -> list[Result]:
    if offline:
        return [skipped(LAYER, "all", "--offline: no GPU access in this mode")]
    facts, err = run_probe()
    return evaluate(facts, err, host_facts(pins, entries), pins)
