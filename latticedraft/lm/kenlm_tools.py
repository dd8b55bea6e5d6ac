"""Run KenLM's ``lmplz`` and ``build_binary`` and turn their failures into one-line ``BuildError``s.

A failure names the step, says what went wrong (killed by a signal, out of memory, out of
temporary disk, bad discounts) and how to fix it; the last lines of the tool's stderr follow.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from latticedraft.errors import BuildError
from latticedraft.paths import kenlm_tool


@dataclass
class LmplzResult:
    discount_fallback: bool  # lmplz asked for --discount_fallback and got it
    stderr_tail: str


def _tail(text: str, n: int = 3) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip() and not set(l.strip()) <= set("-*0123456789")]
    return " | ".join(lines[-n:])


def _diagnose(step: str, rc: int, err: str, memory: str, temp_dir: Path) -> BuildError:
    low = err.lower()
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.Signals._value2member_map_ else str(-rc)
        hint = (" (SIGKILL usually means the kernel's out-of-memory killer: lower --memory or free RAM)"
                if -rc == signal.SIGKILL else "")
        return BuildError(f"{step} was killed by signal {name}{hint}")
    if "no space left on device" in low or "disk quota" in low:
        return BuildError(f"{step} ran out of temporary disk space in {temp_dir}; free space or pass --temp-dir "
                          f"on a larger disk ({_tail(err, 1)})")
    if "bad_alloc" in low or "cannot allocate memory" in low or "out of memory" in low:
        return BuildError(f"{step} ran out of memory with --memory {memory}; lower --memory or free RAM ({_tail(err, 1)})")
    if "below the minimum block size" in low:
        return BuildError(f"{step} needs more sorting memory than --memory {memory}; pass e.g. --memory 256M")
    if "while making a temporary" in low or ("temporary" in low and "no such file" in low):
        return BuildError(f"{step} cannot create temporary files under {temp_dir}; pass an existing, writable --temp-dir")
    return BuildError(f"{step} failed with exit status {rc}: {_tail(err)}")


def run_lmplz(text: Path, arpa: Path, order: int, prune: list[int] | None, memory: str, temp_dir: Path,
              vocab_size: int | None = None) -> LmplzResult:
    """``lmplz -o order --text text --arpa arpa`` (+ ``--prune``); retries once with
    ``--discount_fallback`` when, and only when, lmplz's error asks for it."""
    exe = kenlm_tool("lmplz")
    cmd = [str(exe), "-o", str(order), "-S", memory, "-T", str(temp_dir / "lmplz-"), "--text", str(text),
           "--arpa", str(arpa)]
    if prune:
        cmd += ["--prune", *map(str, prune)]
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    fallback = False
    if r.returncode != 0 and "--discount_fallback" in r.stderr:
        fallback = True
        r = subprocess.run(cmd + ["--discount_fallback"], capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        arpa.unlink(missing_ok=True)
        raise _diagnose("lmplz (n-gram counting and estimation)", r.returncode, r.stderr, memory, temp_dir)
    return LmplzResult(discount_fallback=fallback, stderr_tail=_tail(r.stderr))


class BuildBinaryJob:
    """``build_binary -S memory -T temp trie arpa binary`` running in a child process (no
    quantisation: scores stay exact), so the caller can convert the same ARPA meanwhile.
    ``wait()`` returns its wall seconds (start to exit) or raises ``BuildError``; ``stop()``
    kills it if it still runs (call it in a ``finally``: an interrupted build leaves no child
    behind)."""

    def __init__(self, arpa: Path, binary: Path, memory: str, temp_dir: Path):
        exe = kenlm_tool("build_binary")
        cmd = [str(exe), "-S", memory, "-T", str(temp_dir / "build_binary-"), "trie", str(arpa), str(binary)]
        self.binary, self.memory, self.temp_dir = binary, memory, temp_dir
        self._err = tempfile.TemporaryFile(dir=temp_dir)  # its progress bars: never a full pipe
        t0 = time.perf_counter()
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err)
        self._seconds = None  # set when the child exits, by _waiter (wait() may come much later)
        self._waiter = threading.Thread(target=self._time_exit, args=(t0,), daemon=True)
        self._waiter.start()

    def _time_exit(self, t0: float) -> None:
        self._proc.wait()
        self._seconds = time.perf_counter() - t0

    def wait(self) -> float:
        rc = self._proc.wait()
        self._waiter.join()
        seconds = self._seconds
        self._err.seek(0)
        err = self._err.read().decode(errors="replace")
        self._err.close()
        if rc != 0:
            self.binary.unlink(missing_ok=True)
            raise _diagnose("build_binary (KenLM trie)", rc, err, self.memory, self.temp_dir)
        return seconds

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._err.close()


def run_build_binary(arpa: Path, binary: Path, memory: str, temp_dir: Path) -> float:
    """``BuildBinaryJob`` run to the end: its wall seconds."""
    job = BuildBinaryJob(arpa, binary, memory, temp_dir)
    try:
        return job.wait()
    finally:
        job.stop()
