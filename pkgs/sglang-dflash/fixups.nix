# The fixups the locked GPU wheels need to build and load under Nix, driven by the
# table in ./gpu-wheels.nix (each entry carries its reason). Returns a pyproject.nix
# overlay (final/prev are Python package sets). Entries for packages absent from the
# set are skipped, so the table may name packages a future lock drops.
{
  lib,
  pkgs,
  table ? import ./gpu-wheels.nix,
}:
let
  inherit (lib)
    concatMapStringsSep
    filterAttrs
    mapAttrs
    ;

  # Dependency closure of a package, following extras, from the passthru uv2nix
  # records from uv.lock (so it is exactly the lock's graph).
  closure =
    prev: name:
    map (x: x.key) (
      builtins.genericClosure {
        startSet = [
          {
            key = name;
            extras = [ ];
          }
        ];
        operator =
          { key, extras }:
          let
            p = prev.${key}.passthru or { };
            viaExtras = builtins.foldl' (
              acc: e: acc // (p.optional-dependencies.${e} or { })
            ) { } extras;
          in
          lib.mapAttrsToList (n: xs: {
            key = n;
            extras = xs;
          }) (filterAttrs (n: _: prev ? ${n}) ((p.dependencies or { }) // viaExtras));
      }
    );

  # Library directories a wheel's ELF files may need from its dependencies: the
  # CUDA 13 wheels put theirs in nvidia/cu13/lib (NCCL, cuDNN, cuSPARSELt, NVSHMEM
  # in nvidia/<name>/lib), torch in torch/lib.
  searchPathHook = sitePackages: deps: ''
    for dep in ${lib.concatStringsSep " " (map toString deps)}; do
      for dir in "$dep/${sitePackages}"/nvidia/*/lib "$dep/${sitePackages}/torch/lib"; do
        if [ -d "$dir" ]; then addAutoPatchelfSearchPath "$dir"; fi
      done
    done
  '';

  gpuFixup =
    final: prev: name: spec:
    let
      # extraDeps bring their own closure (torch brings the CUDA 13 wheels).
      depNames = lib.unique (
        lib.concatMap (closure prev) (
          [ name ] ++ builtins.filter (n: prev ? ${n}) (spec.extraDeps or [ ])
        )
      );
      deps = map (n: final.${n}) (builtins.filter (n: n != name && prev ? ${n}) depNames);
    in
    prev.${name}.overrideAttrs (old: {
      nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ [ pkgs.autoAddDriverRunpath ];
      autoPatchelfIgnoreMissingDeps = table.driverLibs ++ (spec.ignoreMissing or [ ]);
      preFixup = (old.preFixup or "") + searchPathHook final.python.sitePackages deps;
      passthru = (old.passthru or { }) // {
        sglangDflashFixup = spec.reason;
      };
    });

  nativeFixup =
    final: prev: name: spec:
    prev.${name}.overrideAttrs (old: {
      buildInputs =
        (old.buildInputs or [ ])
        ++ map (a: pkgs.${a}) (spec.pkgs or [ ])
        ++ lib.optional (spec.python or false) final.python;
    });

  collisionFixup =
    final: prev: name: spec:
    prev.${name}.overrideAttrs (old: {
      postInstall =
        (old.postInstall or "")
        + concatMapStringsSep "\n" (f: ''rm -f "$out/${final.python.sitePackages}/${f}"'') (
          spec.remove or [ ]
        )
        + "\n"
        + concatMapStringsSep "\n" (f: ''rm -f "$out/bin/${f}"'') (spec.removeBin or [ ]);
    });

  # One overlay per table, composed, so a package in two tables gets both fixups.
  tableOverlay =
    fixup: entries: final: prev:
    mapAttrs (fixup final prev) (filterAttrs (name: _: prev ? ${name}) entries);
in
lib.composeManyExtensions [
  (tableOverlay gpuFixup table.gpu)
  (tableOverlay nativeFixup table.native)
  (tableOverlay collisionFixup table.collisions)
]
