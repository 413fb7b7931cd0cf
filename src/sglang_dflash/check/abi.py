"""ABI layer: torch, CUDA and the compiled extensions agree with the pins and each other.

Versions come from files and distribution metadata (never import names: sglang's own
check_env misses flashinfer-python that way); extensions are imported in subprocesses
with a timeout, and their errors are translated into what went wrong.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from sglang_dflash.check.driver_msgs import explain_driver_message
from sglang_dflash.check.finder import find_spec_in
from sglang_dflash.check.result import FAIL, SKIP, Result, failed, passed, skipped
from sglang_dflash.pins import Pins, python_versions, requires_python

LAYER = "abi"
IMPORT_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class TorchInfo:
    version: str
    cuda: str | None
    location: Path


def read_torch_version(entries: list[str]) -> TorchInfo | None:
    """torch.__version__ and torch.version.cuda from torch/version.py, without importing."""
    spec = find_spec_in("torch", [e or os.getcwd() for e in entries])
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    try:
        tree = ast.parse((pkg / "version.py").read_text())
    except (OSError, SyntaxError):
        return TorchInfo("unknown (torch/version.py unreadable)", None, pkg)
    values: dict[str, object] = {}
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    cuda = values.get("cuda")
    return TorchInfo(str(values.get("__version__", "unknown")),
                     str(cuda) if cuda is not None else None, pkg)


def check_python(version: tuple[int, ...], pins: Pins, stack_installed: bool) -> Result:
    """The running interpreter against the Pythons the package and its gpu extra install on.

    requires-python (pins: ``python.cli_min`` .. ``python.max``, the CPythons sglang ships
    wheels for) bounds the package, so pip and uv refuse any other Python loudly and the gpu
    extra installs on every one inside it (uv.lock resolves it for each). The Nix package and
    the GPU hosts run ``python.package``; the others are installed and checked on the CPU.
    """
    found = ".".join(str(v) for v in version[:3])
    minor = ".".join(str(v) for v in version[:2])
    want, supported = pins.python_package, python_versions(pins)
    span = f"{supported[0]}-{supported[-1]}"
    if minor == want:
        return passed(LAYER, "python", f"Python {found} is the GPU stack's pinned Python {want} "
                      "(the Nix package's and the GPU hosts')")
    if minor in supported:
        return passed(LAYER, "python", f"Python {found}: uv.lock resolves the gpu extra for "
                      f"Python {span} and it installs here; the Nix package and the GPU hosts "
                      f"run {want}")
    fix = (f"use Python {span}: `uv sync --extra gpu --frozen --python {want}`, or the Nix "
           "package (`nix build .#sglang-dflash`)")
    where = "this stack was not installed from uv.lock" if stack_installed else (
        "pip and uv refuse to install the package here")
    return failed(LAYER, "python", f"Python {found} runs this, but the package and its gpu extra "
                  f"are for Python {span} only (requires-python {requires_python(pins)}): "
                  f"{where}", fix)


def check_torch(info: TorchInfo | None, pins: Pins) -> Result:
    pin = pins.version("torch")
    fix = (f"install torch=={pin} built for CUDA {pins.cuda_version} (the PyPI Linux x86_64 "
           f"wheel is; or --index-url https://download.pytorch.org/whl/cu"
           f"{pins.cuda_version.replace('.', '')})")
    if info is None:
        return failed(LAYER, "torch", "torch is not installed", fix)
    public, _, local = info.version.partition("+")
    found = f"torch {info.version}, torch.version.cuda {info.cuda} ({info.location})"
    if local == "cpu" or info.cuda is None:
        return failed(LAYER, "torch", f"CPU build of torch: {found}", fix)
    if public != pin:
        return failed(LAYER, "torch", f"{found}; pin is torch {pin}", fix)
    if info.cuda != pins.cuda_version:
        return failed(LAYER, "torch", f"{found}; pin is CUDA {pins.cuda_version}", fix)
    return passed(LAYER, "torch", found)


def dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_distribution(dist: str, found: str | None, pin: str) -> Result:
    fix = f"install {dist}=={pin} (`nix build .#sglang-dflash` has it)"
    if found is None:
        return failed(LAYER, dist, f"{dist} is not installed (pin {pin})", fix)
    if found != pin:
        return failed(LAYER, dist, f"{dist} {found}, pin is {pin}", fix)
    return passed(LAYER, dist, f"{dist} {found} == pin")


def check_lockstep(lockstep: dict[str, list[str]], versions: dict[str, str | None]) -> Result:
    """Followers (flashinfer-cubin, -jit-cache) must equal their leader when installed."""
    bad, seen = [], []
    for leader, followers in lockstep.items():
        lv = versions.get(leader)
        for f in followers:
            fv = versions.get(f)
            if fv is None:
                continue
            seen.append(f"{f} {fv}")
            if fv != lv:
                bad.append(f"{f} {fv} != {leader} {lv}")
    if bad:
        return failed(LAYER, "lockstep", "; ".join(bad),
                      "install the same version of every flashinfer package (flashinfer "
                      "refuses to run otherwise)")
    if not seen:
        return passed(LAYER, "lockstep", "no lock-step followers installed ("
                      + ", ".join(f for fs in lockstep.values() for f in fs) + ")")
    return passed(LAYER, "lockstep", ", ".join(seen) + " match their leader")


# Most specific first: sgl_kernel's "Could not load any common_ops library!" report
# lists the underlying errors (a missing libnvrtc, an undefined symbol) beneath it.
# Driver-level messages (stub, too old, mismatch, unknown error) go to driver_msgs first.
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"undefined symbol: (\S+)"), "symbol"),
    (re.compile(r"(libcudart\.so\.(\d+))"), "cudart"),
    (re.compile(r"(\S+) with minimum required version (\S+) is not installed"), "minver"),
    (re.compile(r"fatal error: ([\w/]+\.h): No such file or directory"), "header"),
    (re.compile(r"No such file or directory: '(/sbin/ldconfig)'"), "ldconfig"),
    (re.compile(r"(libcuda\.so(?:\.1)?)\b(?!\.\d)"), "libcuda"),
    (re.compile(r"cannot find (-lcuda)\b"), "libcuda"),
    (re.compile(r"Found no NVIDIA driver|no CUDA GPUs are available"), "nogpu"),
    (re.compile(r"(libnvrtc\.so(?:\.\d+)?)"), "lib"),
    (re.compile(r"(lib[\w\-]+\.so[\.\d]*): cannot open shared object file"), "lib"),
    (re.compile(r"flashinfer-(?:cubin|jit-cache) version .*? does not match"
                r"(?: flashinfer version \([^)]*\))?"), "lockstep"),
    (re.compile(r"Could not find nvcc"), "nvcc"),
    (re.compile(r"Could not load any common_ops library"), "symbol"),
    (re.compile(r"No module named '([^']+)'"), "nomodule"),
]


def explain_import_error(dist: str, module: str, text: str, torch: TorchInfo | None,
                         pins: Pins, offline: bool) -> tuple[str, str, str]:
    """(status, found, fix) for an extension import that failed with `text` on stderr."""
    tv = torch.version if torch else "not installed"
    tc = torch.cuda if torch else None
    pin = pins.version(dist) if dist in pins.distributions else "the pinned version"
    torch_pin = pins.version("torch")
    diag = explain_driver_message(text, pins)
    if diag is not None:
        return FAIL, f"import {module}: {diag.cause}", diag.fix
    for pattern, kind in _PATTERNS:
        m = pattern.search(text)
        if not m:
            continue
        if kind == "symbol":
            sym = f": undefined symbol {m.group(1)}" if m.groups() else ""
            return FAIL, (f"import {module} failed{sym} — {dist} was built for a different "
                          f"torch (found torch {tv})"), (
                f"install {dist}=={pin} together with torch=={torch_pin}+cu"
                f"{pins.cuda_version.replace('.', '')} (built against each other)")
        if kind == "cudart":
            if tc and tc.split(".")[0] == m.group(2):
                return FAIL, (f"import {module} failed: {m.group(1)} not loadable — the CUDA "
                              f"{m.group(2)} runtime torch {tv} needs is not on the loader "
                              f"path"), (
                    f"install nvidia-cuda-runtime for CUDA {m.group(2)} (torch's dependency) "
                    f"or put its lib dir on LD_LIBRARY_PATH")
            return FAIL, (f"import {module} failed: {m.group(1)} not loadable — {dist} was "
                          f"built for CUDA {m.group(2)}, torch has CUDA {tc} "
                          f"(CUDA major mismatch)"), (
                f"install the CUDA {pins.cuda_version} builds of torch and {dist}")
        if kind == "minver":
            return FAIL, (f"import {module}: {m.group(1)} >= {m.group(2)} required but its "
                          f"distribution metadata is missing or older"), (
                f"install {m.group(1).replace('_', '-')} at its pin with pip/uv so its "
                f"dist-info exists (`nix build .#sglang-dflash` has it)")
        if kind == "header":
            return FAIL, (f"import {module}: JIT compile cannot find {m.group(1)} — CUDA "
                          f"toolkit headers are not on the include path"), (
                f"set CUDA_HOME to a complete CUDA {pins.cuda_version} toolkit whose include/ "
                f"has cuda_runtime.h and cuda_fp8.h (Nix: join cuda_nvcc with cuda_cudart's "
                f"dev output), or add that include/ to CPATH")
        if kind == "ldconfig":
            found = (f"import {module}: Triton looked for libcuda with {m.group(1)}, which "
                     f"does not exist (NixOS)")
            if offline:
                return SKIP, f"{found}; no driver in this sandbox (--offline)", ""
            return FAIL, found, ("set TRITON_LIBCUDA_PATH to the directory holding the "
                                 "driver's libcuda.so (NixOS: /run/opengl-driver/lib)")
        if kind == "libcuda":
            found = f"import {module} needs {m.group(1)}: driver library not available"
            if offline:
                return SKIP, f"{found} in this sandbox (--offline)", ""
            return FAIL, found, ("install the NVIDIA driver (>= " + pins.driver_min + ") and "
                                 "set TRITON_LIBCUDA_PATH to the directory holding its "
                                 "libcuda.so (NixOS: /run/opengl-driver/lib)")
        if kind == "nogpu":
            found = f"import {module} needs a GPU: {m.group(0)}"
            if offline:
                return SKIP, f"{found} (no GPU in this sandbox, --offline)", ""
            return FAIL, found, "run on the GPU host; check the driver and device access"
        if kind == "lib":
            return FAIL, f"import {module} failed: {m.group(1)} not loadable", (
                f"install the CUDA {pins.cuda_version} runtime wheels torch depends on "
                f"(nvidia-*-cu13) or put their lib dirs on the loader path")
        if kind == "lockstep":
            return FAIL, f"import {module}: {m.group(0)}", (
                "install the same version of every flashinfer package (flashinfer-python, "
                "-cubin, -jit-cache); FLASHINFER_DISABLE_VERSION_CHECK=1 only hides it")
        if kind == "nvcc":
            return FAIL, f"import {module}: nvcc not found (FlashInfer JIT needs a toolkit)", (
                "set CUDA_HOME to a CUDA " + pins.cuda_version + " toolkit (with bin/nvcc)")
        if kind == "nomodule":
            return FAIL, f"import {module} failed: no module named {m.group(1)!r}", (
                f"reinstall {dist}=={pin} and its dependencies")
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
    return FAIL, f"import {module} failed: {last}", f"reinstall {dist}=={pin}"


# Runs in the subprocess: imports each module in turn (torch is loaded once, as in the
# server), one JSON line per module on stdout; START markers on stderr name a hang.
IMPORTER = r"""
import json, sys, traceback
for mod in sys.argv[1:]:
    print("START " + mod, file=sys.stderr, flush=True)
    try:
        __import__(mod)
        res = {"module": mod, "ok": True}
    except BaseException as exc:
        text = "".join(traceback.format_exception_only(type(exc), exc))
        res = {"module": mod, "ok": False, "error": text}
    print(json.dumps(res), flush=True)
