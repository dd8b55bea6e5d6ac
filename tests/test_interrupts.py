"""``interrupts.py``: the last line of an interrupted command says what was kept, as of the interrupt."""

import pytest

from latticedraft import interrupts


def test_the_innermost_description_wins_and_is_taken_at_the_interrupt():
    state = {"n": 0}
    with pytest.raises(KeyboardInterrupt) as e:
        with interrupts.keeping(lambda: "outer"):
            with interrupts.keeping(lambda: f"{state['n']} records kept"):
                state["n"] = 3
                raise KeyboardInterrupt
    assert interrupts.message(e.value) == "interrupted; 3 records kept"


def test_without_a_description_or_with_a_broken_one():
    assert interrupts.message(KeyboardInterrupt()) == "interrupted; " + interrupts.NOTHING_KEPT
    with pytest.raises(KeyboardInterrupt) as e:
        with interrupts.keeping(lambda: 1 / 0):
            raise KeyboardInterrupt
    assert interrupts.message(e.value).endswith(interrupts.NOTHING_KEPT)
