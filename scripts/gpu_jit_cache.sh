#!/usr/bin/env bash
# Runs ON the GPU host: keep the JIT caches between leases, so a fresh machine's first server
# start does not rebuild them. On the H200 a fresh machine's first server takes ~260 s to be
# ready where a later one takes 60-110 s: ~100 s more capturing its CUDA graphs and ~95 s more
# on its first request (docs/gpu-results.md §25). Restoring the caches did not shorten it
# until the staged files got a fixed mtime (gpu_stage.py STAGE_MTIME, §39): FlashInfer runs
# ninja on every load, and headers stamped at staging time were newer than any cached object,
# so every module was rebuilt. `save` also keeps TorchInductor's cache (SGLang compiles a few
# helpers with torch.compile) and CUDA's PTX cache (~/.nv/ComputeCache), and prints the size
# of every candidate, kept or not.
#
#   gpu_jit_cache.sh save <out-dir>       tar the caches into <out-dir>/jit-cache.tgz (+ .sha256)
#   gpu_jit_cache.sh restore <tgz>        unpack them (checksum first)
#   gpu_jit_cache.sh merge <out-dir> <tgz>...   (here, before staging) one archive of several
#
# A cache over 16 MiB alone is left out, but what this lease added to it (files newer than the
# stamp `restore` leaves) goes to jit-cache-new.tgz when that fits; merge it with the others.
#
# Caches are taken in priority order while the archive stays within 16 MiB (the largest file
# a device call brings back); the ones that do not fit go to jit-cache-2.tgz (+ .sha256), a
# cache over 16 MiB alone is named on stderr and left out, and `save` refuses when not even the
# first fits. (2026-12-05 on the H200: FlashInfer's 25 MB and tvm-ffi's 18 MB filled the
# archive, and Triton's cache, kept on the H100 the lease before, was left out.) `merge` unpacks
# archives in order (a later one's file wins), checks each as `restore` does, and packs them into
# <out-dir>/jit-cache.tgz with no 16 MiB limit (the staging call carries it; 48 MiB at most). Entries are relative to $HOME; TorchInductor's cache
# ($TORCHINDUCTOR_CACHE_DIR, else /tmp/torchinductor_<user>) travels as .cache/torchinductor
# and goes back to where torch looks for it. FlashInfer keys its cache by its version and the
# GPU arch (.cache/flashinfer/<version>/<arch>/), so a restored cache of another version is
# simply unused. Every failure is one line on stderr and a non-zero exit (1: bad/missing data,
# 2: usage).
set -euo pipefail

die() { echo "gpu_jit_cache: $2" >&2; exit "$1"; }

# priority order: FlashInfer's modules (minutes to build), their tvm-ffi loaders, Triton's
# kernels, TorchInductor's compiled helpers, CUDA's PTX-to-SASS cache
CACHES=(.cache/flashinfer .cache/tvm-ffi .triton .cache/torchinductor .nv/ComputeCache)
INDUCTOR=.cache/torchinductor
STAMP=.cache/sglang-dflash-jit-restored  # touched by restore
LIMIT=$((16 * 1024 * 1024))
MERGE_LIMIT=$((48 * 1024 * 1024))

[ $# -ge 2 ] || die 2 "usage: gpu_jit_cache.sh save <out-dir> | restore <jit-cache.tgz> | merge <out-dir> <jit-cache.tgz>..."
case "$1" in save | restore) [ $# -eq 2 ] || die 2 "usage: gpu_jit_cache.sh $1 <one argument>" ;; esac
home=${HOME:?HOME is not set}
inductor_dir=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(id -un)}

# where a cache lives on this host: $HOME/<entry>, except TorchInductor's
src_of() { if [ "$1" = "$INDUCTOR" ]; then echo "$inductor_dir"; else echo "$home/$1"; fi; }

