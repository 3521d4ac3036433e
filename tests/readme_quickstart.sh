#!/usr/bin/env bash
# Runs the README's quick start as written (all but its `make build`, which the test suite's
# build has done) in an empty directory where build/packbert is the binary under test and
# examples/ the source tree's, then checks what it promises: a model directory with TensorBoard
# events and checkpoint-STEP/ directories, and one prediction per line of the new text.
# Usage: tests/readme_quickstart.sh SOURCE_DIR PACKBERT WORK_DIR
set -euo pipefail
root=$1 packbert=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build"
ln -s "$root/examples" "$work/examples"
ln -s "$packbert" "$work/build/packbert"
awk '/^## Quick start/ {on = 1} on && /^```sh/ {code = 1; next} code && /^```/ {exit} code' \
  "$root/README.md" | grep -v '^make build' > "$work/quickstart.sh"
[[ -s $work/quickstart.sh ]] || { echo "no quick start block in README.md" >&2; exit 1; }
cd "$work"
cat quickstart.sh
bash -euo pipefail quickstart.sh
fail() { echo "readme_quickstart: $*" >&2; exit 1; }
[[ -f models/reviews/config.json && -f models/reviews/model.safetensors ]] || fail "no model"
ls models/reviews/runs/events.out.tfevents.* >/dev/null || fail "no TensorBoard events"
ls -d models/reviews/checkpoint-*/ >/dev/null || fail "no checkpoint directories"
[[ -f $(ls -d models/reviews/checkpoint-*/ | head -1)/trainer_state.json ]] || fail "no trainer_state.json"
lines=$(($(wc -l < examples/data/reviews_new.csv) - 1))
[[ $(($(wc -l < predictions.tsv) - 1)) == "$lines" ]] || fail "predictions.tsv: not $lines predictions"
head -1 predictions.tsv | grep -q $'^index\tprediction' || fail "predictions.tsv: no header"
echo "readme_quickstart: ran as written"
