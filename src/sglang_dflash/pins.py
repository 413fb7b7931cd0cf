"""The pins: read from pins.toml (the one human-edited place), rendered elsewhere.

`load_pins()` is what every other module uses. `sglang-dflash pins sync` rewrites
the generated `gpu` and `router` extras in pyproject.toml so they can never drift from the pins.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources

PINS_FILE = "pins.toml"
_GPU_BEGIN = "# BEGIN GENERATED gpu (sglang-dflash pins sync)"
_GPU_END = "# END GENERATED gpu"
_ROUTER_BEGIN = "# BEGIN GENERATED router (sglang-dflash pins sync)"
_ROUTER_END = "# END GENERATED router"


@dataclass(frozen=True)
class Pins:
    """Every pinned fact, typed."""

    python_package: str
    python_cli_min: str
    python_max: str
    cuda_version: str
    driver_min: str
    driver_api_min: int
    distributions: dict[str, str]
    lockstep: dict[str, list[str]] = field(default_factory=dict)
    # SGLang's router (smg); not part of the GPU stack the check's abi layer judges.
    router: dict[str, str] = field(default_factory=dict)

    def version(self, dist: str) -> str:
        return self.distributions[dist]


def parse_pins(text: str) -> Pins:
    """Parse pins.toml text; a missing table or key raises KeyError naming it."""
    data = tomllib.loads(text)
    return Pins(
        python_package=data["python"]["package"],
        python_cli_min=data["python"]["cli_min"],
        python_max=data["python"]["max"],
        cuda_version=data["cuda"]["version"],
        driver_min=str(data["cuda"]["driver_min"]),
        driver_api_min=int(data["cuda"]["driver_api_min"]),
        distributions=dict(data["distributions"]),
        lockstep={k: list(v) for k, v in data.get("lockstep", {}).items()},
        router=dict(data.get("router", {})),
    )


def load_pins() -> Pins:
    """The pins shipped inside this package (the same file the Nix flake reads)."""
    return parse_pins(resources.files("sglang_dflash").joinpath(PINS_FILE).read_text())


def gpu_requirements(pins: Pins) -> list[str]:
    """The `gpu` extra: every pinned distribution, unmarked. requires-python bounds the
    package to the Pythons sglang ships wheels for, so the extra installs wherever the package
    does, and refuses (loudly, in pip and uv) where it does not."""
    return [f"{dist}=={ver}" for dist, ver in pins.distributions.items()]


def python_versions(pins: Pins) -> list[str]:
    """Every CPython minor the package (and its gpu extra) installs on, oldest first."""
    lo, hi = (int(v.split(".")[1]) for v in (pins.python_cli_min, pins.python_max))
    return [f"3.{m}" for m in range(lo, hi + 1)]


def requires_python(pins: Pins) -> str:
    """pyproject's requires-python, as uv.lock records it."""
    major, minor = pins.python_max.split(".")
    return f">={pins.python_cli_min}, <{major}.{int(minor) + 1}"


def render_gpu_block(pins: Pins) -> str:
    lines = [_GPU_BEGIN, "gpu = ["]
    lines += [f'    "{req}",' for req in gpu_requirements(pins)]
    lines += ["]", _GPU_END]
    return "\n".join(lines)


def router_requirements(pins: Pins) -> list[str]:
    """The `router` extra: the router's wheel is abi3, so no interpreter marker."""
    return [f"{dist}=={ver}" for dist, ver in pins.router.items()]


def render_router_block(pins: Pins) -> str:
    lines = [_ROUTER_BEGIN, "router = ["]
    lines += [f'    "{req}",' for req in router_requirements(pins)]
    lines += ["]", _ROUTER_END]
    return "\n".join(lines)


def sync_pyproject(text: str, pins: Pins) -> str:
    """Return pyproject text with the generated gpu and router blocks replaced."""
    for begin, end, render in ((_GPU_BEGIN, _GPU_END, render_gpu_block),
                               (_ROUTER_BEGIN, _ROUTER_END, render_router_block)):
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"pyproject.toml has no '{begin}' block")
        text = pattern.sub(lambda _m, r=render: r(pins), text)
    return text
