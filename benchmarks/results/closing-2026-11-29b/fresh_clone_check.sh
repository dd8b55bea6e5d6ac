#!/bin/bash
# The issue's first check on a fresh clone: fetch SmolLM2 and build its LM, then `decode --model
# data/heads-smollm2 --chat` on 4 prompts the project never saw (one with two turns), 24 new tokens,
# every method and drafter at batch 1 and 4; fresh_clone_compare.py then sets every output against
# HF greedy on the same token ids. Run from the clone's root: bash .../fresh_clone_check.sh OUTDIR
set -u
OUT=$1; mkdir -p "$OUT"
R=benchmarks/results/closing-2026-11-29b
bash scripts/build_smollm2.sh > "$OUT/build.log" 2>&1 || { echo "build_smollm2.sh failed: $(tail -1 "$OUT/build.log")"; exit 1; }
L=.venv/bin/latticedraft
run() { name=$1; shift; for b in 1 4; do
  if $L decode --model data/heads-smollm2 --chat --prompts $R/fresh_clone_prompts.jsonl --max-new-tokens 24 --json \
      --batch-size $b "$@" > "$OUT/$name.b$b.jsonl" 2> "$OUT/$name.b$b.err"; then echo "$name b$b rc=0"
  else echo "$name b$b rc=$? $(tail -1 "$OUT/$name.b$b.err")"; fi
done; }
run greedy --method greedy
run default
for d in top1 neural ngram parallel parallel-base oracle none; do run bpd-$d --drafter $d; done
run bpd-model --drafter model
run lookahead --method lookahead
run kangaroo --method kangaroo
run ppd --method ppd
run dynamo --method dynamo
run mtad --method mtad
run sample --do-sample --temperature 0.7 --seed 3
