"""What CPU this is: its model name and the instruction-set flags that change kernel speed
(AVX2, AVX-512 and its BF16 / VNNI extensions, AMX), for benchmark records and the fused
kernels' build key.

    >>> info = cpu_info()       # doctest: +SKIP
    >>> info["model"], info["flags"]
    ('AMD EPYC', ['avx2', 'avx512f', 'avx512_bf16', 'avx512_vnni'])
"""

from __future__ import annotations

import platform
from pathlib import Path

KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile",
                "amx_bf16", "amx_int8", "neon", "asimd", "sve")


def cpuinfo() -> tuple[str, list[str]]:
    """(the model name, every flag) from ``/proc/cpuinfo``; ("" or ``platform.processor()``, []) elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine(), []
    field = lambda *names: next((ln.split(":", 1)[1].strip() for ln in lines if ln.split(":")[0].strip() in names), "")
    return field("model name", "Model", "Hardware") or platform.machine(), field("flags", "Features").split()


def cpu_info() -> dict:
    """{"model": name, "flags": the ``KERNEL_FLAGS`` this CPU has, "cores": logical CPUs}."""
    import os

    model, flags = cpuinfo()
    return {"model": model, "flags": [f for f in KERNEL_FLAGS if f in flags], "cores": os.cpu_count()}
