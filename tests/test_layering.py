"""The package's import graph follows the layer table of ARCHITECTURE.md: no cycle, no import up the table, no
module outside the table, no other module's private names; every GEMM kind has exactly one family module.

The graph is built from the source with ``ast`` (imports inside functions included: Python runs them too), so
it sees what a run may import, not only what one import happened to execute. The checker takes the sources as a
dict, so the tests below also run it on copies with a planted cycle and a planted private import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "deep_fp8_gemm"


# ---------------------------------------------------------------------------------------------- the table
def layer_rows(text: str | None = None) -> list[tuple[int, str, list[str]]]:
    """``(row, layer, module patterns)`` of ARCHITECTURE.md's "Layers" table, top row first."""
    text = text if text is not None else (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|([^|]*)\|", line)
        if m:
            rows.append((int(m.group(1)), m.group(2).strip(), re.findall(r"`([^`]+)`", m.group(3))))
    assert rows, "no layer table in ARCHITECTURE.md"
    return rows


def row_of(module: str, rows) -> int | None:
    """The row whose pattern names ``module`` (``deep_fp8_gemm.x.y``) most specifically."""
    rel = module[len(PACKAGE) + 1:] if module != PACKAGE else PACKAGE
    best = None
    for row, _, patterns in rows:
        for pattern in patterns:
            if pattern == rel or (pattern.endswith(".*") and (rel == pattern[:-2] or rel.startswith(pattern[:-1]))):
                score = len(pattern) + (1 if not pattern.endswith(".*") else 0)
                if best is None or score > best[0]:
                    best = (score, row)
    return None if best is None else best[1]


# ---------------------------------------------------------------------------------------------- the graph
def package_sources() -> dict[str, tuple[str, bool]]:
    """Module name -> (source, is a package ``__init__``) for every module of the package."""
    out = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path.read_text(), is_pkg)
    return out


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = module.split(".")
    if not is_pkg:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def analyse(sources: dict[str, tuple[str, bool]]) -> tuple[dict[str, set[str]], list[str]]:
    """``(edges, private)``: module -> the package modules it imports; and every cross-module use of a private
    name (``from x import _y``, ``import x`` then ``x._y``), as messages."""
    edges: dict[str, set[str]] = {m: set() for m in sources}
    private: list[str] = []
    for module, (source, is_pkg) in sources.items():
        tree = ast.parse(source)
        bound: dict[str, str] = {}  # local name -> package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and not (node.module or "").startswith(PACKAGE):
                    continue
                target = node.module if node.level == 0 else _resolve(module, is_pkg, node.level, node.module)
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in sources:  # a submodule
                        edges[module].add(full)
                        bound[alias.asname or alias.name] = full
                        continue
                    if target in sources:
                        edges[module].add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and target != module:
                        private.append(f"{module}: from {target} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE):
                        name = alias.name
                        while name not in sources and "." in name:
                            name = name.rsplit(".", 1)[0]
                        edges[module].add(name)
                        if alias.asname:
                            bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and bound[node.value.id] != module):
                private.append(f"{module}: {bound[node.value.id]}.{node.attr}")
        edges[module].discard(module)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layer_problems(sources: dict[str, tuple[str, bool]], rows=None) -> list[str]:
    """Every violation of the layering rules, as messages (empty: the package is layered)."""
    rows = rows if rows is not None else layer_rows()
    edges, private = analyse(sources)
    problems = [f"import cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    problems += [f"private name used across modules: {p}" for p in private]
    for module in sorted(sources):
        row = row_of(module, rows)
        if row is None:
            problems.append(f"{module} is in no row of ARCHITECTURE.md's layer table")
            continue
        for target in sorted(edges[module]):
            target_row = row_of(target, rows)
            # A package's __init__ is executed by importing any of its modules: only a module's own imports count.
            if target_row is not None and target_row < row and not module.startswith(target + "."):
                problems.append(f"{module} (row {row}) imports {target} (row {target_row}): up the table")
    return problems


# ---------------------------------------------------------------------------------------------- tests
def test_the_package_is_layered():
    problems = layer_problems(package_sources())
    assert not problems, "\n".join(problems)


def test_a_planted_cycle_is_caught():
    sources = package_sources()
    source, is_pkg = sources[f"{PACKAGE}.config.rules"]
    sources[f"{PACKAGE}.config.rules"] = (source + "\n\ndef _planted():\n    from ..ops import dense  # noqa\n", is_pkg)
    problems = layer_problems(sources)
    assert any(p.startswith("import cycle") and f"{PACKAGE}.config.rules" in p for p in problems), problems
    assert any(f"{PACKAGE}.config.rules (row 10) imports {PACKAGE}.ops.dense (row 6): up the table" == p
               for p in problems), problems


def test_a_planted_private_import_is_caught():
    sources = package_sources()
    source, is_pkg = sources[f"{PACKAGE}.ops.dense"]
    sources[f"{PACKAGE}.ops.dense"] = (source + "\nfrom ..kernels.gemm import _MapBytes  # noqa\n", is_pkg)
    assert f"private name used across modules: {PACKAGE}.ops.dense: from {PACKAGE}.kernels.gemm import _MapBytes" \
        in layer_problems(sources)
    source, is_pkg = sources[f"{PACKAGE}.moe"]
    sources[f"{PACKAGE}.moe"] = (source + "\nfrom . import utils  # noqa\nutils._device_num_sms()\n", is_pkg)
    assert f"private name used across modules: {PACKAGE}.moe: {PACKAGE}.utils._device_num_sms" \
        in layer_problems(sources)


def test_a_module_outside_the_table_is_caught():
    sources = package_sources()
    sources[f"{PACKAGE}.stray"] = ("x = 1\n", False)
    assert f"{PACKAGE}.stray is in no row of ARCHITECTURE.md's layer table" in layer_problems(sources)


def test_every_gemm_kind_has_exactly_one_family():
    """Each row of the kinds table: one family record in ops.FAMILIES. A 1D2D kind's family is composed from the
    layout module of its layout value and the output policy of its output value (nothing per kind); an
    fp32-accumulating kind's is its own module's FAMILY. No other module of ops builds a family record."""
    import importlib
    import pkgutil

    import deep_fp8_gemm
    from deep_fp8_gemm import ops
    from deep_fp8_gemm._core.family import GemmFamily
    from deep_fp8_gemm.kinds import TABLE
    from deep_fp8_gemm.ops.outputs import POLICIES

    assert list(ops.FAMILIES) == list(TABLE.names_of("fp8_gemm"))
    holders: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(ops.__path__, prefix=f"{PACKAGE}.ops."):
        module = importlib.import_module(info.name)
        records = [v for v in vars(module).values() if isinstance(v, GemmFamily)]
        table = getattr(module, "FAMILIES", None)
        records += [v for v in table.values() if isinstance(v, GemmFamily)] if isinstance(table, dict) else []
        for family in {id(f): f for f in records}.values():
            holders.setdefault(family.kind, []).append(info.name)
    for row in (TABLE.row(name) for name in TABLE.names_of("fp8_gemm")):
        family = ops.FAMILIES[row.name]
        assert family.kind == row.name
        if row.accumulation == "1d2d":
            module = importlib.import_module(f"{PACKAGE}.ops.{row.layout}")
            assert holders[row.name] == [module.__name__], (row.name, holders[row.name])
            assert family.layout is module.LAYOUT and family.output is POLICIES[row.output]
        else:
            assert len(holders[row.name]) == 1, (row.name, holders[row.name])
        assert str(family.op).startswith(f"{PACKAGE}."), (row.name, family.op)
        assert family.public.__module__ == holders[row.name][0], row.name


@pytest.mark.parametrize("kind", ["dense", "contiguous", "masked", "psum", "1d1d", "k_grouped"])
def test_the_families_are_the_ops_table(kind):
    from deep_fp8_gemm import ops

    assert ops.FAMILIES[kind].kind == kind


#: Modules allowed over MAX_MODULE_LINES, each with its reason (at most three).
LONG_MODULES = {
    "runtime/driver.py": "the one module bound to the CUDA driver API: loading, tensor maps, parameter slots, launch",
    "_core/plans.py": "the per-call fast path, its closures spelled out per signature shape for host time (NOTES)",
    "kernels/quant.py": "the fused quantisers' host code: five kernel kinds' launch plans, shared with the fast path",
}
MAX_MODULE_LINES = 600


def test_no_module_over_600_lines_outside_the_allow_list():
    assert len(LONG_MODULES) <= 3
    long = {str(p.relative_to(ROOT / PACKAGE)): len(p.read_text().splitlines())
            for p in (ROOT / PACKAGE).rglob("*.py")}
    over = {name: n for name, n in long.items() if n > MAX_MODULE_LINES and name not in LONG_MODULES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them, or allow-list with a reason): {over}"
    stale = [name for name in LONG_MODULES if long.get(name, 0) <= MAX_MODULE_LINES]
    assert not stale, f"allow-listed modules no longer over {MAX_MODULE_LINES} lines (drop them): {stale}"
