#!/usr/bin/env bash
# Time to quality: bert-mini against modernbert-mini on the demo corpus (GCIDE), packed, 16 packs
# a step, LAMB 5e-3, warmup 40, fp32, held-out accuracy at the file's 15% masks, target 0.20.
set -u
P=${PACKBERT:-build/packbert}
W=${1:-out/ttq_modernbert}
mkdir -p $W
[ -f $W/gcide.seqs ] || $P demo --workdir $W --max-steps 0 > $W/demo.log 2>&1
for seed in 1 2 3; do
  for fam in bert modernbert; do
    extra=""; [ $fam = modernbert ] && extra="--dynamic-masking"
    $P pretrain --data $W/gcide.seqs --packs $W/gcide.packs --family $fam --preset mini \
      --batch-rows 16 --steps 2000 --lr 5e-3 --warmup 40 --optimizer lamb --eval-every 100 \
      --eval-fraction 0.005 --target-accuracy 0.20 --seed $seed --out $W/$fam-$seed --overwrite $extra \
      > $W/$fam-$seed.log 2>&1
    echo "$fam seed $seed: $(tail -1 $W/$fam-$seed.log)"
  done
done
