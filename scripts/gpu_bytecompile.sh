#!/usr/bin/env bash
# Runs ON the GPU host: byte-compile Python trees once, in parallel, so that every SGLang server
# of the lease imports from .pyc instead of compiling sglang, transformers, torch, ... again in
# each of its processes (§27's servers printed torchao's compile-time SyntaxWarning at every
# start: nothing was cached, ~55 s of a 65 s start was imports). Python reads a valid .pyc even
# when PYTHONDONTWRITEBYTECODE keeps it from writing one, so compiling ahead is what helps.
#   Usage: gpu_bytecompile.sh [--host] [dir ...]
# --host adds the site-packages directory that holds the host's torch (found without importing
# it). Files that do not compile (Python 2 test data, templates) are counted, not fatal; a tree
# that cannot be written is reported. One line on stdout; exit 2 on bad usage only.
set -uo pipefail

die() { echo "gpu_bytecompile: $2" >&2; exit "$1"; }

dirs=()
for a in "$@"; do
    case "$a" in
        --host)
            host=$(python3 -c 'import importlib.util as u, os; s = u.find_spec("torch"); print(os.path.dirname(s.submodule_search_locations[0]) if s else "")' 2>/dev/null) || host=""
            if [ -n "$host" ]; then dirs+=("$host"); else echo "gpu_bytecompile: no host torch found; --host skipped" >&2; fi ;;
        -*) die 2 "unknown option $a (usage: gpu_bytecompile.sh [--host] [dir ...])" ;;
        *) [ -d "$a" ] || die 2 "$a: not a directory"; dirs+=("$a") ;;
    esac
done
[ ${#dirs[@]} -gt 0 ] || die 2 "nothing to compile (usage: gpu_bytecompile.sh [--host] [dir ...])"

start=$SECONDS
failed=0
for d in "${dirs[@]}"; do
    # -j 0: one worker per core; -q: name only the failures, which we count.
    out=$(python3 -m compileall -q -j 0 "$d" 2>&1)
    failed=$((failed + $(printf '%s\n' "$out" | grep -c '^\*\*\* Error compiling' || true)))
done
pyc=0
for d in "${dirs[@]}"; do pyc=$((pyc + $(find "$d" -name '*.pyc' -path '*__pycache__*' | wc -l))); done
echo "gpu_bytecompile: ${dirs[*]}: $pyc .pyc files, $failed not compiled, $((SECONDS - start)) s"
