"""The typed exceptions of latticedraft.

Every user-facing error says what was wrong (the file or value) and how to fix it,
in one line. The CLI prints ``error: <message>`` and exits with status 2.
"""


class LatticedraftError(Exception):
    """Base class: a problem the user can fix; the CLI prints it as one line."""


class InputError(LatticedraftError, ValueError):
    """An argument, file or value given by the user is invalid."""


class BuildError(LatticedraftError, RuntimeError):
    """An external build step (tokenizer, lmplz, build_binary, FST writer) failed."""


class ModelError(LatticedraftError, ValueError):
    """A model, head checkpoint, tokenizer or LM does not fit what it is used with."""
