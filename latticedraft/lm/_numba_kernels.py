"""numba kernels of the ARPA reader and the ARPA → WFST converter (compiled once, cached on disk).

Imported lazily: querying a built LM never imports numba.
"""

from __future__ import annotations

import numba
import numpy as np

POW10 = np.array([10.0**i for i in range(23)])  # exact in float64


@numba.njit(cache=True, nogil=True)
def parse_float(buf, i, n):
    """Parse a decimal float (``-1.25``, ``3e-05``, ``-inf``) in buf[i:n]; (value, next index, ok)."""
    neg = False
    if i < n and (buf[i] == 45 or buf[i] == 43):  # - +
        neg = buf[i] == 45
        i += 1
    if i + 2 < n and (buf[i] == 105 or buf[i] == 73) \
            and (buf[i + 1] == 110 or buf[i + 1] == 78) and (buf[i + 2] == 102 or buf[i + 2] == 70):
        v = np.inf
        return (-v if neg else v), i + 3, True
    mant = 0
    digits = 0
    exp10 = 0
    while i < n and 48 <= buf[i] <= 57:
        if digits < 18:
            mant = mant * 10 + (buf[i] - 48)
            digits += 1
        else:
            exp10 += 1
        i += 1
    if i < n and buf[i] == 46:  # .
        i += 1
        while i < n and 48 <= buf[i] <= 57:
            if digits < 18:
                mant = mant * 10 + (buf[i] - 48)
                digits += 1
                exp10 -= 1
            i += 1
    if digits == 0:
        return 0.0, i, False
    if i < n and (buf[i] == 101 or buf[i] == 69):  # e E
        i += 1
        eneg = False
        if i < n and (buf[i] == 45 or buf[i] == 43):
            eneg = buf[i] == 45
            i += 1
        e = 0
        ed = 0
        while i < n and 48 <= buf[i] <= 57:
            e = e * 10 + (buf[i] - 48)
            ed += 1
            i += 1
        if ed == 0:
            return 0.0, i, False
        exp10 += -e if eneg else e
    v = float(mant)
    if exp10 < 0:
        v = v / POW10[-exp10] if exp10 >= -22 else v / 10.0 ** (-exp10)
    elif exp10 > 0:
        v = v * POW10[exp10] if exp10 <= 22 else v * 10.0 ** exp10
    return (-v if neg else v), i, True


@numba.njit(cache=True, nogil=True)
def parse_block(buf, end, k, words, logprob, backoff, row):
    """Parse ARPA k-gram lines from buf[0:end] into the arrays from ``row`` on.

    Words: decimal token id t → code t+1; ``<s>`` → -1, ``</s>`` → -2, ``<unk>`` → -3.
    Stops at the end of the block, a blank line or a line starting with a backslash.
    Returns (bytes consumed, rows filled, section ended, error code, error byte offset);
    error codes: 1 fields, 2 number, 3 word, 4 more rows than announced.
    """
    i = 0
    cap = words.shape[0]
    while i < end:
        c = buf[i]
        if c == 10:  # blank line ends the section
            return i + 1, row, 1, 0, i
        if c == 13 and i + 1 < end and buf[i + 1] == 10:
            return i + 2, row, 1, 0, i
        if c == 92:  # backslash: next section
            return i, row, 1, 0, i
        j = i
        while j < end and buf[j] != 10:
            j += 1
        line_end = j
        if line_end > i and buf[line_end - 1] == 13:
            line_end -= 1
        if row >= cap:
            return i, row, 0, 4, i
        v, p, ok = parse_float(buf, i, line_end)
        if not ok:
            return i, row, 0, 2, i
        logprob[row] = v
        for w in range(k):
            if p >= line_end or (buf[p] != 32 and buf[p] != 9):
                return i, row, 0, 1, i
            while p < line_end and (buf[p] == 32 or buf[p] == 9):
                p += 1
            if p >= line_end:
                return i, row, 0, 1, i
            if buf[p] == 60:  # '<'
                q = p
                while q < line_end and buf[q] != 32 and buf[q] != 9:
                    q += 1
                ln = q - p
                if ln == 3 and buf[p + 1] == 115 and buf[p + 2] == 62:
                    code = -1
                elif ln == 4 and buf[p + 1] == 47 and buf[p + 2] == 115 and buf[p + 3] == 62:
                    code = -2
                elif ln == 5 and buf[p + 1] == 117 and buf[p + 2] == 110 and buf[p + 3] == 107 and buf[p + 4] == 62:
                    code = -3
                else:
                    return i, row, 0, 3, i
                words[row, w] = code
                p = q
            else:
                t = 0
                nd = 0
                while p < line_end and 48 <= buf[p] <= 57:
                    t = t * 10 + (buf[p] - 48)
                    nd += 1
                    p += 1
                    if t > 2000000000:
                        return i, row, 0, 3, i
                if nd == 0 or (p < line_end and buf[p] != 32 and buf[p] != 9):
                    return i, row, 0, 3, i
                words[row, w] = t + 1
        while p < line_end and (buf[p] == 32 or buf[p] == 9):
            p += 1
        if p < line_end:
            b, p, ok = parse_float(buf, p, line_end)
            if not ok:
                return i, row, 0, 2, i
            while p < line_end and (buf[p] == 32 or buf[p] == 9):
                p += 1
            if p < line_end:
                return i, row, 0, 1, i
            backoff[row] = b
        else:
            backoff[row] = 0.0
        row += 1
        if j >= end:
            return j, row, 0, 0, j
        i = j + 1
    return i, row, 0, 0, i


@numba.njit(cache=True, nogil=True)
def find_child(node, w, ch_lo, ch_hi, lw):
    """Global node id of the child of ``node`` whose last word is ``w`` (binary search), or -1."""
    lo = ch_lo[node]
    hi = ch_hi[node]
    while lo < hi:
        mid = (lo + hi) >> 1
        v = lw[mid]
        if v < w:
            lo = mid + 1
        elif v > w:
            hi = mid
        else:
            return mid
    return -1


@numba.njit(cache=True, nogil=True)
def walk(words, c0, c1, uni, ch_lo, ch_hi, lw, out):
    """out[i] = global node of the n-gram words[i, c0:c1], or -1 if the model lacks it."""
    for i in range(words.shape[0]):
        node = uni[words[i, c0]]
        c = c0 + 1
        while node >= 0 and c < c1:
            node = find_child(node, words[i, c], ch_lo, ch_hi, lw)
            c += 1
        out[i] = node


@numba.njit(cache=True, nogil=True)
def longest_suffix(words, k, uni, ch_lo, ch_hi, lw, out):
    """out[i] = global node of the longest proper suffix of words[i, :k] in the model (-1: none)."""
    for i in range(words.shape[0]):
        out[i] = -1
        for c0 in range(1, k):
            node = uni[words[i, c0]]
            c = c0 + 1
            while node >= 0 and c < k:
                node = find_child(node, words[i, c], ch_lo, ch_hi, lw)
                c += 1
            if node >= 0:
                out[i] = node
                break