"""


@dataclass(frozen=True)
class ImportOutcome:
    """ok, or the error text; `state` says whether it ran, hung, crashed or never ran."""

    state: str  # "ok" | "error" | "hung" | "crashed" | "not-run"
    text: str = ""


class ExtensionImports:
    """Imports started early (in the background) so they overlap the package layer."""

    def __init__(self, modules: list[str]) -> None:
        self.modules = modules
        self.proc = subprocess.Popen(
            [sys.executable, "-c", IMPORTER, *modules], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) if modules else None
        self.started = time.monotonic()

    def wait(self, timeout: float) -> dict[str, ImportOutcome]:
        if self.proc is None:
            return {}
        hung = False
        try:
            out, err = self.proc.communicate(
                timeout=max(0.1, timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            hung = True
        return parse_import_output(self.modules, out, err, self.proc.returncode, hung, timeout)


def parse_import_output(modules: list[str], stdout: str, stderr: str, rc: int, hung: bool,
                        timeout: float) -> dict[str, ImportOutcome]:
    """Pure: map the importer's output to one outcome per module."""
    done: dict[str, ImportOutcome] = {}
    for line in stdout.splitlines():
        try:
            res = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(res, dict) and res.get("module") in modules:
            done[res["module"]] = (ImportOutcome("ok") if res.get("ok")
                                   else ImportOutcome("error", str(res.get("error", ""))))
    started = re.findall(r"^START (\S+)$", stderr, re.M)
    culprit = next((m for m in reversed(started) if m not in done), None)
    out = {}
    for m in modules:
        if m in done:
            out[m] = done[m]
        elif m == culprit and hung:
            out[m] = ImportOutcome("hung", f"timed out after {timeout:g} s")
        elif m == culprit:
            how = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
            out[m] = ImportOutcome("crashed", f"crashed the interpreter ({how}): "
                                   + (stderr.strip().splitlines() or [""])[-1])
        else:
            out[m] = ImportOutcome("not-run", f"not tried: importing {culprit} "
                                   + ("hung" if hung else "crashed") + " first")
    return out


