#!/usr/bin/env bash
# Rebuilds the bundled default models in data/ from the Python standard library's source.
#   bash data/build.sh                 # every stage, in order
#   bash data/build.sh tokenizer base  # only the named stages
# Stages: tokenizer heldout prompts base rescorer-small rescorer-medium heads-stern heads-dynamo report
# Everything is deterministic (fixed seeds, single-threaded BPE); long stages run under nice.
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n 10 .venv/bin/python data/build.py "$@"
