"""``memory.py``: what this process may still allocate, and the refusal that names the largest size that fits."""

import subprocess
import sys

import pytest

from latticedraft.errors import InputError
from latticedraft.memory import available_bytes, check_fits, human


def test_human_units():
    assert human(512) == "512 B" and human(3 * 2**30) == "3 GiB" and human(9.3 * 2**30) == "9.3 GiB"


def test_available_memory_is_known_here_and_positive():
    assert available_bytes() > 0 and available_bytes("mps") is None


def test_a_memory_cap_lowers_what_is_available():
    """Under ``ulimit -v`` (RLIMIT_AS) the headroom is the cap less the process's own size."""
    code = ("import resource; from latticedraft.memory import available_bytes; "
            "resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, resource.RLIM_INFINITY)); print(available_bytes())")
    got = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 < got < 8 * 2**30


def test_check_fits_names_the_given_option_and_the_largest_value_that_fits():
    need = lambda s: s["--a"] * s["--b"] * 8  # noqa: E731
    check_fits({"--a": 10, "--b": 10}, need, doing="for x", available=800)
    with pytest.raises(InputError) as e:
        check_fits({"--a": 1000, "--b": 10}, need, doing="for x", available=800, given={"--a"})
    msg = str(e.value)
    assert msg.startswith("--a 1000 (with --b 10) would need about 78.1 KiB for x, but 800 B is available")
    assert msg.endswith("the largest --a that fits is 10")  # no --b would fit beside --a 1000
    with pytest.raises(InputError, match="the largest --b that fits is 1"):
        check_fits({"--a": 100, "--b": 10}, need, doing="for x", available=800, given={"--b"})
    with pytest.raises(InputError, match="even the smallest sizes do not fit"):
        check_fits({"--a": 5}, lambda s: 10**6 + s["--a"], doing="for x", available=800)
