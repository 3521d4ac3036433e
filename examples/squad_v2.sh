#!/usr/bin/env bash
# Fine-tune a Hugging Face BERT checkpoint on a SQuAD v2.0-format file (questions with and
# without an answer), then export and evaluate it as the official v2.0 script scores.
# Usage: examples/squad_v2.sh [MODEL_DIR] [WORK_DIR]
#   MODEL_DIR omitted: a tiny BERT is pre-trained here first. The data is made here; with your
#   own, point TRAIN/DEV at train-v2.0.json / dev-v2.0.json.
# Environment: PACKBERT (default build/packbert), EPOCHS (2), TRAIN, DEV, MAX_SEQ_LEN (384).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
packbert=${PACKBERT:-$root/build/packbert}
work=${2:-$(mktemp -d)}
mkdir -p "$work"
model=${1:-}
if [[ -z $model ]]; then
  for d in $(seq 1 60); do
    echo "packbert was first released in $d by its engineers ."
    echo "the king of the city was known as the first ."
    echo
  done > "$work/corpus.txt"
  "$packbert" prepare "$work/corpus.txt" --out "$work/corpus.seqs" --max-seq-len 64 --pack optimal
  "$packbert" pretrain --data "$work/corpus.seqs" --packs "$work/corpus.packs" \
    --out "$work/pretrained" --preset tiny --steps 20 --batch-rows 8 --overwrite
  "$packbert" export --model "$work/pretrained/checkpoint.safetensors" --out "$work/hf" --overwrite
  model=$work/hf
fi
train=${TRAIN:-$work/train-v2.json}
dev=${DEV:-$work/dev-v2.json}
if [[ -z ${TRAIN:-} ]]; then
  {
    echo '{"version": "v2.0", "data": [{"title": "made up", "paragraphs": ['
    for i in $(seq 1 12); do
      ctx="packbert version $i was first released in 20$((10 + i)) by its engineers."
      start=$(awk -v c="$ctx" -v y="20$((10 + i))" 'BEGIN { print index(c, y) - 1 }')
      sep=","; [[ $i == 12 ]] && sep=""
      echo "{\"context\": \"$ctx\", \"qas\": ["
      echo " {\"id\": \"a$i\", \"question\": \"When was version $i released?\", \"is_impossible\": false,"
      echo "  \"answers\": [{\"text\": \"20$((10 + i))\", \"answer_start\": $start}]},"
      echo " {\"id\": \"n$i\", \"question\": \"Who painted the moon?\", \"is_impossible\": true,"
      echo "  \"answers\": []}]}$sep"
    done
    echo ']}]}'
  } > "$train"
  cp "$train" "$dev"
fi
len=${MAX_SEQ_LEN:-384}
"$packbert" finetune --task squad --model "$model" --train "$train" --dev "$dev" \
  --out "$work/squad" --epochs "${EPOCHS:-2}" --max-seq-len "$len" --overwrite
"$packbert" export --model "$work/squad" --out "$work/exported" --overwrite
"$packbert" eval --task squad --model "$work/exported" --data "$dev" --max-seq-len "$len" \
  --predictions "$work/answers.json"
echo "model in $work/exported; answers in $work/answers.json"
