#!/usr/bin/env bash
# Runs ON the GPU host: one device call's worth of serving the trained pair, everything it
# wrote in one tarball, the tie margin's verdict inside it. What §31's calls 7 and 8 ran by hand
# (docs/gpu-results.md): a call that loses the machine loses only itself, and no file is left
# out by the device tool's 8-file limit.
#
#   bash scripts/gpu_pair_call.sh NAME LIMIT_S [--skip-done ROOT/EARLIER/results.json ...] MODE...
#
# NAME       the run's folder under $ROOT (default /root) and its tarball $OUT/NAME.tgz
# LIMIT_S    the device call's own limit (e.g. 590): serve_pair is stopped 75 s before it, its
#            budget ends 90 s before it, so the tie margin, the tarball and gpu_out_fit still run
# MODE...    serve_pair's modes (none, dflash, ddtree:16@flashinfer, seeded:ddtree:16, ...);
#            --skip-done files are passed on and also fed to the tie margin
# Env: PAIR (default /root/pair), SITE (default /root/site), ROOT (default /root), OUT (the
# device tool's), SERVE_PAIR_ARGS (more serve_pair options, e.g. "--freeze-gc"), TIE_TIMEOUT_S
# (default 45). Runs from the repository root with PYTHONPATH set as the staged site wants it.
# Exit: serve_pair's status (124 when the limit stopped it), or 2 on usage; the tie margin's and
# gpu_out_fit's failures are printed, not fatal (the tarball comes back either way).
set -uo pipefail

die() { echo "gpu_pair_call: $1" >&2; exit 2; }

[ $# -ge 3 ] || die "usage: gpu_pair_call.sh NAME LIMIT_S [--skip-done FILE ...] MODE..."
NAME=$1 LIMIT=$2; shift 2
[[ $NAME =~ ^[A-Za-z0-9._-]+$ ]] || die "NAME $NAME: letters, digits, . _ - only (it names a file that must come back)"
[[ $LIMIT =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 120 ] || die "LIMIT_S $LIMIT: whole seconds, at least 120"
[ -n "${OUT:-}" ] && [ -d "$OUT" ] || die "OUT is not a directory: run it inside a device call"
PAIR=${PAIR:-/root/pair} SITE=${SITE:-/root/site} ROOT=${ROOT:-/root}
SKIP=() TIE=()
while [ "${1:-}" = "--skip-done" ]; do
  [ $# -ge 2 ] || die "--skip-done needs a results.json"
  SKIP+=(--skip-done "$2"); TIE+=(--results "$2"); shift 2
done
[ $# -ge 1 ] || die "no MODE given"
DIR=$ROOT/$NAME
mkdir -p "$DIR" || die "cannot create $DIR"
LOG=$DIR/$NAME.log

# shellcheck disable=SC2086  # SERVE_PAIR_ARGS is a list of options
timeout -s INT -k 15 $((LIMIT - 75 - SECONDS)) python3 -m real_drafter.serve_pair --pair "$PAIR" \
  --site "$SITE" --step-min-s 75 --out "$DIR" --time-budget-s $((LIMIT - 90 - SECONDS)) \
  ${SERVE_PAIR_ARGS:-} "${SKIP[@]}" "$@" > "$LOG" 2>&1
RC=$?
echo "gpu_pair_call: serve_pair rc=$RC at ${SECONDS}s"
grep "^\[serve_pair\]" "$LOG" | tail -20
grep -rhoa "DDTree host lengths: [a-z]*" "$DIR" 2>/dev/null | sort | uniq -c
if [ -f "$DIR/results.json" ]; then
  timeout "${TIE_TIMEOUT_S:-45}" python3 -m real_drafter.tie_margin --pair "$PAIR" "${TIE[@]}" \
    --results "$DIR/results.json" --out "$DIR/tie.json" --reference none > "$DIR/tie.log" 2>&1
  echo "gpu_pair_call: tie_margin rc=$? at ${SECONDS}s"; tail -c 1200 "$DIR/tie.log"; echo
fi
tar -czf "$OUT/$NAME.tgz" -C "$ROOT" "$NAME" || echo "gpu_pair_call: tar failed" >&2
python3 scripts/gpu_out_fit.py "$OUT" || echo "gpu_pair_call: something in $OUT cannot come back" >&2
exit "$RC"
