"""Pictures of a sausage lattice in the style of the BPD paper's Figure 4.

One column per slot between numbered states; in each column the arcs are ordered by weight
(best on top), each a box with the token's text and its head log-probability. The chosen
path (e.g. the rescored 1-best) is drawn in blue; reference tokens (the target's greedy
continuation) are filled green and bold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from latticedraft.atomic import atomic_file
from latticedraft.errors import InputError
from latticedraft.lattice.sausage import Sausage

_VISIBLE = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5", "\r": "\u240d"}
SOFTWARE = "latticedraft lattice draw"  # the PNG's "Software" text, by which a later --force knows it (is_drawn)
_PNG = b"\x89PNG\r\n\x1a\n"


def visible(text: str, width: int = 14) -> str:
    """Token text with whitespace made visible and long tokens shortened with an ellipsis."""
    s = "".join(_VISIBLE.get(ch, ch) for ch in text)
    s = "".join(ch if ch.isprintable() else "\ufffd" for ch in s)
    return s if len(s) <= width else s[: width - 1] + "\u2026"


def token_texts(tokenizer) -> Callable[[int], str]:
    """``id -> text`` from a ``tokenizers.Tokenizer`` (each id decoded alone)."""
    def text(i: int) -> str:
        try:
            return tokenizer.decode([int(i)])
        except Exception:  # ids outside the tokenizer's vocabulary
            return f"<{int(i)}>"
    return text


def draw_lattice(s: Sausage, out: str | Path, text: Callable[[int], str] | None = None,
                 chosen: Sequence[int] | None = None, reference: Sequence[int] | None = None,
                 title: str | None = None, dpi: int = 130) -> Path:
    """Draw ``s`` to the PNG ``out`` (written atomically); returns its path.

    ``text``: id -> token string (default: the id); ``chosen``: token ids of the path to
    highlight (default: top-1); ``reference``: the target's tokens for the slots (green).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyBboxPatch

    out = Path(out)
    if out.suffix.lower() != ".png":
        raise InputError(f"{out}: lattice pictures are PNG files; give a name ending in .png")
    text = text or (lambda i: str(int(i)))
    chosen = np.asarray(s.top1() if chosen is None else chosen, dtype=np.int64).ravel()
    if len(chosen) != s.h:
        raise InputError(f"the chosen path has {len(chosen)} tokens but the lattice has {s.h} slots")
    ref = None if reference is None else np.asarray(reference, dtype=np.int64).ravel()
    h, k = s.h, int(s.widths.max())

    col_w, row_h = 2.5, 0.52
    fig_w = 0.9 + col_w * h
    fig_h = 1.35 + row_h * k
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    ax.set_xlim(-0.35, h * col_w + 0.35)
    ax.set_ylim(-k * row_h - 0.25, 0.85)
    ax.axis("off")
    y_state = -(k - 1) * row_h / 2
    box_w, box_h = col_w * 0.68, row_h * 0.78

    for i in range(h):
        x0, x1 = i * col_w, (i + 1) * col_w
        xc = (x0 + x1) / 2
        for r in range(int(s.widths[i])):
            tok = int(s.tokens[i, r])
            y = -r * row_h
            on_path = tok == chosen[i]
            is_ref = ref is not None and i < len(ref) and tok == ref[i]
            edge = "#1f5fbf" if on_path else "#9a9a9a"
            lw = 2.4 if on_path else 0.8
            style = dict(color=edge, lw=lw if on_path else 0.6, zorder=3 if on_path else 1,
                         alpha=1.0 if on_path else 0.55)
            ax.plot([x0 + 0.12, xc - box_w / 2], [y_state, y], **style)
            ax.plot([xc + box_w / 2, x1 - 0.12], [y, y_state], **style)
            face = "#bfe8c0" if is_ref else ("#e3ecfa" if on_path else "white")
            ax.add_patch(FancyBboxPatch((xc - box_w / 2, y - box_h / 2), box_w, box_h,
                                        boxstyle="round,pad=0.02,rounding_size=0.08", fc=face, ec=edge, lw=lw,
                                        zorder=4))
            ax.text(xc - box_w / 2 + 0.07, y, visible(text(tok), 12), ha="left", va="center", fontsize=8.5,
                    family="DejaVu Sans Mono", fontweight="bold" if is_ref else "normal", zorder=5)
            ax.text(xc + box_w / 2 - 0.06, y, f"{float(s.logp[i, r]):.2f}", ha="right", va="center",
                    fontsize=7.5, color="#444444", zorder=5)
        ax.text(xc, 0.48, f"head {i + 1}", ha="center", va="center", fontsize=8, color="#555555")
    for i in range(h + 1):
        ax.add_patch(Circle((i * col_w, y_state), 0.12, fc="white", ec="black", lw=1.2, zorder=6))
        ax.text(i * col_w, y_state, str(i), ha="center", va="center", fontsize=8, zorder=7)
    draft = "".join(text(int(t)) for t in chosen)
    head = title or f"sausage lattice h={h}, k={k}"
    legend = "blue: chosen path"
    if ref is not None:
        hits = sum(1 for i in range(min(h, len(ref))) if (s.tokens[i] == ref[i]).any())
        legend += f"   green: reference, in {hits} of {h} slots"
    ax.set_title(f"{head}\nchosen: {visible(draft, 90)}   ({legend})", fontsize=9, loc="left")

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_file(out, suffix=".png") as tmp:
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png", metadata={"Software": SOFTWARE})
    finally:
        plt.close(fig)
    return out


def is_drawn(path) -> bool:
    """Whether file ``path`` is a PNG that ``draw_lattice`` wrote: its ``tEXt`` chunk "Software" says so."""
    import struct

    try:
        with open(path, "rb") as f:
            if f.read(8) != _PNG:
                return False
            while head := f.read(8):
                if len(head) < 8:
                    return False
                size, kind = struct.unpack(">I4s", head)
                if kind in (b"IDAT", b"IEND"):  # text chunks matplotlib writes come before the image data
                    return False
                data = f.read(size)
                f.read(4)  # CRC
                if kind == b"tEXt" and data == b"Software\0" + SOFTWARE.encode():
                    return True
    except OSError:
        return False
    return False


def draw_file(lattice_path, out, tokenizer=None, reference=None, lm=None, alpha: float = 1.0,
              history=None) -> Path:
    """Draw a saved lattice. ``reference``/``history`` default to the file's arrays; the chosen
    path is the n-gram-rescored best with ``lm`` (a build directory), else the file's
    ``chosen``, else top-1."""
    from latticedraft.lattice.sausage import load_npz

    s, extra = load_npz(lattice_path)
    text = None
    if tokenizer is not None:
        from latticedraft.lm.tokenizer import load_tokenizer

        text = token_texts(load_tokenizer(tokenizer))
    if reference is None and "reference" in extra:
        reference = extra["reference"]
    if history is None:
        history = extra.get("history", np.zeros(0, np.int64)).tolist()
    chosen = extra.get("chosen")
    title = None
    if lm is not None:
        from latticedraft.lattice.rescoring import check_ids, load_lm, rescore

        lm_obj = load_lm(lm)
        chosen = rescore(s, lm_obj, alpha, 1, check_ids(s, history, lm_obj, lattice_path)).tokens[0]
        title = f"sausage lattice h={s.h}, k={int(s.widths.max())}, rescored with {Path(lm).name} (alpha={alpha:g})"
    return draw_lattice(s, out, text, chosen=chosen, reference=reference, title=title)
