#!/usr/bin/env bash
# Installs llama.cpp's Python binding (llama-cpp-python, built from its PyPI sdist) into .venv: the
# CPU peer of benchmarks/spec_bench.py's "llama.cpp F32 greedy" and "llama.cpp Q4_1" rows. Never a
# runtime dependency of latticedraft. About 11-16 minutes on 2 cores; a second run checks the import.
#   bash benchmarks/install_llama_cpp.sh            # native build (-march=native)
#   LLAMA_NATIVE=OFF bash benchmarks/install_llama_cpp.sh   # portable AVX-512 build
# A native build that dies with "Illegal instruction" (AMX advertised in a VM) is rebuilt portable.
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=.venv/bin/python
[ -x $VPY ] || { echo "error: .venv is missing; run bash scripts/setup.sh first" >&2; exit 2; }
VERSION=0.3.36
probe() { $VPY -c "import llama_cpp, sys; llama_cpp.llama_backend_init(); sys.exit(0)" 2>/dev/null; }
if $VPY -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null && probe; then
  echo "[peers] llama-cpp-python $VERSION is installed" >&2; exit 0
fi
common="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_OPENMP=ON"
build() {
  echo "[peers] building llama-cpp-python $VERSION ($1; about 11-16 minutes on 2 cores)" >&2
  CMAKE_ARGS="$common $1" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $VPY -m pip install -q --disable-pip-version-check --no-cache-dir --force-reinstall --no-deps \
    --no-binary llama-cpp-python "llama-cpp-python==$VERSION" 2>&1 | grep -v '^WARNING: Location' || true
  $VPY -m pip install -q --disable-pip-version-check "llama-cpp-python==$VERSION" 2>&1 | grep -v '^WARNING: Location' || true
}
if [ "${LLAMA_NATIVE:-ON}" = ON ]; then
  build "-DGGML_NATIVE=ON"
  probe || { echo "[peers] the native build does not run here; rebuilding without -march=native" >&2; LLAMA_NATIVE=OFF; }
fi
if [ "${LLAMA_NATIVE:-ON}" = OFF ]; then
  build "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON"
  probe || { echo "error: llama-cpp-python $VERSION does not import after a portable build" >&2; exit 1; }
fi
echo "[peers] llama-cpp-python $VERSION ready" >&2
