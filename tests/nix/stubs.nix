# Stand-ins for the parts of nixpkgs that uv2nix/pyproject.nix overlays touch, so their
# lib-level code runs under Nix 2.8 (current nixpkgs cannot be evaluated there). A
# "derivation" is the attribute set mkDerivation was given, with overrideAttrs and
# passthru merged as stdenv does, and outPath = /stub/<pname>.
{
  lib,
  pins,
  pythonVersion,
  glibcVersion ? "2.40",
}:
let
  platform = lib.systems.elaborate "x86_64-linux";
  libc = {
    pname = "glibc";
    version = glibcVersion;
    linuxHeaders.version = "6.12";
  };
  stdenv = {
    hostPlatform = platform;
    targetPlatform = platform;
    buildPlatform = platform;
    isLinux = true;
    isDarwin = false;
    cc.libc = libc;
    mkDerivation = mkDrv;
  };
  # A derivation stand-in: the attribute set mkDerivation was given, with
  # overrideAttrs and passthru merged as stdenv does.
  mkDrv =
    f:
    let
      attrs = if builtins.isFunction f then f attrs else f;
    in
    attrs
    // (attrs.passthru or { })
    // {
      outPath = "/stub/${attrs.pname}";
      overrideAttrs = g: mkDrv (self: attrs // (if builtins.isFunction (g attrs) then g attrs self else g attrs));
    };
  python = {
    pname = "python3";
    version = pythonVersion;
    inherit stdenv;
    sitePackages = "lib/python${pins.python.package}/site-packages";
    interpreter = "/stub/python";
    passthru = {
      implementation = "cpython";
      pythonVersion = pins.python.package;
      sourceVersion = {
        major = builtins.elemAt (lib.splitString "." pythonVersion) 0;
        minor = builtins.elemAt (lib.splitString "." pythonVersion) 1;
        patch = builtins.elemAt (lib.splitString "." pythonVersion) 2;
        suffix = "";
      };
    };
  };
  stubPkgs = {
    autoAddDriverRunpath = "autoAddDriverRunpath";
    tbb = "tbb";
  };
  callPackage =
    f: args:
    f (
      builtins.intersectAttrs (builtins.functionArgs f) (
        {
          inherit stdenv python;
          fetchurl = a: a // { passthru.url = a.url; };
          autoPatchelfHook = "autoPatchelfHook";
          pythonManylinuxPackages = {
            manylinux1 = [ ];
            manylinux2010 = [ ];
            manylinux2014 = [ ];
          };
          unzip = "unzip";
          pyprojectHook = "pyprojectHook";
          pyprojectWheelHook = "pyprojectWheelHook";
          pyprojectEditableHook = "pyprojectEditableHook";
          resolveBuildSystem = _: [ ];
        }
        // args
      )
    );

in
{
  inherit
    stdenv
    python
    mkDrv
    stubPkgs
    callPackage
    ;
  # The base of a Python package set (what pyproject.nix's scope provides to overlays).
  base = {
    inherit python callPackage stdenv;
  };
}
