#!/usr/bin/env bash
# Crash trials (docs/RELIABILITY.md): N interrupted pre-training runs, each stopped at a random
# point by one of kill -9 during a step, kill -9 halfway through a file write (a checkpoint or
# best.safetensors), kill -9 during an evaluation, SIGINT or SIGTERM, then resumed with --resume;
# every tensor of the final checkpoint (weights and Adam moments) must equal the uninterrupted
# run's, bit for bit.
# Usage: tests/crash_trials.sh [TRIALS=40] [BUILD=build]
set -euo pipefail
trials=${1:-40}
build=${2:-build}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/$build/packbert"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "crash trials: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $trials trials"

# A corpus of random sentences over common words, prepared and packed once.
python3 - "$work/corpus.txt" <<'PY'
import random, sys
random.seed(7)
w = ("the of and to in is was for on that with as by at from his her it an be this which or are "
     "were had not but have one city known state world war people name first new two time years "
     "three music river house king film game school").split()
lines = []
for d in range(300):
    for s in range(random.randint(1, 8)):
        lines.append(" ".join(random.choice(w) for _ in range(random.randint(4, 19))) + " .")
    lines.append("")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
"$bin" prepare "$work/corpus.txt" --out "$work/d.seqs" --max-seq-len 64 --pack optimal \
  --eval-fraction 0.1 >/dev/null 2>&1
# 64 steps (a second or two), so a signal lands mid-run rather than after the last step.
args=(pretrain --data "$work/d.seqs" --packs "$work/d.packs" --preset tiny --steps 64
      --batch-rows 8 --checkpoint-every 8 --eval-every 12 --dynamic-masking --skip-outliers 6)
"$bin" "${args[@]}" --out "$work/full" >/dev/null 2>&1

# Compares every tensor of two checkpoints (safetensors: 8-byte header size, JSON header, data).
same_tensors() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]]
            for k, v in head.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
sys.exit(0 if a == b and len(a) > 40 else 1)
PY
}

printf '%-6s %-22s %-8s %-8s %s\n' trial interruption "exit" resumed "tensors equal"
passed=0
for ((t = 1; t <= trials; t++)); do
  out="$work/run$t"
  kind=$((t % 5))
  case $kind in
    0) what="kill -9 in step"; at=$((RANDOM % 63 + 1))
       code=0; (PACKBERT_CRASH_AT=step:$at exec "$bin" "${args[@]}" --out "$out" >/dev/null 2>&1) 2>/dev/null || code=$?
       what="$what $at" ;;
    1) what="kill -9 in file write"; at=$((RANDOM % 12 + 1))
       code=0; (PACKBERT_CRASH_AT=write:$at exec "$bin" "${args[@]}" --out "$out" >/dev/null 2>&1) 2>/dev/null || code=$?
       what="$what $at" ;;
    4) what="kill -9 in eval"; at=$((RANDOM % 12 + 1))
       code=0; (PACKBERT_CRASH_AT=eval:$at exec "$bin" "${args[@]}" --out "$out" >/dev/null 2>&1) 2>/dev/null || code=$?
       what="$what $at" ;;
    *) sig=$([[ $kind == 2 ]] && echo INT || echo TERM)
       at=$((RANDOM % 50 + 1))
       "$bin" "${args[@]}" --out "$out" >/dev/null 2>&1 &
       pid=$!
       # Signal once step $at is logged (plus up to 50 ms), so the signal lands mid-run.
       until grep -q "\"step\":$at,.*\"type\":\"step\"" "$out/metrics.jsonl" 2>/dev/null ||
             ! kill -0 "$pid" 2>/dev/null; do sleep 0.005; done
       sleep "0.00$((RANDOM % 10))"
       kill -s "$sig" "$pid" 2>/dev/null || true
       code=0; wait "$pid" || code=$?
       what="SIG$sig after $at" ;;
  esac
  resumed=0
  if [[ $code == 0 ]]; then  # the signal came after the last step: the run finished
    :
  elif [[ -f "$out/checkpoint.safetensors" ]]; then
    "$bin" "${args[@]}" --out "$out" --resume >/dev/null 2>&1 || resumed=$?
  else  # killed before the first checkpoint: nothing to resume, start again
    "$bin" "${args[@]}" --out "$out" --overwrite >/dev/null 2>&1 || resumed=$?
  fi
  equal=no
  if [[ $resumed == 0 ]] && same_tensors "$out/checkpoint.safetensors" "$work/full/checkpoint.safetensors"; then
    equal=yes
    passed=$((passed + 1))
  fi
  printf '%-6s %-22s %-8s %-8s %s\n' "$t" "$what" "$code" "$resumed" "$equal"
done
echo "$passed of $trials trials resumed bit-exactly"
[[ $passed == "$trials" ]]
