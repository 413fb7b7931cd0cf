"""What the CUDA driver's own failure messages mean, and how to fix each.

Shared by the abi layer (an extension import that failed) and the gpu layer (torch's
"CUDA initialization: ..." warnings), so one message gets one explanation everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_dflash.pins import Pins


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    fix: str


_STUB = re.compile(r"CUDA driver is a stub library")
_TOO_OLD = re.compile(r"driver on your system is too old(?: \(found version (\d+)\))?")
_MISMATCH = re.compile(r"Driver/library version mismatch|nvml vram init failure: 18"
                       r"|unsupported display driver / cuda driver combination")
_UNKNOWN = re.compile(r"CUDA unknown error")


def explain_driver_message(text: str, pins: Pins) -> Diagnosis | None:
    """The diagnosis for a driver-level message in `text`, or None if it holds none."""
    if _STUB.search(text):
        return Diagnosis("the CUDA driver loaded is a stub library (libcuda.so from a toolkit's "
                         "stubs/ directory)",
                         "remove the stub libcuda.so from LD_LIBRARY_PATH/RUNPATH so the "
                         "driver's own libcuda.so.1 loads (NixOS: /run/opengl-driver/lib)")
    m = _TOO_OLD.search(text)
    if m:
        found = f" (found version {m.group(1)})" if m.group(1) else ""
        return Diagnosis(f"NVIDIA driver too old for CUDA {pins.cuda_version}{found}",
                         f"upgrade the driver to >= {pins.driver_min}")
    m = _MISMATCH.search(text)
    if m:
        return Diagnosis(f"driver libraries do not match the loaded kernel module ({m.group(0)})",
                         "reboot (or reload the nvidia kernel module) after a driver upgrade; "
                         "on NixOS the driver in /run/opengl-driver/lib must be the one the "
                         "running kernel module belongs to")
    if _UNKNOWN.search(text):
        return Diagnosis("CUDA initialisation failed with 'CUDA unknown error' (no access to "
                         "the device nodes, or a wrong driver library)",
                         "allow /dev/nvidia*, /dev/nvidia-uvm, /dev/nvidiactl (systemd "
                         "DeviceAllow, container --gpus), load nvidia_uvm, and load the "
                         "driver's libcuda.so.1; do not change CUDA_VISIBLE_DEVICES after "
                         "start")
    return None
