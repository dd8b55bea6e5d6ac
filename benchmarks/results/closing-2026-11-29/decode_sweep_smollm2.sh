#!/bin/bash
cd /work/main
M=data/heads-smollm2
L=.venv/bin/latticedraft
run() { name=$1; shift; for b in 1 4; do
  out=/tmp/sweep/$name.b$b.jsonl
  if $L decode --model $M --chat --prompts /tmp/sweep/prompts.jsonl --max-new-tokens 24 --json --batch-size $b "$@" > $out 2> /tmp/sweep/$name.b$b.err; then echo "$name b$b rc=0"; else echo "$name b$b rc=$? $(tail -1 /tmp/sweep/$name.b$b.err)"; fi
done; }
run greedy --method greedy
run default
for d in top1 neural ngram parallel parallel-base oracle model none; do run bpd-$d --drafter $d; done
run lookahead --method lookahead
run mtad --method mtad
run kangaroo --method kangaroo
run ppd --method ppd
run dynamo --method dynamo
run sample --do-sample --temperature 0.7 --seed 3
