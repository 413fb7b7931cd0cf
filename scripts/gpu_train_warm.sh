#!/usr/bin/env bash
# Runs ON the GPU host: trains the pair (real_drafter.train) in its own session while the
# kernels of the 4B shape and of the pair compile (serve_pair --dummy warm-ups: the card is
# mostly idle while they compile; their timings are not used), and returns once the training
# has ended. gpu-results.md §34: a new checkout has no JIT cache, a cold FlashInfer start takes
# 140-270 s, and a training call ~340 s; side by side they cost one call, not two.
#
#   bash scripts/gpu_train_warm.sh LIMIT_S
#
# LIMIT_S   seconds from this script's start by which it returns (training or not); the
#           training itself is stopped at 600 s
# Env: PAIR (default /root/pair2), SITE (default /root/site), ROOT (default /root), OUT (the
# device tool's: gets report.json and train.log), SERVE_PAIR_ARGS (more warm-up options). Runs from the repository root with PYTHONPATH
# set as the staged site wants it. Exit: 0 when the training wrote its report, 1 otherwise,
# 2 on usage.
set -uo pipefail

die() { echo "gpu_train_warm: $1" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: gpu_train_warm.sh LIMIT_S"
LIMIT=$1
[[ $LIMIT =~ ^[0-9]+$ ]] && [ "$LIMIT" -ge 300 ] || die "LIMIT_S $LIMIT: whole seconds, at least 300"
PAIR=${PAIR:-/root/pair2} SITE=${SITE:-/root/site} ROOT=${ROOT:-/root}
mkdir -p "$PAIR" "$ROOT/warm" || die "cannot create $PAIR or $ROOT/warm"
rm -f "$PAIR/DONE"

# its own session: a training the caller's limit cuts short still ends on its own (setsid)
setsid bash -c 'S=$(date +%s); timeout -s INT -k 15 600 python3 -m real_drafter.train \
  --out "$0" --seed 0 --device cuda --budget-s 850 --json "$0/report.json" > "$0/train.log" 2>&1
  echo "train rc=$? after $(( $(date +%s) - S ))s" >> "$0/train.log"; touch "$0/DONE"' "$PAIR" \
  < /dev/null > /dev/null 2>&1 &

# shellcheck disable=SC2206  # SERVE_PAIR_ARGS is a list of options
W=(--dummy --site "$SITE" --graph-max-bs 32 --profile-levels 1 --profile-steps 0
   --timed-repeats 1 --step-min-s 20 ${SERVE_PAIR_ARGS:-})
left() { echo $((LIMIT - SECONDS)); }
timeout -s INT -k 10 $(( $(left) < 290 ? $(left) : 290 )) python3 -m real_drafter.serve_pair \
  "${W[@]}" --shape 4b --pair "$ROOT/pair-dummy" --time-budget-s 280 --out "$ROOT/warm/w4b" \
  profile:ddtree:15+pad@flashinfer > "$ROOT/warm/w4b.log" 2>&1
echo "gpu_train_warm: 4B warm-up ended at ${SECONDS}s"
if [ ! -f "$PAIR/DONE" ] && [ "$(left)" -gt 60 ]; then
  timeout -s INT -k 30 $(( $(left) - 30 )) python3 -m real_drafter.serve_pair "${W[@]}" \
    --shape pair --pair "$ROOT/pair-warm" --time-budget-s $(( $(left) - 40 )) \
    --out "$ROOT/warm/wpair" profile:none@flashinfer profile:ddtree:16+pad@flashinfer \
    > "$ROOT/warm/wpair.log" 2>&1 &
  WP=$!
  while [ ! -f "$PAIR/DONE" ] && [ "$(left)" -gt 0 ] && kill -0 $WP 2>/dev/null; do sleep 2; done
  # the warm-up's server stops before the caller's next server starts (serve_pair on INT)
  kill -INT $WP 2>/dev/null; wait $WP
  echo "gpu_train_warm: pair warm-up ended at ${SECONDS}s"
fi
while [ ! -f "$PAIR/DONE" ] && [ "$(left)" -gt 0 ]; do sleep 2; done
tail -2 "$PAIR/train.log"
[ -n "${OUT:-}" ] && cp "$PAIR/report.json" "$PAIR/train.log" "$OUT/" 2>/dev/null
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("gpu_train_warm: sha256", {k: v[:12] for k, v in r["sha256"].items()}, "reproducible", r["reproducible"], "total", round(r["wall_s"]["total"], 1))' "$PAIR/report.json" || exit 1
