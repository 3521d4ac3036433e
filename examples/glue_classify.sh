#!/usr/bin/env bash
# Fine-tune a Hugging Face BERT checkpoint on a GLUE-format file, then export and evaluate it.
# Usage: examples/glue_classify.sh [MODEL_DIR] [WORK_DIR]
#   MODEL_DIR: a Hugging Face BERT directory (config.json, model.safetensors or pytorch_model.bin,
#              vocab.txt); omitted, a tiny one is pre-trained here first, so the script runs as is.
#   The data is made here in RTE's layout (index, sentence1, sentence2, label); with your own
#   GLUE files, point TRAIN/DEV at them (any GLUE task's TSV, or CSV/JSONL).
# Environment: PACKBERT (the binary, default build/packbert), EPOCHS (3), TRAIN, DEV.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
packbert=${PACKBERT:-$root/build/packbert}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
model=${1:-}
if [[ -z $model ]]; then
  # A tiny BERT pre-trained for a few steps on made-up text, exported in the Hugging Face layout.
  for d in $(seq 1 60); do
    echo "the king of city $d was known as the first ."
    echo "the war of year $d ended in the river ."
    echo
  done > "$work/corpus.txt"
  "$packbert" prepare "$work/corpus.txt" --out "$work/corpus.seqs" --max-seq-len 64 --pack optimal
  "$packbert" pretrain --data "$work/corpus.seqs" --packs "$work/corpus.packs" \
    --out "$work/pretrained" --preset tiny --steps 20 --batch-rows 8 --overwrite
  "$packbert" export --model "$work/pretrained/checkpoint.safetensors" --out "$work/hf" --overwrite
  model=$work/hf
fi
train=${TRAIN:-$work/train.tsv}
dev=${DEV:-$work/dev.tsv}
if [[ -z ${TRAIN:-} ]]; then  # entailment when the second sentence repeats the first's subject
  printf 'index\tsentence1\tsentence2\tlabel\n' > "$train"
  printf 'index\tsentence1\tsentence2\tlabel\n' > "$dev"
  for i in $(seq 0 79); do
    f=$train; [[ $((i % 5)) == 0 ]] && f=$dev
    if ((i % 2)); then
      printf '%d\tthe king of city %d was known\tthe king was known\tentailment\n' "$i" "$i" >> "$f"
    else
      printf '%d\tthe king of city %d was known\tthe war ended\tnot_entailment\n' "$i" "$i" >> "$f"
    fi
  done
fi
"$packbert" finetune --model "$model" --train "$train" --dev "$dev" --out "$work/finetuned" \
  --epochs "${EPOCHS:-3}" --overwrite
"$packbert" export --model "$work/finetuned" --out "$work/exported" --overwrite
"$packbert" eval --task classify --model "$work/exported" --data "$dev" \
  --predictions "$work/predictions.tsv"
echo "model in $work/exported; predictions in $work/predictions.tsv"
