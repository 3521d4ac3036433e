#!/usr/bin/env bash
# A small BERT for trying packbert where no Hugging Face BERT is at hand: bert-tiny (2 layers,
# 128 wide, bert-base-uncased's vocabulary) pre-trained here on the demo corpus (GCIDE, from
# Debian's dict-gcide) and written as a Hugging Face directory. About a minute on 2 cores.
# Usage: examples/tiny_bert.sh OUT_DIR     Environment: PACKBERT (default build/packbert), STEPS (300)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
packbert=${PACKBERT:-$root/build/packbert}
out=${1:?usage: examples/tiny_bert.sh OUT_DIR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$packbert" gcide-text --out "$work/gcide.txt"
"$packbert" prepare "$work/gcide.txt" --out "$work/gcide.seqs" --max-seq-len 128 --pack optimal
"$packbert" pretrain --data "$work/gcide.seqs" --packs "$work/gcide.packs" --out "$work/run" \
  --preset tiny --steps "${STEPS:-300}" --batch-rows 16 --lr 1e-2 --warmup 40 --logging-steps 100
"$packbert" export --model "$work/run/checkpoint.safetensors" --out "$out" --overwrite
