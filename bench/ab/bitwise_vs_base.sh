#!/bin/bash
# fp32 (and every other precision's) training unchanged bit for bit against an older build
# (#44, #60, #61): 20-step bert-tiny pretrain runs (packed, dropout on, seed 3, on the first 3 MB
# of the GCIDE text that `make setup` installs) with each build, every checkpoint tensor (weights
# and optimizer moments) compared byte for byte by bench/ab/compare_checkpoints.py. Prints one
# table row per configuration; exit 1 if any configuration differs or fails.
# usage: bench/ab/bitwise_vs_base.sh BASE_BUILD_DIR [NEW_BUILD_DIR=build] [WORKDIR=/tmp/bitwise]
# (an older tree built with `git worktree add /tmp/base REV && cmake -S /tmp/base -B
# /tmp/base/build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/base/build`)
set -u
usage="usage: bench/ab/bitwise_vs_base.sh BASE_BUILD_DIR [NEW_BUILD_DIR=build] [WORKDIR=/tmp/bitwise]"
here=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 1 ] || [ $# -gt 3 ]; then echo "$usage" >&2; exit 2; fi
for bin in "$1/packbert" "${2:-$here/build}/packbert"; do
  [ -x "$bin" ] || { echo "bitwise_vs_base.sh: no packbert executable at $bin ($usage)" >&2; exit 2; }
done
base=$(cd "$1" && pwd)/packbert
new=$(cd "${2:-$here/build}" && pwd)/packbert
work=${3:-/tmp/bitwise}
mkdir -p "$work" && cd "$work" || exit 2
# The vocabulary named on every command: an older build looks for its default elsewhere.
vocab=$here/assets/bert-base-uncased-vocab.txt
if [ ! -f small.packs ]; then
  zcat /usr/share/dictd/gcide.dict.dz | head -c 3000000 | sed 's/<[^>]*>//g' |
    awk 'NF==0{print ""; next}{print}' > small.txt
  "$new" prepare small.txt --out small.seqs --vocab "$vocab" --pack lpfhp --seed 1 > /dev/null ||
    exit 2
fi
status=0
i=0
echo "| options | tensors bitwise equal |"
echo "|---|---:|"
while IFS= read -r X; do
  i=$((i + 1))
  for side in base new; do
    bin=$base
    [ $side = new ] && bin=$new
    rm -rf "out_${side}_$i"
    # shellcheck disable=SC2086
    if ! "$bin" pretrain --data small.seqs --packs small.packs --preset tiny --steps 20 --seed 3 \
      --vocab "$vocab" --out "out_${side}_$i" $X > "log_${side}_$i.txt" 2>&1; then
      echo "failed: $side [$X]: $(tail -1 "log_${side}_$i.txt")"
      status=1
    fi
  done
  r=$(python3 "$here/bench/ab/compare_checkpoints.py" "out_base_$i/checkpoint.safetensors" \
    "out_new_$i/checkpoint.safetensors" 2>&1 | tail -1) || status=1
  echo "| \`${X:-(fp32)}\` | $r |"
done <<'LIST'

--precision bf16
--precision fp16
--recompute gelu,ln,attention
--sparsity 0.9 --block 8 --regrow gradient
--optimizer adamw --master-weights bf16 --precision bf16
--master-weights bf16 --precision bf16
--master-weights bf16-rn --precision bf16
--clip 0.5 --precision fp16
--recompute every:2 --precision bf16
LIST
exit $status
