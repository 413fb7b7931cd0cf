"""pkgs/sglang-dflash/runtime-env.nix, evaluated with stub CUDA packages (lib level):
the driver's library directory comes first and the toolkit's never (it would shadow the
locked wheels), the toolkit is the pinned CUDA, and a CUDA package set of another version
is refused at evaluation time."""

from __future__ import annotations

import pytest

from tests.nix.nixtools import REPO, EvalError, nix_eval, nix_literal, require_dep


def runtime_env(cuda_version: str) -> dict:
    lib = require_dep("nixpkgs-lib")
    return nix_eval(f"""
      let
        lib = import {nix_literal(lib)}/lib;
        pins = import {nix_literal(REPO / "nix/pins.nix")} {{ }};
        env = import {nix_literal(REPO / "pkgs/sglang-dflash/runtime-env.nix")} {{
          inherit lib pins;
          cudaPackages = {{
            cudaMajorMinorVersion = "{cuda_version}";
            cudatoolkit = "/nix/store/00000000000000000000000000000000-cuda-merged";
            backendStdenv.cc = "/nix/store/00000000000000000000000000000000-gcc-wrapper";
          }};
          addDriverRunpath.driverLink = "/run/opengl-driver";
          ninja = "/nix/store/00000000000000000000000000000000-ninja";
        }};
      in {{ inherit (env) variables libraryPath path; }}
    """)


def test_driver_first_and_toolkit_for_jit():
    from sglang_dflash.pins import load_pins

    env = runtime_env(load_pins().cuda_version)
    assert env["libraryPath"][0] == "/run/opengl-driver/lib"
    assert env["variables"]["TRITON_LIBCUDA_PATH"] == "/run/opengl-driver/lib"
    toolkit = "/nix/store/00000000000000000000000000000000-cuda-merged"
    assert env["variables"]["CUDA_HOME"] == toolkit
    assert env["path"][0] == f"{toolkit}/bin"  # nvcc
    # The toolkit's libraries must not shadow the CUDA 13 wheels the lock pins.
    assert not any(p.startswith(toolkit) for p in env["libraryPath"])


def test_a_cuda_set_of_another_version_is_refused():
    with pytest.raises(EvalError, match=r"pins\.toml says"):
        runtime_env("12.9")
