"""Upper bounds on size options from the memory they would take, checked before anything is allocated.

``available_bytes(device)`` is what this process may still allocate: on the host, the least of
``MemAvailable``, the cgroup's limit less its usage and the address-space rlimit less this
process's size; on a CUDA device, its free memory. ``check_fits`` refuses a set of size options
whose estimated footprint (a lower bound the caller computes, in bytes) exceeds it, naming the
size it would take, what is available and the largest value of the option to blame that fits.

Example::

    check_fits({"--vocab-size": v}, lambda s: 24 * s["--vocab-size"], doing="to build the WFST")
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Callable

from latticedraft.errors import InputError


def human(n: float) -> str:
    """``9.3 GiB``: a byte count in binary units, three significant digits."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"  # not reached


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _read_int(p: Path) -> int | None:
    try:
        text = p.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_headroom() -> int | None:
    """The cgroup (v2, else v1) memory limit less its current usage, or None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        rel = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::")), "/")
    except (OSError, IndexError):
        rel = "/"
    for d in {root / rel.lstrip("/"), root}:
        limit, used = _read_int(d / "memory.max"), _read_int(d / "memory.current")
        if limit is not None and used is not None:
            return max(limit - used, 0)
    limit, used = _read_int(root / "memory" / "memory.limit_in_bytes"), _read_int(root / "memory" / "memory.usage_in_bytes")
    if limit is not None and used is not None and limit < 1 << 60:
        return max(limit - used, 0)
    return None


def _rlimit_headroom() -> int | None:
    """``ulimit -v`` less this process's virtual size, or None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    size = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                size = int(line.split()[1]) * 1024
    except OSError:
        pass
    return max(soft - size, 0)


def available_bytes(device=None) -> int | None:
    """Bytes this process may still allocate on ``device`` (None / "cpu": host memory; "cuda[:N]":
    that device's free memory); None when it cannot be told."""
    dev = str(device) if device is not None else "cpu"
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        free, _ = torch.cuda.mem_get_info(torch.device(dev))
        return int(free)
    if dev != "cpu":
        return None  # mps shares host memory in ways not worth guessing: no bound
    found = [x for x in (_meminfo_available(), _cgroup_headroom(), _rlimit_headroom()) if x is not None]
    return min(found) if found else None


def _largest(need: Callable[[dict], int], sizes: dict, flag: str, budget: int, low: int) -> int:
    """The largest value v in [low - 1, sizes[flag]] of option ``flag`` with ``need`` <= budget
    (``low - 1``: not even ``low`` fits), by bisection (``need`` grows with every size)."""
    lo, hi = low - 1, int(sizes[flag])
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need({**sizes, flag: mid}) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(sizes: dict[str, int], need: Callable[[dict], int], *, doing: str, device=None,
               low: dict[str, int] | None = None, available: int | None = None, given=()) -> None:
    """Refuse ``sizes`` (option flag -> value) when ``need(sizes)`` bytes exceed what ``device`` has.

    ``need`` must grow with every size (a lower-bound estimate of the footprint); ``doing`` says
    what the memory is for ("to train", "for the WFST arrays"); ``low``: each option's smallest
    legal value (default 1); ``available``: the budget (default ``available_bytes(device)``; no
    check when that is unknown); ``given``: the flags the user set (blamed before defaults). The
    message names the option (given ones first) whose value is furthest above the largest value
    that fits with the others unchanged, and that value.
    """
    want = need(sizes)
    budget = available if available is not None else available_bytes(device)
    if budget is None or want <= budget:
        return
    low = low or {}
    fits = {f: _largest(need, sizes, f, budget, low.get(f, 1)) for f in sizes}
    usable = {f: v for f, v in fits.items() if v >= low.get(f, 1)}
    blame = [f for f in usable if f in given] or list(usable or sizes)
    flag = max(blame, key=lambda f: sizes[f] / max(usable.get(f, 0), 1))
    rest = ", ".join(f"{f} {v}" for f, v in sizes.items() if f != flag)
    where = "on this machine" if device is None or str(device) == "cpu" else f"on {device}"
    head = (f"{flag} {sizes[flag]}{f' (with {rest})' if rest else ''} would need about {human(want)} {doing}, "
            f"but {human(budget)} is available {where}")
    if not usable:
        raise InputError(f"{head}; even the smallest sizes do not fit: free memory or use a larger machine")
    others = [f for f in usable if f != flag]
    raise InputError(f"{head}: the largest {flag} that fits is {usable[flag]}"
                     + (f" (or lower {' / '.join(others)})" if others else ""))
