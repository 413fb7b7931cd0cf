#!/usr/bin/env bash
# Runs ON the GPU host: reassemble the parts made by scripts/gpu_stage.py, verify them and
# unpack the site directory, then byte-compile it (scripts/gpu_bytecompile.sh beside this one:
# each server's processes import from .pyc instead of compiling).
#   Usage: gpu_unstage.sh <part-dir> <dest>
# <part-dir> holds SHA256SUMS and every <tarball>.part-NN it lists. Idempotent: when <dest>
# already holds this tarball (marker <dest>/.stage-sha256) nothing is done. Every failure is
# one line on stderr and a non-zero exit (1: bad/missing data, 2: usage).
set -euo pipefail

die() { echo "gpu_unstage: $2" >&2; exit "$1"; }

[ $# -eq 2 ] || die 2 "usage: gpu_unstage.sh <part-dir> <dest>"
parts_dir=${1%/}
dest=${2%/}
[ -d "$parts_dir" ] || die 2 "$parts_dir: not a directory"
sums="$parts_dir/SHA256SUMS"
[ -f "$sums" ] || die 1 "$sums: missing (carry it with the last part)"

tar_sha="" tar_name="" parts=() part_shas=()
while read -r sha name; do
    [ -n "${sha:-}" ] || continue
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die 1 "$sums: malformed line '$sha $name'"
    name=${name#\*}
    if [[ "$name" == *.part-* ]]; then
        parts+=("$name"); part_shas+=("$sha")
    else
        tar_sha=$sha; tar_name=$name
    fi
done < "$sums"
[ -n "$tar_sha" ] || die 1 "$sums: no tarball line"
[ ${#parts[@]} -gt 0 ] || die 1 "$sums: no part lines"

if [ -f "$dest/.stage-sha256" ] && [ "$(cat "$dest/.stage-sha256")" = "$tar_sha" ]; then
    echo "gpu_unstage: $dest already holds $tar_name ${tar_sha:0:12}; nothing to do"
    exit 0
fi

missing=()
for p in "${parts[@]}"; do [ -f "$parts_dir/$p" ] || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] || die 1 "missing ${#missing[@]} of ${#parts[@]} parts in $parts_dir: ${missing[*]}"

start=$SECONDS
for i in "${!parts[@]}"; do
    got=$(sha256sum "$parts_dir/${parts[$i]}" | cut -d' ' -f1)
    [ "$got" = "${part_shas[$i]}" ] || die 1 "part ${parts[$i]} is corrupt: sha256 $got, expected ${part_shas[$i]}"
done

tarball="$parts_dir/$tar_name"
for p in "${parts[@]}"; do cat "$parts_dir/$p"; done > "$tarball"
got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$got" != "$tar_sha" ]; then
    rm -f "$tarball"
    die 1 "reassembled $tar_name has sha256 $got, expected $tar_sha"
fi

new="$dest.unstage-new"
rm -rf "$new"
mkdir -p "$new"
if ! err=$(tar -xzf "$tarball" -C "$new" 2>&1); then
    rm -rf "$new" "$tarball"
    die 1 "unpacking $tar_name failed: $(echo "$err" | tail -n 1)"
fi
rm -f "$tarball"
echo "$tar_sha" > "$new/.stage-sha256"
rm -rf "$dest"
mv "$new" "$dest"

files=$(find "$dest" -type f | wc -l)
mib=$(du -sm "$dest" | cut -f1)
echo "gpu_unstage: unpacked $tar_name ${tar_sha:0:12} (${#parts[@]} parts) into $dest: $files files, $mib MiB, $((SECONDS - start)) s"
bytecompile="$(dirname "$0")/gpu_bytecompile.sh"
if [ -f "$bytecompile" ]; then bash "$bytecompile" "$dest"; else echo "gpu_unstage: $bytecompile missing; $dest not byte-compiled" >&2; fi