# tar the given entries (relative to $HOME; TorchInductor's renamed into it) into $1
pack() {
    local tgz=$1 args=()
    shift
    for c in "$@"; do
        if [ "$c" = "$INDUCTOR" ]; then
            args+=(-C "$(dirname "$inductor_dir")"
                   --transform "s,^$(basename "$inductor_dir"),$INDUCTOR,"
                   "$(basename "$inductor_dir")")
        else
            args+=(-C "$home" "$c")
        fi
    done
    tar czf "$tgz" "${args[@]}"
}

# pack into $out/<name> as many of the caches after it as fit in 16 MiB, in order, with its
# .sha256; FILLED: those packed, OVER: the rest (no archive when none fits)
fill() {
    local name=$1 c
    shift
    FILLED=()
    OVER=()
    for c in "$@"; do
        pack "$out/$name.try" "${FILLED[@]}" "$c"
        if [ "$(stat -c %s "$out/$name.try")" -le "$LIMIT" ]; then
            FILLED+=("$c")
            mv "$out/$name.try" "$out/$name"
        else
            OVER+=("$c")
        fi
    done
    rm -f "$out/$name.try"
    if [ ${#FILLED[@]} -gt 0 ]; then
        (cd "$out" && sha256sum "$name" > "$name.sha256")
    fi
}

# die unless <tgz> exists, matches its .sha256 and holds JIT-cache entries only
checked() {
    local tgz=$1 sums="$1.sha256" want got entry
    [ -f "$tgz" ] || die 2 "$tgz: no such file"
    [ -f "$sums" ] || die 1 "$sums: missing (carry it with the archive)"
    want=$(cut -d' ' -f1 < "$sums")
    got=$(sha256sum "$tgz" | cut -d' ' -f1)
    [ "$want" = "$got" ] || die 1 "$tgz: sha256 $got does not match $sums"
    while read -r entry; do
        case "$entry" in
        /* | *../*) die 1 "$tgz: unsafe entry '$entry'" ;;
        .cache/flashinfer* | .triton* | .cache/tvm-ffi* | .cache/torchinductor* | .nv/ComputeCache*) ;;
        *) die 1 "$tgz: entry '$entry' is not a JIT cache" ;;
        esac
    done < <(tar tzf "$tgz")
}

case "$1" in
save)
    out=${2%/}
    [ -d "$out" ] || die 2 "$out: not a directory"
    sizes=()
    present=()
    for c in "${CACHES[@]}"; do
        d=$(src_of "$c")
        if [ -d "$d" ]; then
            present+=("$c")
            sizes+=("$c $(du -sk "$d" | cut -f1) KiB")
        else
            sizes+=("$c absent")
        fi
    done
    echo "gpu_jit_cache: candidates: $(IFS=,; echo "${sizes[*]}" | sed 's/,/, /g')"
    [ ${#present[@]} -gt 0 ] || die 1 "no JIT cache under $home (${CACHES[*]}): nothing to save"
    rm -f "$out/jit-cache.tgz" "$out/jit-cache.tgz.sha256"
    fill jit-cache.tgz "${present[@]}"
    [ ${#FILLED[@]} -gt 0 ] ||
        die 1 "archive is over the 16 MiB a call brings back even with ${present[0]} alone"
    echo "gpu_jit_cache: saved ${FILLED[*]} -> $out/jit-cache.tgz" \
         "($(($(stat -c %s "$out/jit-cache.tgz") / 1024)) KiB)"
    fill jit-cache-2.tgz "${OVER[@]}"  # what did not fit: a second archive, as much as fits
    if [ ${#FILLED[@]} -gt 0 ]; then
        echo "gpu_jit_cache: saved ${FILLED[*]} -> $out/jit-cache-2.tgz" \
             "($(($(stat -c %s "$out/jit-cache-2.tgz") / 1024)) KiB; merge both before staging)"
    fi
    # a cache over 16 MiB alone: what this lease added to it (files newer than the restore's
    # stamp) may still fit, e.g. FlashInfer's modules for a new head size (2026-12-05 §29:
    # 51 MB in all, the lease's own share compiled again on the next machine for 158 s)
    new=()  # the caches whose additions were saved
    if [ ${#OVER[@]} -gt 0 ] && [ -f "$home/$STAMP" ]; then
        list=$(mktemp)
        added=()
        for c in "${OVER[@]}"; do
            [ "$c" = "$INDUCTOR" ] && continue
            before=$(wc -l < "$list")
            (cd "$home" && find "$c" -type f -newer "$STAMP") >> "$list"
            [ "$(wc -l < "$list")" -gt "$before" ] && added+=("$c")
        done
        if [ -s "$list" ]; then
            tar czf "$out/jit-cache-new.tgz" -C "$home" -T "$list"
            if [ "$(stat -c %s "$out/jit-cache-new.tgz")" -le "$LIMIT" ]; then
                new=("${added[@]}")
                (cd "$out" && sha256sum jit-cache-new.tgz > jit-cache-new.tgz.sha256)
                echo "gpu_jit_cache: saved what this lease added to ${new[*]}" \
                     "($(wc -l < "$list") files) -> $out/jit-cache-new.tgz" \
                     "($(($(stat -c %s "$out/jit-cache-new.tgz") / 1024)) KiB; merge it too)"
            else
                rm -f "$out/jit-cache-new.tgz"
            fi
        fi
        rm -f "$list"
    fi
    if [ ${#OVER[@]} -gt 0 ]; then
        note=""
        [ ${#new[@]} -gt 0 ] && note=" (the lease's own additions to ${new[*]}: jit-cache-new.tgz)"
        echo "gpu_jit_cache: left out (over 16 MiB in either archive): ${OVER[*]}$note" >&2
    fi
    ;;
merge)
    [ $# -ge 3 ] || die 2 "usage: gpu_jit_cache.sh merge <out-dir> <jit-cache.tgz>..."
    out=${2%/}
    [ -d "$out" ] || die 2 "$out: not a directory"
    shift 2
    for tgz in "$@"; do checked "$tgz"; done
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    for tgz in "$@"; do tar xzf "$tgz" -C "$tmp"; done
    entries=()
    for c in "${CACHES[@]}"; do [ -d "$tmp/$c" ] && entries+=("$c"); done
    tar czf "$out/jit-cache.tgz.try" -C "$tmp" "${entries[@]}"
    size=$(stat -c %s "$out/jit-cache.tgz.try")
    if [ "$size" -gt "$MERGE_LIMIT" ]; then
        rm -f "$out/jit-cache.tgz.try"
        die 1 "merged archive is $((size / 1048576)) MiB, over the 48 MiB a staging call carries"
    fi
    mv "$out/jit-cache.tgz.try" "$out/jit-cache.tgz"
    (cd "$out" && sha256sum jit-cache.tgz > jit-cache.tgz.sha256)
    echo "gpu_jit_cache: merged $# archive(s): ${entries[*]} -> $out/jit-cache.tgz ($((size / 1024)) KiB)"
    ;;
restore)
    tgz=$2
    checked "$tgz"
    tar xzf "$tgz" -C "$home"
    if [ -d "$home/$INDUCTOR" ] && [ "$home/$INDUCTOR" != "$inductor_dir" ]; then
        mkdir -p "$inductor_dir"
        cp -a "$home/$INDUCTOR/." "$inductor_dir/"
        rm -rf "${home:?}/$INDUCTOR"
    fi
    mkdir -p "$(dirname "$home/$STAMP")"
    touch "$home/$STAMP"  # save's "what this lease added" is what is newer than this
    echo "gpu_jit_cache: restored $(tar tzf "$tgz" | wc -l) entries into $home"
    ;;
*) die 2 "unknown command '$1' (save | restore)" ;;
esac
