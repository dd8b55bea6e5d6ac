"""The package's import graph keeps docs/architecture.md's layers: ``cli -> decoding -> {gpu, lattice, lm}``,
``lattice -> lm``; ``lm`` imports nothing else of the package; ``gpu`` knows no algorithm; nothing
imports ``cli``; ``lattice/`` never imports torch; and no two files import each other, directly or
round a circle.

The graph is read from the source with ``ast``, so nothing is imported. Every ``import`` counts,
wherever it stands (a function-level or ``TYPE_CHECKING`` import still ties the two files
together). ``from pkg import name`` is an edge to the module ``pkg.name`` where that is a module,
else to ``pkg``; ``import a.b.c`` is an edge to ``a.b.c`` alone: the parents Python imports on the
way (``a``, ``a.b``) are not edges, so a package's ``__init__`` that imports its own submodules
makes no circle with them unless one of them imports a name the ``__init__`` itself defines.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "latticedraft"
PKG = "latticedraft"
LOWER = ("gpu", "lattice", "lm")  # the layers below decoding/
UPPER = ("decoding", "cli")
NO_TORCH = ("torch", "transformers")

@dataclass
class Graph:
    """files: module -> path; edges: module -> package modules it imports (anywhere in the file);
    load: module -> package modules it imports when it is imported (module level, outside
    ``if TYPE_CHECKING``); external: module -> top-level names of the other packages it imports
    anywhere; external_load: the same at module level."""

    files: dict = field(default_factory=dict)
    edges: dict = field(default_factory=dict)
    load: dict = field(default_factory=dict)
    external: dict = field(default_factory=dict)
    external_load: dict = field(default_factory=dict)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def targets(node: ast.AST, name: str, is_package: bool, modules) -> list[str]:
    """The dotted names ``node`` (an ``Import`` or ``ImportFrom`` in module ``name``) imports: a
    module of ``modules`` where the name is one, else the name as written (resolved if relative)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        here = name.split(".") if is_package else name.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join(here + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def _owner(target: str, modules) -> str | None:
    """The package module ``target`` names or lies in (``pkg.mod.func`` -> ``pkg.mod``)."""
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target if target in modules else None


def _imports(tree: ast.Module):
    """(node, at_load) for every import of ``tree``; at_load: run when the module is imported."""
    def walk(node, at_load):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, at_load
            inside = at_load
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inside = False
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                inside = False
            yield from walk(child, inside)

    yield from walk(tree, True)


def build_graph(root: Path = ROOT) -> Graph:
    g = Graph()
    for f in sorted(root.rglob("*.py")):
        g.files[module_name(f, root)] = f
    for name, f in g.files.items():
        tree = ast.parse(f.read_text(), str(f))
        for key in ("edges", "load", "external", "external_load"):
            getattr(g, key)[name] = set()
        for node, at_load in _imports(tree):
            for t in targets(node, name, f.name == "__init__.py", g.files):
                if t.split(".")[0] == root.name:
                    mod = _owner(t, g.files)
                    if mod is not None and mod != name:
                        g.edges[name].add(mod)
                        if at_load:
                            g.load[name].add(mod)
                else:
                    top = t.split(".")[0]
                    g.external[name].add(top)
                    if at_load:
                        g.external_load[name].add(top)
    return g


def cycles(edges: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan) over ``edges``; each
    sorted, the list sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def _in(name: str, *subpackages: str) -> bool:
    return any(name == f"{PKG}.{s}" or name.startswith(f"{PKG}.{s}.") for s in subpackages)


def helpers(g: Graph) -> set[str]:
    """The top-level helper modules: ``latticedraft/<name>.py`` (errors, atomic, paths, outputs,
    memory, npzfile, ...), not ``__main__`` (the entry point, which runs the CLI)."""
    return {m for m, f in g.files.items() if f.parent == ROOT and f.name not in ("__init__.py", "__main__.py")}


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph()


def test_the_graph_is_read(graph):
    """A parser that found nothing would pass every test below: the graph holds the edges we know."""
    assert len(graph.files) > 100
    assert f"{PKG}.gpu.train.distill" in graph.load[f"{PKG}.gpu.train.heads"]
    assert f"{PKG}.cli.decode" in graph.load[f"{PKG}.cli"]  # from latticedraft.cli import decode
    assert f"{PKG}.lm.tokenizer" in graph.edges[f"{PKG}.gpu.train.continuations"]  # function-level
    assert "torch" in graph.external_load[f"{PKG}.gpu.train.heads"]


def test_the_resolver_on_inline_source():
    mods = {"p", "p.a", "p.b", "p.sub", "p.sub.c"}

    def of(src, name, is_package=False):
        return [t for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))
                for t in targets(n, name, is_package, mods)]

    assert of("from p import a, name", "p.b") == ["p.a", "p"]  # a module; a name of p/__init__
    assert of("from . import a", "p.b") == ["p.a"]
    assert of("from ..a import f", "p.sub.c") == ["p.a"]
    assert of("from .c import f", "p.sub", is_package=True) == ["p.sub.c"]
    assert of("import p.sub.c", "p.a") == ["p.sub.c"]
    assert _owner("p.sub.c.func", mods) == "p.sub.c"


