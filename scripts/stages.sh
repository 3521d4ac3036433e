#!/usr/bin/env bash
# Runs the stages of `make test` in order, each timed, and prints the time of every stage run
# (and which one failed) at the end. Usage: scripts/stages.sh NAME COMMAND [NAME COMMAND ...]
set -uo pipefail
names=() seconds=() status=0 failed=""
start_all=$(date +%s)
while [ $# -ge 2 ]; do
  name=$1 command=$2
  shift 2
  echo "== $name"
  start=$(date +%s)
  bash -c "$command"
  status=$?
  names+=("$name") seconds+=($(($(date +%s) - start)))
  if [ $status -ne 0 ]; then
    failed=$name
    break
  fi
done
echo
echo "stage                          time"
echo "-------------------------------------"
for i in "${!names[@]}"; do
  printf '%-28s %6d:%02d\n' "${names[$i]}" $((seconds[i] / 60)) $((seconds[i] % 60))
done
total=$(($(date +%s) - start_all))
printf '%-28s %6d:%02d\n' "total" $((total / 60)) $((total % 60))
[ -z "$failed" ] || echo "failed: $failed (exit $status)"
exit $status
