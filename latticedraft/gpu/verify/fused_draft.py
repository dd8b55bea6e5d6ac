"""``FusedDraft``: the self-draft's whole forward as one call into C++ (``fused_draft.cpp``).

An eager draft forward of SmolLM2-135M makes about 5,000 ATen calls (norms, dtype casts, views,
rotary, cache writes, attention), and on some CPUs those cost more than its 120 int4 products.
Here every layer's RMS / layer norm, rotary embedding, cache write, attention over the
verifier's cache and activation are plain loops in one C++ function, between torch's own
weight-only kernels (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``) on the quantized
``LeanStack``'s packed weights: one Python call per draft token, about 10 ATen calls a layer.

The arithmetic is the eager quantized stack's up to float rounding (the same products; norms,
softmax and activations in float32, activations rounded to bfloat16 into each product, the
residual stream in float32): it is a draft, checked against the eager stack's logits in
tests/gpu/verify/test_fused_draft.py, and the float32 verify stays eager, so the output does not
change.

**Building.** The source is compiled once per machine by g++ (``-O3 -march=native``, torch's
headers and libraries, OpenMP: torch's own runtime) into ``<cache>/kernels/<key>/`` (``paths.
cache_dir()``), the key hashing the source, torch's version and ABI, the compiler and the CPU's
model and flags; the library is written under a temporary name and renamed, so a killed build
leaves nothing. ``library()`` returns (path, None) or (None, why not): no compiler, a CUDA or
non-float32 model, an architecture or activation not written out here; the caller then drafts
eagerly and ``--verbose`` says why. The kernels take any shapes (batch, cache length): nothing
recompiles during a decode.

    >>> fused = FusedDraft.of(stack)          # doctest: +SKIP  (None: eager; why_not(stack) says why)
    >>> logits = fused(h, pos, cache, mask)   # h float32[b, H] -> float32[b, V]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fused_draft.cpp")
ACTS = {"silu": 0, "gelu_new": 1, "gelu_pytorch_tanh": 1, "gelu_fast": 1, "gelu": 2}
KINDS = {"int4": 4, "int8": 8}
_lock = threading.Lock()
_loaded: dict[str, str | None] = {}  # build key -> None (loaded) or why it failed
_first: dict[str, str] = {}  # build key -> the path it was loaded from


def cpu_signature() -> str:
    """The CPU's model name and every flag (the build key: ``-march=native`` follows them)."""
    from latticedraft.cpu import cpuinfo

    model, flags = cpuinfo()
    return model + " | " + " ".join(flags)


