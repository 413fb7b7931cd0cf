# The Python package set overlay: uv.lock's packages (wheels), the GPU wheel fixups,
# then the DFlash/DDTree overlay. Composed in this order; each layer in its own file.
{
  lib,
  pkgs,
  workspace,
  pyproject-build-systems,
  pins,
  patches,
}:
lib.composeManyExtensions [
  pyproject-build-systems.overlays.wheel
  # A dependency without a prebuilt wheel falls back to its sdist and then needs an
  # explicit build-system fixup: keep the lock wheel-only where possible.
  (workspace.mkPyprojectOverlay { sourcePreference = "wheel"; })
  (import ../pkgs/sglang-dflash/fixups.nix { inherit lib pkgs; })
  (import ./ddtree.nix { inherit lib pins patches; })
]
