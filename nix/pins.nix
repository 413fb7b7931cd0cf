# The pins, read from the one human-edited place (src/sglang_dflash/pins.toml).
# Builtins only, so Nix 2.8 can evaluate it in CI. Nothing here restates a version:
# attribute names for nixpkgs are derived from the pinned values.
{
  pinsFile ? ../src/sglang_dflash/pins.toml,
}:
let
  raw = builtins.fromTOML (builtins.readFile pinsFile);
  noDots = builtins.replaceStrings [ "." ] [ "" ];
  underscores = builtins.replaceStrings [ "." ] [ "_" ];
in
raw
// {
  # nixpkgs attribute of the package's interpreter, e.g. "3.12" -> "python312".
  pythonAttr = "python" + noDots raw.python.package;
  # nixpkgs CUDA package set of the pinned CUDA major.minor, e.g. "13.0" -> "cudaPackages_13_0".
  cudaPackagesAttr = "cudaPackages_" + underscores raw.cuda.version;
  sglangVersion = raw.distributions.sglang;
  # Where the patch series for the pinned sglang lives (may be empty or absent).
  patchDirName = "sglang-" + raw.distributions.sglang;
}
