# The stand-in's attributes (see ./default.nix). `self` is the final package set.
{
  lib,
  system,
  config,
  overlays,
}:
self:
let
  platform = lib.systems.elaborate system;

  # Keep what `derivation` can take as an environment variable; drop the rest (functions,
  # plain attribute sets), as stdenv keeps passthru/meta out of the derivation.
  envValue =
    v:
    if builtins.isFunction v then
      null
    else if builtins.isAttrs v then
      (if v ? outPath || v ? __toString then v else null)
    else if builtins.isList v then
      builtins.filter (x: x != null) (map envValue v)
    else if builtins.isFloat v then
      toString v
    else
      v;
  notEnv = [
    "passthru"
    "meta"
    "env"
    "finalPackage"
    "__structuredAttrs"
  ];

  # pkgs/stdenv/generic/make-derivation.nix: mkDerivation with the finalAttrs fixpoint,
  # overrideAttrs (lib.toExtension), passthru merged into the result, meta, `env`.
  mkDerivation =
    fpargs:
    let
      rattrs = if builtins.isFunction fpargs then fpargs else (_: fpargs);
      make =
        rattrs:
        let
          attrs = lib.fix (final: rattrs final // { finalPackage = result; });
          name = attrs.name or "${attrs.pname}-${attrs.version}";
          env = lib.filterAttrs (n: v: !(lib.elem n notEnv) && v != null) (
            lib.mapAttrs (_: envValue) attrs
          );
          drv = derivation (
            env
            // lib.mapAttrs (_: envValue) (attrs.env or { })
            // {
              inherit name system;
              builder = "/bin/sh";
              args = [
                "-c"
                "echo 'nixpkgs stand-in (tests/nix/nixpkgs-standin): not buildable' >&2; exit 1"
              ];
            }
          );
          result =
            (attrs.passthru or { })
            // builtins.removeAttrs attrs [ "finalPackage" ]
            // {
              inherit name;
              inherit (drv) drvPath outPath;
              type = "derivation";
              outputName = "out";
              out = result;
              outputs = [ "out" ];
              passthru = attrs.passthru or { };
              meta = {
                name = name;
                outputsToInstall = [ "out" ];
              }
              // (attrs.meta or { });
              overrideAttrs = f0: make (lib.extends (lib.toExtension f0) rattrs);
            };
        in
        result;
    in
    make rattrs;

  stdenv = {
    inherit mkDerivation;
    hostPlatform = platform;
    buildPlatform = platform;
    targetPlatform = platform;
    isLinux = true;
    isDarwin = false;
    system = system;
    shell = "/bin/sh";
    cc = standin "gcc-wrapper" // {
      libc = standin "glibc" // {
        pname = "glibc";
        version = "2.40";
        linuxHeaders.version = "6.12";
      };
    };
  };

  standin =
    name:
    mkDerivation {
      inherit name;
      meta.mainProgram = name;
    };

  # pkgs/build-support/trivial-builders/default.nix
  runCommand =
    name: env: buildCommand:
    mkDerivation (
      env
      // {
        inherit name buildCommand;
      }
    );
  writeTextFile =
    {
      name,
      text,
      executable ? false,
      destination ? "",
      meta ? { },
      passthru ? { },
      ...
    }:
    runCommand name {
      inherit
        text
        executable
        destination
        meta
        passthru
        ;
    } "printf %s \"$text\" > $out";
  writeText =
    name: text:
    writeTextFile {
      inherit name text;
    };
  writeScript =
    name: text:
    writeTextFile {
      inherit name text;
      executable = true;
    };
  writeShellScript = name: text: writeScript name "#!/bin/sh\n${text}";
  writeShellScriptBin =
    name: text:
    writeTextFile {
      inherit name;
      text = "#!/bin/sh\n${text}";
      executable = true;
      destination = "/bin/${name}";
      meta.mainProgram = name;
    };
  # pkgs/build-support/trivial-builders/default.nix writeShellApplication (the real one also
  # sets errexit/nounset/pipefail and runs shellcheck; thin here)
  writeShellApplication =
    {
      name,
      text,
      runtimeInputs ? [ ],
      meta ? { },
      passthru ? { },
      ...
    }:
    writeTextFile {
      inherit name passthru;
      text = "#!/bin/sh\nexport PATH=${lib.makeBinPath runtimeInputs}:$PATH\n${text}";
      executable = true;
      destination = "/bin/${name}";
      meta = {
        mainProgram = name;
      }
      // meta;
    };
  # pkgs/build-support/trivial-builders/default.nix symlinkJoin
  symlinkJoin =
    args:
    mkDerivation (
      builtins.removeAttrs args [ "paths" ]
      // {
        paths = args.paths;
        buildCommand = "mkdir -p $out; ${args.postBuild or ""}";
      }
    );
  # pkgs/build-support/trivial-builders/default.nix makeSetupHook (the signature without
  # `deps`; substitutions become attributes of the hook derivation)
  makeSetupHook =
    {
      name ? lib.warn "calling makeSetupHook without passing a name is deprecated." "hook",
      propagatedBuildInputs ? [ ],
      depsTargetTargetPropagated ? [ ],
      meta ? { },
      passthru ? { },
      substitutions ? { },
    }:
    script:
    runCommand name (
      substitutions
      // {
        inherit
          meta
          passthru
          propagatedBuildInputs
          depsTargetTargetPropagated
          script
          ;
      }
    ) "mkdir -p $out/nix-support; cp $script $out/nix-support/setup-hook";
  # pkgs/build-support/replace-vars/replace-vars.nix
  replaceVars =
    src: replacements:
    mkDerivation (
      replacements
      // {
        name = baseNameOf (toString src);
        inherit src;
      }
    );
  # pkgs/build-support/fetchurl/default.nix: a fixed-output derivation per URL.
  fetchurl =
    {
      url ? null,
      urls ? [ url ],
      hash ? "",
      sha256 ? "",
      name ? baseNameOf (toString (builtins.head urls)),
      passthru ? { },
      ...
    }:
    let
      outputHash = if hash != "" then hash else sha256;
    in
    assert outputHash != "";
    derivation {
      inherit name system urls outputHash;
      outputHashMode = "flat";
      outputHashAlgo = if hash != "" then null else "sha256";
      builder = "/bin/sh";
      args = [
        "-c"
        "echo 'nixpkgs stand-in: no network' >&2; exit 1"
      ];
    }
    // passthru
    // {
      inherit url urls passthru;
    };

  # pkgs/development/interpreters/python/default.nix (passthru of python3XX)
  mkPython =
    version:
    let
      mm = lib.versions.majorMinor version;
      parts = lib.splitString "." version;
      py = mkDerivation {
        pname = "python3";
        inherit version;
        passthru = {
          implementation = "cpython";
          pythonVersion = mm;
          sitePackages = "lib/python${mm}/site-packages";
          executable = "python${mm}";
          interpreter = "${py}/bin/python${mm}";
          isPy3 = true;
          pythonOnBuildForHost = py;
          pythonForBuild = py;
          pythonAtLeast = lib.versionAtLeast mm;
          pythonOlder = lib.versionOlder mm;
          sourceVersion = {
            major = builtins.elemAt parts 0;
            minor = builtins.elemAt parts 1;
            patch = builtins.elemAt parts 2;
            suffix = "";
          };
          inherit stdenv;
          meta.mainProgram = "python3";
        };
      };
    in
    py;
