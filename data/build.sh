#!/usr/bin/env bash
# Rebuilds the bundled default models in data/ from the Python standard library's source.
#   bash data/build.sh                 # every stage, in order
#   bash data/build.sh tokenizer base  # only the named stages
# Stages: tokenizer heldout prompts base heads-stern heads-dynamo rescorer-small rescorer-medium draft-vocab report
#         adapter-kangaroo exit-heads-ppd (self-drafting modules on the base; each rewrites MODELS.md)
# Deterministic: fixed seeds, seeded batch order (BPE training gives the same fingerprint twice).
# Training stages resume from their checkpoint if interrupted; everything runs under nice.
set -euo pipefail
cd "$(dirname "$0")/.."
exec nice -n 10 .venv/bin/python data/build.py "$@"
