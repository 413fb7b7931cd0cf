#!/usr/bin/env bash
# Runs ON the GPU host: keep the JIT caches between leases, so a fresh machine's first server
# start does not rebuild them (FlashInfer's attention/sampling modules: 170-315 s of a 30-min
# device budget; the caches are ~50 MB: flashinfer 25 MB, triton 9-12 MB, tvm-ffi 12 MB).
#
#   gpu_jit_cache.sh save <out-dir>       tar the caches into <out-dir>/jit-cache.tgz (+ .sha256)
#   gpu_jit_cache.sh restore <tgz>        unpack them into $HOME (checksum first)
#
# `save` keeps FlashInfer's cache alone when all together exceed 16 MiB (the largest file a
# device call brings back) and refuses when even that does. Entries
# are relative to $HOME; FlashInfer keys its cache by its version and the GPU arch
# (.cache/flashinfer/<version>/<arch>/), so a restored cache of another version is simply unused.
# Every failure is one line on stderr and a non-zero exit (1: bad/missing data, 2: usage).
set -euo pipefail

die() { echo "gpu_jit_cache: $2" >&2; exit "$1"; }

CACHES=(.cache/flashinfer .triton .cache/tvm-ffi)
LIMIT=$((16 * 1024 * 1024))

[ $# -eq 2 ] || die 2 "usage: gpu_jit_cache.sh save <out-dir> | restore <jit-cache.tgz>"
home=${HOME:?HOME is not set}

case "$1" in
save)
    out=${2%/}
    [ -d "$out" ] || die 2 "$out: not a directory"
    present=()
    for c in "${CACHES[@]}"; do [ -d "$home/$c" ] && present+=("$c"); done
    [ ${#present[@]} -gt 0 ] || die 1 "no JIT cache under $home (${CACHES[*]}): nothing to save"
    tar czf "$out/jit-cache.tgz" -C "$home" "${present[@]}"
    size=$(stat -c %s "$out/jit-cache.tgz")
    if [ "$size" -gt "$LIMIT" ] && [ -d "$home/${CACHES[0]}" ] && [ ${#present[@]} -gt 1 ]; then
        # too big together: FlashInfer's alone is the one worth minutes
        echo "gpu_jit_cache: all caches are $((size / 1048576)) MiB; keeping ${CACHES[0]} only" >&2
        present=("${CACHES[0]}")
        tar czf "$out/jit-cache.tgz" -C "$home" "${present[@]}"
        size=$(stat -c %s "$out/jit-cache.tgz")
    fi
    if [ "$size" -gt "$LIMIT" ]; then
        rm -f "$out/jit-cache.tgz"
        die 1 "archive is $((size / 1048576)) MiB, over the 16 MiB a call brings back: save fewer caches"
    fi
    (cd "$out" && sha256sum jit-cache.tgz > jit-cache.tgz.sha256)
    echo "gpu_jit_cache: saved ${present[*]} -> $out/jit-cache.tgz ($((size / 1024)) KiB)"
    ;;
restore)
    tgz=$2
    [ -f "$tgz" ] || die 2 "$tgz: no such file"
    sums="$tgz.sha256"
    [ -f "$sums" ] || die 1 "$sums: missing (carry it with the archive)"
    want=$(cut -d' ' -f1 < "$sums")
    got=$(sha256sum "$tgz" | cut -d' ' -f1)
    [ "$want" = "$got" ] || die 1 "$tgz: sha256 $got does not match $sums"
    while read -r entry; do
        case "$entry" in
        /* | *../*) die 1 "$tgz: unsafe entry '$entry'" ;;
        .cache/flashinfer* | .triton* | .cache/tvm-ffi*) ;;
        *) die 1 "$tgz: entry '$entry' is not a JIT cache" ;;
        esac
    done < <(tar tzf "$tgz")
    tar xzf "$tgz" -C "$home"
    echo "gpu_jit_cache: restored $(tar tzf "$tgz" | wc -l) entries into $home"
    ;;
*) die 2 "unknown command '$1' (save | restore)" ;;
esac