in
{
  inherit
    lib
    config
    overlays
    system
    stdenv
    runCommand
    writeTextFile
    writeText
    writeScript
    writeShellScript
    writeShellScriptBin
    writeShellApplication
    symlinkJoin
    makeSetupHook
    replaceVars
    fetchurl
    ;
  pkgs = self;
  # pkgs/top-level/stage.nix: what lib.types.pkgs checks for
  _type = "pkgs";
  buildPackages = self;
  __splicedPackages = self;
  runCommandLocal = runCommand;
  # pkgs/top-level/splice.nix
  callPackage = lib.callPackageWith self;
  callPackages = lib.callPackagesWith self;
  newScope = extra: lib.callPackageWith (self // extra);

  # pkgs/development/interpreters/python/default.nix, at the revision's 3.12 / 3.13
  python312 = mkPython "3.12.13";
  python3 = mkPython "3.13.12";
  # pkgs/development/interpreters/python/manylinux/default.nix (library lists of glibc,
  # stdenv.cc.cc's lib output, X11/GL/glib; empty here: tests/nix/test_linkage.py models
  # the sonames they provide)
  pythonManylinuxPackages = {
    manylinux1 = [ ];
    manylinux2010 = [ ];
    manylinux2014 = [ ];
  };
  # pkgs/development/cuda-modules (cudaPackages_13_0: CUDA 13.0.x)
  cudaPackages_13_0 = {
    cudaMajorMinorVersion = "13.0";
    cudaVersion = "13.0";
    cudatoolkit = standin "cuda-merged-13.0";
    backendStdenv = stdenv // {
      cc = standin "gcc-wrapper-14";
    };
  };
  # pkgs/by-name/ad/addDriverRunpath/package.nix: makeSetupHook whose substitution
  # driverLink = "/run/opengl-driver" (x86_64) is an attribute of the hook
  addDriverRunpath = self.makeSetupHook {
    name = "add-driver-runpath-hook";
    substitutions.driverLink = "/run/opengl-driver";
  } (self.writeText "setup-hook.sh" "");
  # pkgs/by-name/au/autoAddDriverRunpath/package.nix
  autoAddDriverRunpath = standin "auto-add-driver-runpath-hook";
  # makeSetupHook { name = "auto-patchelf-hook"; propagatedBuildInputs = [ auto-patchelf
  # bintools ]; … } of the script pkgs/build-support/setup-hooks/auto-patchelf.sh, in
  # pkgs/top-level/all-packages.nix
  autoPatchelfHook = self.makeSetupHook { name = "auto-patchelf-hook"; } (
    self.writeText "auto-patchelf.sh" ""
  );
  # pkgs/build-support/setup-hooks/make-wrapper.sh (makeWrapper)
  makeWrapper = standin "make-wrapper-hook";
  # pkgs/build-support/mkshell/default.nix
  mkShell =
    {
      packages ? [ ],
      inputsFrom ? [ ],
      shellHook ? "",
      env ? { },
      ...
    }@args:
    mkDerivation (
      builtins.removeAttrs args [
        "packages"
        "inputsFrom"
      ]
      // {
        name = args.name or "nix-shell";
        nativeBuildInputs = packages ++ (args.nativeBuildInputs or [ ]);
        inherit shellHook env;
      }
    );
  # pkgs/by-name/<xx>/<name>/package.nix, each a leaf derivation here
  ugrep = standin "ugrep" // { meta.mainProgram = "ugrep"; };
  unzip = standin "unzip";
  ninja = standin "ninja";
  uv = standin "uv";
  nixfmt = standin "nixfmt";
  nixfmt-tree = standin "treefmt-nixfmt" // {
    meta.mainProgram = "treefmt";
  };
  curl = standin "curl";
  tbb = standin "tbb";
  # pkgs/by-name/rd/rdma-core/package.nix, pkgs/by-name/uc/ucx/package.nix
  rdma-core = standin "rdma-core";
  ucx = standin "ucx";
  # pkgs/development/libraries/zlib/default.nix
  zlib = standin "zlib";
  # pkgs/top-level/python-packages.nix: build-system-pkgs' overlay.nix borrows these setup
  # hooks from nixpkgs' Python packages.
  python3Packages = lib.genAttrs [
    "setuptools-scm"
    "meson-python"
    "poetry-dynamic-versioning"
    "pdm-backend"
  ] (n: standin "python3-${n}" // {
    setupHook = self.writeText "${n}-setup-hook.sh" "";
    setupHooks = [ ];
  });
  # pkgs/top-level/all-packages.nix testers -> pkgs/build-support/testers/default.nix
  testers.runNixOSTest = import ./nixos/run-test.nix { inherit lib; pkgs = self; };
}