def compiler() -> str | None:
    """The C++ compiler to build with (``$CXX``, else g++ or c++ on PATH), None where there is none."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def library_path() -> tuple[Path | None, str | None]:
    """Where this machine's build of the kernels lives (it may not exist yet), or why it cannot."""
    from latticedraft.paths import cache_dir

    cxx = compiler()
    if cxx is None:
        return None, "no C++ compiler (g++) on PATH: install g++ (bash scripts/setup.sh does)"
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.split("\n")[0]
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cxx} --version failed: {e}"
    key = hashlib.sha256("\n".join([SOURCE.read_text(), torch.__version__, str(torch._C._GLIBCXX_USE_CXX11_ABI),
                                    version, cpu_signature(), sys.version]).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"fused_draft-{key}" / "fused_draft.so", None


def build(path: Path, progress=None) -> str | None:
    """Compile ``SOURCE`` into ``path`` (atomically); None on success, else the compiler's last line."""
    from torch.utils.cpp_extension import include_paths, library_paths

    if progress:
        progress("compiling the fused draft kernels for this CPU (once per machine and torch; about 30 s) ...")
    try:  # the cache may refuse (a file where a folder belongs, read-only, chattr +i): draft eagerly then
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".fused_draft.", suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:
        return f"the kernels cannot be built in {path.parent.parent}: {e.strerror or e}"
    lib = library_paths()[0]
    cmd = [compiler(), "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared", "-std=c++17",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-DTORCH_API_INCLUDE_EXTENSION_H",
           *(f"-I{p}" for p in include_paths()), str(SOURCE), "-o", tmp,
           f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu", "-ltorch"]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        Path(tmp).unlink(missing_ok=True)
        return f"the compiler failed to run: {e}"
    if out.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        lines = [ln for ln in out.stderr.splitlines() if "error" in ln] or out.stderr.splitlines() or ["(no output)"]
        return f"the compiler failed: {lines[0][:300]}"
    try:
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        return f"the kernels cannot be kept in {path.parent}: {e.strerror or e}"
    if progress:
        progress(f"compiled the fused draft kernels in {time.perf_counter() - t0:.0f} s: {path}")
    return None


def library(progress=None) -> tuple[str | None, str | None]:
    """(the loaded library's path, None), building it first where this machine has none, or (None,
    why not). Loaded once per process."""
    with _lock:
        path, why = library_path()
        if path is None:
            return None, why
        key = path.parent.name  # one build (source, torch, compiler, CPU) loads once per process, whatever
        if key not in _loaded:  # the cache it lies in (a second copy's ops would register twice: abort)
            why = None if path.exists() else build(path, progress)
            if why is None:
                try:
                    torch.ops.load_library(str(path))
                except (OSError, RuntimeError) as e:
                    why = f"loading {path} failed: {str(e).splitlines()[0][:200]}"
            _loaded[key] = why
            _first[key] = str(path)
        return (None, _loaded[key]) if _loaded[key] else (_first[key], None)


def why_not(stack) -> str | None:
    """None where ``FusedDraft`` runs this quantized ``LeanStack``, else why not (it drafts eagerly)."""
    if stack.scheme is None:
        return "the stack is not quantized"
    if stack.split.device.type != "cpu":
        return f"the fused kernels are CPU ones (the model is on {stack.split.device})"
    if stack.split.dtype != torch.float32:
        return f"the fused kernels read a float32 cache (the model is {stack.split.dtype})"
    if stack.arch.norm not in ("rms", "layer"):
        return f"norm {stack.arch.norm!r}"
    if stack.arch.act != "silu" and _act_name(stack) not in ACTS:
        return f"activation {_act_name(stack)!r} is not written out (only {', '.join(ACTS)})"
    if stack.heads % stack.kv_heads:
        return f"{stack.heads} query heads over {stack.kv_heads} key/value heads"
    return None


def _act_name(stack) -> str:
    return "silu" if stack.arch.act == "silu" else str(getattr(stack.config, "activation_function", "?"))


class FusedDraft:
    """One draft forward of a quantized ``LeanStack`` in one C++ call (module doc)."""

    def __init__(self, stack):
        self.stack = stack
        weights, config = [], []
        for w in stack.weights:
            for part in (w.norm1, w.qkv, w.o, w.norm2, w.up, w.down):
                if hasattr(part, "kind"):  # a Norm
                    weights += [part.weight.float(), _opt(part.bias)]
                else:
                    weights += _proj(part, config)
        f = stack.final
        weights += [f.weight.float(), _opt(f.bias)]
        head = _proj(stack.unembed, config)[:2]
        weights += head + ([stack.cos.float().contiguous(), stack.sin.float().contiguous()] if stack.rotary
                           else [_opt(None), _opt(None)])
        up = stack.weights[0].up
        inter = _out_features(up) // (2 if stack.arch.gated else 1)
        norm_eps = stack.weights[0].norm1.eps
        head_cfg = [stack.num_layers, stack.hidden, stack.heads, stack.kv_heads, stack.head_dim, inter,
                    _out_features(stack.unembed), int(stack.arch.norm == "rms"), int(stack.rotary),
                    int(stack.arch.gated), ACTS[_act_name(stack)]]
        self.impl = torch.classes.latticedraft.FusedDraft(weights, head_cfg + config,
                                                          [float(norm_eps), float(stack.weights[0].scaling)])

    @classmethod
    def of(cls, stack, progress=None) -> tuple["FusedDraft | None", str | None]:
        """(a ``FusedDraft`` of ``stack``, None), or (None, why not): the stack, or the build."""
        why = why_not(stack)
        if why is None:
            why = library(progress)[1]
        if why is None:
            try:
                return cls(stack), None
            except (RuntimeError, ValueError) as e:
                return None, f"the fused kernels refused this model: {str(e).splitlines()[0][:200]}"
        return None, why

    def __call__(self, h: torch.Tensor, pos: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """h float32[b, H] (the embedded tokens), pos int64[b], the verifier's ``kv.KVCache`` after
        ``reserve(1)``, mask bool[b, cache.end] (None: every slot) -> logits float32[b, V]."""
        empty = _EMPTY_BOOL if mask is None else mask
        return self.impl.forward(h, pos, cache.store, cache.end, empty)


_EMPTY_BOOL = torch.zeros(0, dtype=torch.bool)


def _opt(t) -> torch.Tensor:
    return torch.zeros(0) if t is None else t.detach().float().contiguous()


def _out_features(proj) -> int:
    return int(proj.n) if hasattr(proj, "n") else int(proj.w.shape[0])


def _proj(proj, config: list) -> list:
    """[packed, scales, bias] of a lean projection (``Quantized`` or a float ``DenseCast``), its
    (kind, group) appended to ``config``."""
    if hasattr(proj, "module"):
        m = proj.module
        config += [KINDS[m.scheme.kind], m.scheme.group]
        return [m.packed, m.scales, _opt(m.bias)]
    config += [32, 0]
    return [proj.w.float().contiguous(), torch.zeros(0), _opt(proj.b)]
