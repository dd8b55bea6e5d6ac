"""``status``: a step's one progress line of our own, on a terminal only, erased when the step ends
(issue 59, class D: no progress line stands before an error)."""

import io

import pytest

from latticedraft.status_line import status


def test_the_progress_line_is_shown_on_a_terminal_and_erased():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term, log = Terminal(), io.StringIO()
    with pytest.raises(RuntimeError):
        with status("importing x", term), status("importing x", log):
            raise RuntimeError("failed")
    assert term.getvalue() == "importing x ...\r\033[K" and log.getvalue() == ""
