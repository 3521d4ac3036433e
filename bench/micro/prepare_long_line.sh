#!/usr/bin/env bash
# prepare on one line of N words (#48): the time should grow linearly with N. Prints the CPU,
# then words, seconds (prepare's own "done in") and seconds per million words for each size.
# Usage: bench/micro/prepare_long_line.sh [BUILD=build] [SIZES="100000 200000 400000 1000000 3000000"]
set -euo pipefail
build=${1:-build}
sizes=${2:-"100000 200000 400000 1000000 3000000"}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/$build/packbert"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "prepare, one line: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
printf '%10s %10s %16s\n' words seconds "s per M words"
words=(the of and to in is was for on that with as by at from his her it an be city known state
       world war people name first new two time years three music river house king)
for n in $sizes; do
  awk -v n="$n" -v w="${words[*]}" 'BEGIN { srand(7); split(w, a, " "); m = length(a);
    for (i = 0; i < n; i++) printf "%s%s", (i ? " " : ""), a[int(rand() * m) + 1]; print "" }' \
    > "$work/line.txt"
  "$bin" prepare "$work/line.txt" --out "$work/l.seqs" >/dev/null 2>"$work/err"
  s=$(sed -n 's/^prepare: done in \([0-9.]*\) s$/\1/p' "$work/err")
  printf '%10s %10s %16s\n' "$n" "$s" "$(awk -v s="$s" -v n="$n" 'BEGIN { printf "%.2f", s / n * 1e6 }')"
done
