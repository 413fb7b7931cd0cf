#!/usr/bin/env bash
# Apply a patch series to an installed (wheel) package tree, then make its bytecode match.
#
# Why: pyproject.nix installs wheels with `uv pip install --compile-bytecode`, so every
# .py under site-packages already has a __pycache__/*.pyc when postInstall runs. Patching
# the sources afterwards leaves those .pyc files describing the UNPATCHED code. With
# SOURCE_DATE_EPOCH set (as in every Nix build) they are checked-hash pycs: CPython notices
# the mismatch and recompiles in memory on every import (it cannot write to the store), and
# under PYC_INVALIDATION_MODE=UNCHECKED_HASH (or any unchecked pyc) it would run the old
# code. So: for every file a patch touches, drop its cached bytecode and compile it again
# with the same invalidation mode uv used. tests/nix/test_bytecode.py proves both halves.
#
# usage: apply-patches.sh SITE_PACKAGES PYTHON PATCH...
set -euo pipefail

if [ "$#" -lt 2 ]; then
  echo "usage: apply-patches.sh SITE_PACKAGES PYTHON PATCH..." >&2
  exit 2
fi
site="$1"
python="$2"
shift 2

# Paths (relative to SITE_PACKAGES, -p1) that a unified diff creates or changes.
touched_files() {
  sed -n -e 's/^+++ [^/]*\/\([^\t]*\).*$/\1/p' "$1" | grep -v '^/dev/null$' || true
}

changed=()
for p in "$@"; do
  echo "apply-patches: applying $(basename "$p")"
  patch --batch --forward --strip=1 --directory="$site" --input="$p"
  while IFS= read -r f; do
    [ -n "$f" ] && changed+=("$f")
  done < <(touched_files "$p")
done

compile=()
for f in "${changed[@]+"${changed[@]}"}"; do
  case "$f" in
    *.py) ;;
    *) continue ;;
  esac
  dir="$site/$(dirname "$f")"
  stem="$(basename "$f" .py)"
  rm -f "$dir"/__pycache__/"$stem".*.pyc
  [ -f "$site/$f" ] && compile+=("$site/$f")
done

if [ "${#compile[@]}" -gt 0 ]; then
  # Same choice of invalidation mode as uv's compileall helper.
  "$python" - "${compile[@]}" <<'PY'
import os
import py_compile
import sys

name = os.environ.get("PYC_INVALIDATION_MODE")
mode = py_compile.PycInvalidationMode[name] if name else py_compile._get_default_invalidation_mode()
for path in sys.argv[1:]:
    py_compile.compile(path, doraise=True, invalidation_mode=mode)
    print(f"apply-patches: recompiled {path} ({mode.name})")
PY
fi
