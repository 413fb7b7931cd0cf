#!/usr/bin/env bash
# Build (once) and cache a Debian 13 (trixie) root with Debian's nix-bin (Nix 2.26) in it,
# from Debian's own packages: debootstrap (minbase), then apt-get inside the root.
#   tests/nix/realnix/make-root.sh [ROOT]     (default: $SGLANG_DFLASH_TRIXIE_ROOT or
#                                              /work/deps/trixie-root)
# Needs root (debootstrap, chroot) and Debian's mirror. Re-running is a no-op once
# ROOT/.sglang-dflash-ready exists. Prints the root's `nix --version`.
set -euo pipefail
root=${1:-${SGLANG_DFLASH_TRIXIE_ROOT:-/work/deps/trixie-root}}
mirror=${SGLANG_DFLASH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
nix_version() {  # nix needs /proc; the mounts vanish with the namespace
  unshare -m --propagation private sh -c "mount -t proc proc '$1/proc' && chroot '$1' nix --version"
}
if [ -e "$root/.sglang-dflash-ready" ]; then
  nix_version "$root"
  exit 0
fi
command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null; }
tmp="$root.tmp"
rm -rf "$tmp"
debootstrap --variant=minbase trixie "$tmp" "$mirror" >"$tmp.log" 2>&1 || { tail -20 "$tmp.log" >&2; exit 1; }
cp /etc/resolv.conf "$tmp/etc/resolv.conf"
# nix-bin's dependencies are resolved by apt inside the root (debootstrap --include cannot
# resolve virtual packages such as perl-dbdabi-94).
chroot "$tmp" /usr/bin/env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  --no-install-recommends nix-bin ca-certificates >>"$tmp.log" 2>&1 || { tail -20 "$tmp.log" >&2; exit 1; }
chroot "$tmp" apt-get clean
mkdir -p "$tmp/etc/nix"
cat >"$tmp/etc/nix/nix.conf" <<'CONF'
experimental-features = nix-command flakes
sandbox = false
substituters =
build-users-group =
CONF
touch "$tmp/.sglang-dflash-ready"
rm -rf "$root" && mkdir -p "$(dirname "$root")" && mv "$tmp" "$root"
nix_version "$root"
