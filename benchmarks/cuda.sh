#!/usr/bin/env bash
# The CUDA tests and the GPU benchmarks in one go, on a machine with an NVIDIA GPU and a Python
# that has torch (CUDA build), transformers, tokenizers, numba and scipy:
#
#     bash benchmarks/cuda.sh [OUT_DIR]          # JSON + logs to OUT_DIR (default benchmarks/results/cuda)
#
# Optional, for a machine that has neither the setup's virtual environment nor the internet:
#   .whl/*.whl            wheels installed first into /tmp/site (e.g. the transformers release tested here)
#   LM_TARBALL=FILE       a tar.xz of the bundled 4-gram's build directory (manifest.json, lm.npz,
#                         tokenizer.json, cooccurrence.npz), unpacked into .cache/lm/ when the
#                         setup's build is absent; the search tables are rebuilt from lm.npz (KenLM and
#                         OpenFST are not needed to decode)
#   ARCHIVE=FILE.tgz      OUT_DIR packed into FILE after every stage (for a machine that is taken back)
# Each stage has its own time limit, so that one slow stage does not cost the others.
set -o pipefail
out=${1:-benchmarks/results/cuda}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
if [ ! -d .cache/lm/stdlib-4gram ] && [ -n "${LM_TARBALL:-}" ]; then
    mkdir -p .cache/lm && tar xJf "$LM_TARBALL" -C .cache/lm || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt"
$py -c "import torch, transformers, numba, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)" | tee -a "$out/gpu.txt"

stage() {  # stage NAME SECONDS COMMAND...: a time limit each, the log's tail shown
    local name=$1 limit=$2; shift 2
    echo "== $name"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n "${TAIL:-25}" "$out/$name.log"
    echo "== $name: exit $rc"
    [ -z "${ARCHIVE:-}" ] || tar czf "$ARCHIVE" -C "$out" .  # ARCHIVE=FILE.tgz: everything so far, after each stage
    return $rc
}
run_all() {  # run_all TAG SIZE_ARGS...: every benchmark at one size; stops at the first failure
    local tag=$1; shift
    { [ "${STEP_COST:-1}" = 0 ] || stage "step_cost$tag" 150 $py benchmarks/step_cost.py --device "$dev" "$@" --out "$out/step_cost$tag.json"; } &&
    stage "decode_b1$tag" 150 $py benchmarks/decode.py --device "$dev" "$@" --out "$out/decode$tag.json" &&
    stage "decode_b4$tag" 120 $py benchmarks/decode.py --device "$dev" --batch-size 4 "$@" --out "$out/decode_batch4$tag.json" &&
    stage "sampling$tag" 150 $py benchmarks/sampling.py --device "$dev" --temperatures 1.0 \
        --rows "HF generate(do_sample)" "HF assisted (draft model)" "ours: heads (top1)" "ours: draft model" \
        "ours: tree (4 sampled head paths)" "MTAD tau=0.1" "$@" --out "$out/sampling$tag.json"
}
dev=${DEVICE:-cuda}
stage test_cuda 120 $py -m pytest -q -p no:cacheprovider tests/gpu/verify/test_cuda.py
# a quick pass first (2 prompts x 16 tokens, one repeat), so that an error costs seconds, not the whole run
# (QUICK=0 skips it; QUICK_ONLY=1 stops after it)
if [ "${QUICK:-1}" != 0 ]; then TAIL=3 run_all _quick --num-prompts 2 --max-new-tokens 16 --repeats 1 || exit 1; fi
[ -n "${QUICK_ONLY:-}" ] && exit 0
[ -n "${HELDBACK_ONLY:-}" ] || run_all ""
# HELDBACK=1 (HELDBACK_ONLY=1: only these; STEP_COST=0 skips step_cost.py): the same on the 16 held-back code prompts the project never trained or tuned on
if [ -n "${HELDBACK:-}${HELDBACK_ONLY:-}" ]; then
    run_all _heldback --prompts benchmarks/prompts/heldback-code.jsonl --num-prompts 16
fi