def start_imports(extensions: dict[str, str]) -> ExtensionImports:
    """Start importing the extensions whose distributions are installed."""
    return ExtensionImports([m for d, m in extensions.items() if dist_version(d) is not None])


def run_layer(pins: Pins, extensions: dict[str, str], entries: list[str], offline: bool,
              imports: ExtensionImports | None = None) -> list[Result]:
    torch = read_torch_version(entries)
    stack = torch is not None or dist_version("sglang") is not None
    out = [check_python(sys.version_info, pins, stack), check_torch(torch, pins)]
    versions: dict[str, str | None] = {}
    for dist, pin in pins.distributions.items():
        if dist in ("sglang", "torch"):
            continue  # sglang: package layer; torch: read from its version.py above
        versions[dist] = dist_version(dist)
        out.append(check_distribution(dist, versions[dist], pin))
    for followers in pins.lockstep.values():
        for f in followers:
            versions[f] = dist_version(f)
    out.append(check_lockstep(pins.lockstep, versions))
    imports = imports or start_imports(extensions)
    outcomes = imports.wait(IMPORT_TIMEOUT_S)
    for dist, module in extensions.items():
        name = f"import.{module}"
        o = outcomes.get(module)
        if o is None:
            out.append(skipped(LAYER, name, f"{dist} is not installed"))
        elif o.state == "ok":
            out.append(passed(LAYER, name, f"import {module} ok"))
        elif o.state == "hung":
            out.append(failed(LAYER, name, f"import {module} {o.text}",
                              "a hang at import usually means a stuck GPU or driver; "
                              "run the gpu layer"))
        elif o.state == "not-run":
            out.append(skipped(LAYER, name, o.text))
        elif o.state == "crashed":
            out.append(failed(LAYER, name, f"import {module} {o.text}",
                              f"reinstall {dist}=={pins.distributions.get(dist, '?')} built "
                              f"for torch {pins.version('torch')}"))
        else:
            status, found, fix = explain_import_error(dist, module, o.text, torch, pins, offline)
            out.append(Result(LAYER, name, status, found, fix))
    return out
