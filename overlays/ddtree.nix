# The DFlash/DDTree overlay on the pinned sglang, as a pyproject.nix overlay:
#  - the plugin: this repo's Python project (sglang-dflash), which registers DDTree
#    through the `sglang.srt.plugins` entry point; its build must ship the manifest;
#  - the patch series overlays/patches/sglang-<pin>/*.patch (empty is fine), applied
#    to the installed sglang wheel with stale bytecode recompiled (apply-patches.sh).
{
  lib,
  pins,
  patches,
  applyPatches ? ../pkgs/sglang-dflash/apply-patches.sh,
}:
final: prev:
let
  sitePackages = final.python.sitePackages;
  patchNames = map (p: p.name) patches;
in
{
  sglang = prev.sglang.overrideAttrs (old: {
    postInstall =
      (old.postInstall or "")
      + lib.optionalString (patches != [ ]) ''
        bash ${applyPatches} "$out/${sitePackages}" ${final.python.interpreter} \
          ${lib.concatMapStringsSep " " (p: "${p.path}") patches}
      '';
    passthru = (old.passthru or { }) // {
      ddtreePatches = patchNames;
    };
  });

  sglang-dflash = prev.sglang-dflash.overrideAttrs (old: {
    # Fail the build, not the first run, if the wheel lost a file the check needs.
    # (An editable install, as in the dev shell, has only a .pth file: nothing to check.)
    postInstall = (old.postInstall or "") + ''
      pkgdir="$out/${sitePackages}/sglang_dflash"
      if [ ! -d "$pkgdir" ] && compgen -G "$out/${sitePackages}/*.pth" >/dev/null; then
        echo "sglang-dflash: editable install, skipping the installed-files check"
      else
      for f in pins.toml overlay.toml manifest.json; do
        if [ ! -f "$pkgdir/$f" ]; then
          echo "sglang-dflash: $f is not installed with the package (is it committed?)" >&2
          exit 1
        fi
      done
      if ! grep -qs '^\[sglang.srt.plugins\]' "$out/${sitePackages}"/sglang_dflash-*.dist-info/entry_points.txt; then
        echo "sglang-dflash: the sglang.srt.plugins entry point is missing from the wheel" >&2
        exit 1
      fi
      fi
    '';
    passthru = (old.passthru or { }) // {
      inherit pins;
    };
  });
}
