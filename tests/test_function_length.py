"""No function of the package is longer than 80 lines (``def`` line to last line, its docstring
included), except the numba kernels below: a kernel is one jitted loop nest whose parts would cost a
call each in the hot loop. Read from the source with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "latticedraft"
LIMIT = 80

ALLOWED = {  # (file under latticedraft/, qualified name): why it may be longer
    ("lattice/state_dp.py", "_state_pbest"): "numba kernel",
    ("lattice/triple_dp.py", "_triple_values"): "numba kernel",
    ("lm/_numba_kernels.py", "parse_block"): "numba kernel",
}


def functions(tree: ast.Module):
    """(qualified name, node) of every function and method in ``tree``, nested ones included."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def lengths() -> dict[tuple[str, str], tuple[int, ast.AST]]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, node in functions(ast.parse(path.read_text(), str(path))):
            out[rel, name] = (node.end_lineno - node.lineno + 1, node)
    return out


def _jitted(node: ast.AST) -> bool:
    """Whether ``node`` carries a numba jit decorator (``@njit``, ``@numba.njit(...)``, ``@jit``)."""
    for d in node.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if ast.unparse(target).split(".")[-1] in ("njit", "jit"):
            return True
    return False


def test_no_function_longer_than_the_limit():
    long = {key: n for key, (n, _) in lengths().items() if n > LIMIT and key not in ALLOWED}
    assert not long, "split these into named steps: " + ", ".join(f"{f} {q} ({n} lines)" for (f, q), n in long.items())


def test_the_allow_list_is_kernels_and_still_needed():
    found = lengths()
    for key, why in ALLOWED.items():
        assert key in found, f"{key} no longer exists: remove it from ALLOWED"
        n, node = found[key]
        assert n > LIMIT, f"{key} is {n} lines now: remove it from ALLOWED"
        assert (why == "numba kernel") == _jitted(node), f"{key} is listed as {why!r}"


def test_the_walk_sees_nested_functions_and_methods():
    tree = ast.parse("class A:\n    def f(self):\n        def g():\n            pass\n\ndef h():\n    pass\n")
    assert [name for name, _ in functions(tree)] == ["A.f", "A.f.g", "h"]
