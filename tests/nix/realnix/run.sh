#!/usr/bin/env bash
# The real-Nix harness: Nix 2.26 (Debian 13's nix-bin, in the root make-root.sh builds) runs
# the flake's front door offline, every input overridden with a local tree:
#   nixpkgs                 -> tests/nix/nixpkgs-standin + the real nixpkgs lib at ./lib
#   uv2nix, pyproject-nix, pyproject-build-systems -> exported trees at the locked revisions
# Env: SGLANG_DFLASH_TRIXIE_ROOT, SGLANG_DFLASH_NIXPKGS_LIB, SGLANG_DFLASH_UV2NIX,
#      SGLANG_DFLASH_PYPROJECT_NIX, SGLANG_DFLASH_BUILD_SYSTEM_PKGS;
#      SGLANG_DFLASH_REALNIX_SRC (optional): run on that tree instead of this checkout.
# Writes the commands' outputs to $OUT (default: a temp dir, printed); exits non-zero on the
# first failing command. Run as root (chroot).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../../.." && pwd)
root=${SGLANG_DFLASH_TRIXIE_ROOT:-/work/deps/trixie-root}
for v in SGLANG_DFLASH_NIXPKGS_LIB SGLANG_DFLASH_UV2NIX SGLANG_DFLASH_PYPROJECT_NIX SGLANG_DFLASH_BUILD_SYSTEM_PKGS; do
  [ -d "${!v:-}" ] || { echo "SKIP: $v is not a directory (an exported input tree; docs/nix.md)"; exit 77; }
done
[ -e "$root/.sglang-dflash-ready" ] || { echo "SKIP: no Debian 13 root at $root (tests/nix/realnix/make-root.sh)"; exit 77; }

h=$root/h
rm -rf "$h" && mkdir -p "$h/in" "$h/out"
# The flake as a user's checkout has it: tracked + untracked-not-ignored files (or, for the
# harness's own tests, the tree SGLANG_DFLASH_REALNIX_SRC names).
if [ -n "${SGLANG_DFLASH_REALNIX_SRC:-}" ]; then
  cp -r "$SGLANG_DFLASH_REALNIX_SRC/." "$h/in/"
else
  (cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$h/in")
fi
mv "$h/in" "$h/src"
mkdir -p "$h/nixpkgs"
cp -r "$repo/tests/nix/nixpkgs-standin/." "$h/nixpkgs/"
cp -r "$SGLANG_DFLASH_NIXPKGS_LIB/lib" "$h/nixpkgs/lib"
cp -r "$SGLANG_DFLASH_NIXPKGS_LIB" "$h/nixpkgs.lib"   # hashed whole (tests/nix/nixpkgs-lib.lock.json)
cp -r "$SGLANG_DFLASH_UV2NIX" "$h/uv2nix"
cp -r "$SGLANG_DFLASH_PYPROJECT_NIX" "$h/pyproject-nix"
cp -r "$SGLANG_DFLASH_BUILD_SYSTEM_PKGS" "$h/build-system-pkgs"
cp "$repo/tests/nix/realnix/inside.sh" "$h/inside.sh"

rc=0
unshare -m --propagation private sh -c "
  mount -t proc proc '$root/proc' && mount --rbind /dev '$root/dev' &&
  chroot '$root' /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root bash /h/inside.sh" || rc=$?
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
cp -r "$h/out/." "$out/"
echo "outputs in $out"
exit $rc