def test_gpu_lattice_lm_import_nothing_from_decoding_or_cli(graph):
    """``gpu`` knows no algorithm; ``lattice`` and ``lm`` sit below both (function-level imports too:
    a decoder the lower layers need comes in as an argument)."""
    bad = sorted(f"{m} -> {t}" for m, ts in graph.edges.items() if _in(m, *LOWER) for t in ts if _in(t, *UPPER))
    assert not bad, "imports that point up:\n" + "\n".join(bad)


def test_nothing_imports_cli(graph):
    """Only the CLI itself and ``python -m latticedraft`` (``__main__``) import ``latticedraft.cli``."""
    bad = sorted(f"{m} -> {t}" for m, ts in graph.edges.items()
                 if not _in(m, "cli") and m != f"{PKG}.__main__" for t in ts if _in(t, "cli"))
    assert not bad, "\n".join(bad)


def test_lm_imports_only_itself_and_the_top_level_helpers(graph):
    """Of the package, ``lm`` imports only ``lm.*`` and the top-level helper modules
    (``latticedraft/<name>.py`` but ``__main__``), and those helpers import no subpackage, so nothing
    of ``gpu``, ``lattice``, ``decoding`` or ``cli`` is reached through them either."""
    ok = helpers(graph)
    bad = sorted(f"{m} -> {t}" for m, ts in graph.edges.items() if _in(m, "lm")
                 for t in ts if not (_in(t, "lm") or t in ok))
    bad += sorted(f"{m} -> {t}" for m in ok for t in graph.edges[m] if t not in ok)
    assert not bad, "\n".join(bad)


def test_lattice_never_imports_torch(graph):
    """No file of ``lattice/`` imports torch or transformers (anywhere in it), and importing any of
    them loads no package module that imports either at module level (``lattice -> lm -> ...``)."""
    direct = sorted(f"{m} -> {x}" for m, xs in graph.external.items() if _in(m, "lattice")
                    for x in xs if x in NO_TORCH)
    assert not direct, "\n".join(direct)
    seen, todo = set(), [m for m in graph.files if _in(m, "lattice")]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.load[m])
    loaded = sorted(f"{m} -> {x}" for m in seen for x in graph.external_load[m] if x in NO_TORCH)
    assert not loaded, "importing lattice/ loads:\n" + "\n".join(loaded)


def test_no_import_cycles(graph):
    """No file-level import cycles anywhere in the package (docs/architecture.md: dependencies point one way)."""
    found = cycles(graph.edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_gpu_models_never_import_gpu_verify(graph):
    """``gpu/models`` (what a model is) sits below ``gpu/verify`` (how it is run over drafts): no edge
    points from the first to the second, so the two never depend on each other both ways."""
    bad = sorted(f"{m} -> {t}" for m, ts in graph.edges.items() if _in(m, "gpu.models") for t in ts
                 if _in(t, "gpu.verify"))
    assert not bad, "\n".join(bad)

