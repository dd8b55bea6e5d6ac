"""Quiet by default: the libraries latticedraft calls keep their warnings off stderr.

``quiet_libraries()`` hides, for this process, what transformers, torch, huggingface_hub, tokenizers,
safetensors and numba print on their own: Python warnings raised in their modules, every
``FutureWarning`` / ``DeprecationWarning`` (API notices such as "``past_key_values`` is deprecated"),
transformers' logged notices (the LOAD REPORT table of a config/weights mismatch, ``generation_config``
notices) and its progress bars (``libraries_speaking`` drops those no setting reaches). latticedraft's
own progress bars, notes and one-line errors are untouched, and a load that does not match its config
is an error of ours (``gpu.models.hf.load_causal_lm``), so nothing the user must know is lost.
``quiet_libraries(verbose=True)`` shows everything again (the CLI's and the benchmarks' ``--verbose``).
Called by the CLI entry point and the benchmarks, never on import of the library: a program that
imports latticedraft keeps its own warning settings.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings

LIBRARIES = ("transformers", "torch", "huggingface_hub", "tokenizers", "safetensors", "accelerate", "numba")
_DEPRECATIONS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)
_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # read when transformers is imported


_hidden = False  # quiet_libraries() is in force (the CLI without --verbose)


def quiet_libraries(verbose: bool = False) -> None:
    """Hide (``verbose=False``) or show again (``verbose=True``) the libraries' warnings and notices."""
    global _hidden
    _hidden = not verbose
    modules = r"(" + "|".join(LIBRARIES) + r")(\..*)?$"
    if verbose:
        warnings.filters[:] = [f for f in warnings.filters if not _ours(f, modules)]
        for k, v in _ENV.items():
            if os.environ.get(k) == v:
                del os.environ[k]
    else:
        warnings.filterwarnings("ignore", module=modules)
        for cat in _DEPRECATIONS:
            warnings.filterwarnings("ignore", category=cat)
        for k, v in _ENV.items():
            os.environ.setdefault(k, v)  # child processes and a later import of transformers inherit it
    level = logging.WARNING if verbose else logging.ERROR
    for name in ("huggingface_hub", "torch"):
        logging.getLogger(name).setLevel(level)
    if "transformers" in sys.modules:  # already imported: its settings are read; set them directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity(level)
        (hf_logging.enable_progress_bar if verbose else hf_logging.disable_progress_bar)()


def _ours(f, modules: str) -> bool:
    """Whether warnings filter ``f`` (action, message, category, module, lineno) is one ``quiet_libraries`` adds."""
    action, _, category, module, _ = f
    if action != "ignore":
        return False
    return (module is not None and module.pattern == modules) or (category in _DEPRECATIONS and module is None)


def add_verbose_arg(parser, dest: str = "verbose") -> None:
    """``--verbose``: show the libraries' warnings, deprecation notices and load reports (hidden by
    default), and what the session fitted, measured or loaded from its caches."""
    parser.add_argument("--verbose", dest=dest, action="store_true",
                        help="show the libraries' warnings, deprecation notices and load reports (hidden by default), "
                             "and what was fitted, measured or loaded from the caches")


@contextlib.contextmanager
def libraries_speaking():
    """A block in which a library writes to stderr on its own, past every setting (transformers'
    "Converting and de-quantizing GGUF tensors" bars are plain tqdm): what it writes there is dropped
    while ``quiet_libraries()`` is in force, and kept as it is otherwise (``--verbose``, a program that
    imports latticedraft). latticedraft's own messages are printed outside such blocks."""
    if not _hidden:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield
