# The DFlash/DDTree patch series for the pinned sglang: every *.patch file in
# overlays/patches/sglang-<version>/, in file-name order (apply order = name order,
# so name them 0001-…, 0002-…). An absent or empty directory is an empty series.
# Builtins only, so Nix 2.8 can evaluate it in CI.
{
  patchesRoot, # e.g. <workspace>/overlays/patches
  dirName,
}:
let
  dir = patchesRoot + "/${dirName}";
  entries = if builtins.pathExists dir then builtins.readDir dir else { };
  isPatch =
    name:
    entries.${name} == "regular"
    && builtins.match ".*\\.patch" name != null;
  names = builtins.sort builtins.lessThan (builtins.filter isPatch (builtins.attrNames entries));
in
map (name: {
  inherit name;
  path = dir + "/${name}";
}) names
