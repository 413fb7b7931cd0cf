#!/usr/bin/env bash
# Runs ON the GPU host: one device call's worth of benchmarks/adaptive_grid.py, resumable, its
# whole export (results, grid, server logs, its own log) in one tarball. What §39-§41's grid
# calls were written out by hand for each lease (docs/gpu-results.md, "Next GPU sessions"): the
# same NAME resumes the same grid call after call, a call that loses the machine loses only
# itself, and no file is left out by the device tool's 8-file limit.
#
#   bash scripts/gpu_grid_call.sh NAME LIMIT_S ADAPTIVE_GRID_OPTION...
#
# NAME       the grid's --out under $ROOT (default /root; kept between calls of one lease: the
#            next call with the same NAME resumes it) and its tarball $OUT/NAME.tgz
# LIMIT_S    seconds from this script's start by which it returns: adaptive_grid is stopped
#            (SIGINT: it saves and exports) 20 s before, and plans to end 35 s before
# OPTION...  adaptive_grid's options (--modes, --regimes, --levels, --adaptive-policy, ...);
#            --out, --site, --export and --time-budget-s are this script's
# Env: SITE (default /root/site), ROOT (default /root), OUT (the device tool's), JIT_SAVE=1 (also
# `gpu_jit_cache.sh save $OUT`). Runs from the repository root with PYTHONPATH set as the staged
# site wants it. Prints adaptive_grid's cells and its summary line, then "gpu_grid_call: NAME
# complete" or "... incomplete: the same command resumes". Exit: 0 complete, 3 incomplete (a
# server skipped for time, or the grid stopped at the limit: run it again), adaptive_grid's
# status when it failed, 2 on usage.
set -uo pipefail

die() { echo "gpu_grid_call: $1" >&2; exit 2; }

[ $# -ge 2 ] || die "usage: gpu_grid_call.sh NAME LIMIT_S ADAPTIVE_GRID_OPTION..."
NAME=$1 LIMIT=$2; shift 2
[[ $NAME =~ ^[A-Za-z0-9._-]+$ ]] || die "NAME $NAME: letters, digits, . _ - only (it names a file that must come back)"
[[ $LIMIT =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 120 ] || die "LIMIT_S $LIMIT: whole seconds, at least 120"
[ -n "${OUT:-}" ] && [ -d "$OUT" ] || die "OUT is not a directory: run it inside a device call"
for a in "$@"; do
  case $a in --out | --out=* | --site | --site=* | --export | --export=* | --time-budget-s | --time-budget-s=*)
    die "$a is set by gpu_grid_call.sh (NAME, SITE, LIMIT_S)" ;;
  esac
done
SITE=${SITE:-/root/site} ROOT=${ROOT:-/root}
EXPORT=$ROOT/export/$NAME
mkdir -p "$ROOT/$NAME" "$ROOT/export" || die "cannot create $ROOT/$NAME"
LOG=$ROOT/$NAME.log

timeout -s INT -k 15 $((LIMIT - 20 - SECONDS)) python3 -m adaptive_grid --out "$ROOT/$NAME" \
  --site "$SITE" --export "$EXPORT" --time-budget-s $((LIMIT - 35 - SECONDS)) "$@" > "$LOG" 2>&1
RC=$?
echo "gpu_grid_call: adaptive_grid rc=$RC at ${SECONDS}s"
grep "^\[adaptive_grid\]" "$LOG" | tail -40
LAST=$(tail -1 "$LOG")
echo "$LAST" | cut -c1-1500
mkdir -p "$EXPORT" && cp "$LOG" "$EXPORT/"
tar -czf "$OUT/$NAME.tgz" -C "$ROOT/export" "$NAME" || echo "gpu_grid_call: tar failed" >&2
[ "${JIT_SAVE:-0}" = 1 ] && { bash scripts/gpu_jit_cache.sh save "$OUT" || echo "gpu_grid_call: JIT cache not saved" >&2; }
python3 scripts/gpu_out_fit.py "$OUT" || echo "gpu_grid_call: something in $OUT cannot come back" >&2
case $RC in
  0) ;;
  124 | 130 | 137 | 143) echo "gpu_grid_call: $NAME incomplete (stopped at the limit): the same command resumes"; exit 3 ;;
  *) echo "gpu_grid_call: $NAME failed (adaptive_grid rc=$RC): $LOG" >&2; exit "$RC" ;;
esac
# the summary line is JSON with "skipped": {} once every server of the grid has run
if python3 -c 'import json, sys; sys.exit(0 if json.loads(sys.argv[1]).get("skipped") == {} else 1)' "$LAST" 2>/dev/null; then
  echo "gpu_grid_call: $NAME complete"
  exit 0
fi
echo "gpu_grid_call: $NAME incomplete: the same command resumes"
exit 3
