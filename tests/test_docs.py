"""Claims that cannot rot (issue 35, item 5): the figures the docs quote that can be computed are computed here, and
a doc that disagrees fails.

A checked figure is written between markers, ``<!--fig:NAME-->value<!--/fig-->`` (invisible when rendered), and
:func:`expected_figure` says how to compute each ``NAME``; a marker with a name it does not know fails, so a figure
cannot be "checked" by a marker alone. Three tables are checked whole, each after a bare marker (:data:`TABLES`):
``<!--fig:precompile-table-->`` (kernels per ``precompile --kind``, from the kernel list, nothing compiled),
``<!--fig:kinds-table-->`` (each GEMM kind's public op) and ``<!--fig:env-table-->`` (the variables
``deep_fp8_gemm/env.py`` reads, with its defaults). Also: the drop-in's name table against ``deep_gemm``, that the
API reference names every export, the README's length and its Python block (run), every relative link and anchor,
every backticked repository path and ``deep_fp8_gemm.*`` name, and that docs/index.md lists every page.

Docs: README.md, ARCHITECTURE.md and docs/*.md. docs/changelog.md names removed paths on purpose, so its paths and
dotted names are not resolved.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
DROPIN = REPO / "dropin" / "deep_gemm_dropin"
README_MAX_LINES = 250


def doc_files() -> list[Path]:
    return [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted(DOCS.glob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---------------------------------------------------------------------------------------------- the figures
@functools.lru_cache(maxsize=None)
def precompile_counts() -> dict[str, int]:
    """Kernels per ``python -m deep_fp8_gemm precompile --kind K`` with the default shapes: the CLI's own kernel list
    (``collect_targets``, which renders sources but compiles nothing)."""
    from deep_fp8_gemm.cli import ALL_KINDS, collect_targets

    counts = {kind: len(collect_targets(kind, None, None, 132, None)) for kind in ALL_KINDS}
    counts["all"] = len(collect_targets("all", None, None, 132, None))
    return counts


@functools.lru_cache(maxsize=None)
def adversarial_counts() -> tuple[int, int]:
    import tests.adversarial as adversarial

    return len(adversarial.CASES), len(adversarial.WORLD_CASES)


def nvrtc_pin() -> str:
    """The NVRTC requirement of setup.py, e.g. ``nvidia-cuda-nvrtc>=13.0,<14``."""
    pins = re.findall(r'"(nvidia-cuda-nvrtc[^"]*)"', (REPO / "setup.py").read_text())
    assert len(pins) == 1, f"setup.py: expected one nvidia-cuda-nvrtc requirement, got {pins}"
    return pins[0]


def custom_ops() -> set[str]:
    import torch

    import deep_fp8_gemm  # noqa: F401 - registers the ops

    return {name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("deep_fp8_gemm::")}


def config_figure(name: str) -> str:
    """A constant of ``deep_fp8_gemm.config`` as the docs write it: margins as percentages, ints with thousands
    separators."""
    import deep_fp8_gemm.config as config

    value = getattr(config, name)
    if name.endswith("_MARGIN"):
        return f"{round(value * 100)}%"
    if isinstance(value, int):
        return f"{value:,}"
    raise AssertionError(f"no doc format for config.{name} = {value!r}")


def env_switches() -> set[str]:
    return set(re.findall(r'_flag\("(DFG_\w+)"\)', (REPO / "deep_fp8_gemm" / "env.py").read_text()))


def ep_header_bytes() -> int:
    from deep_fp8_gemm.distributed import ep_moe, status

    return 8 * ep_moe._HEADER_FIELDS + status.STATUS_BYTES


def device_check_budget() -> str:
    budgets = re.findall(r"\bBUDGET=(\d+)", (REPO / "bench" / "device_check.sh").read_text())
    assert len(budgets) == 1, budgets
    return budgets[0]


def _names(text: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", text))


def expected_figure(name: str, text: str):
    """``(expected, got)`` for figure ``name`` whose marked text is ``text``; ``None`` for an unknown name."""
    if name.startswith("precompile."):
        return str(precompile_counts().get(name.split(".", 1)[1], "no such --kind")), text
    if name.startswith("config."):
        return config_figure(name.split(".", 1)[1]), text
    simple = {
        "adversarial.total": lambda: str(sum(adversarial_counts())),
        "adversarial.in_process": lambda: str(adversarial_counts()[0]),
        "adversarial.world": lambda: str(adversarial_counts()[1]),
        "nvrtc.pin": nvrtc_pin,
        "kinds.count": lambda: str(len(importlib.import_module("deep_fp8_gemm.kinds").TABLE.names)),
        "ep.header_bytes": lambda: str(ep_header_bytes()),
        "device_check.budget": device_check_budget,
    }
    if name in simple:
        return simple[name](), text
    sets = {"custom-ops": custom_ops, "env.switches": env_switches}
    if name in sets:
        return sorted(sets[name]()), sorted(_names(text))
    return None


FIG = re.compile(r"<!--fig:([\w.\-]+)-->((?:(?!<!--fig:).)*?)<!--/fig-->", re.S)
TABLES = ("precompile-table", "kinds-table", "env-table")  # bare markers, each before a table checked whole


def _without_quoted_markers(text: str) -> str:
    """The text less fenced code blocks (docs/testing.md shows the marker syntax in one)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def figures() -> list[tuple[str, str, str]]:
    """``(file, name, marked text)`` of every inline figure in the docs."""
    return [(_rel(path), m.group(1), m.group(2)) for path in doc_files()
            for m in FIG.finditer(_without_quoted_markers(path.read_text()))]


def test_the_docs_quote_figures():
    names = {name for _, name, _ in figures()}
    assert {"adversarial.total", "nvrtc.pin", "precompile.dense", "custom-ops"} <= names, names
    for path in doc_files():
        text = _without_quoted_markers(path.read_text())
        bare = set(re.findall(r"<!--fig:([\w.\-]+)-->", text)) - {m.group(1) for m in FIG.finditer(text)}
        assert bare <= set(TABLES), f"{_rel(path)}: markers {sorted(bare - set(TABLES))} are neither closed by " \
                                    f"<!--/fig--> nor a table tests/test_docs.py checks"


@pytest.mark.parametrize("where,name,text", figures(), ids=lambda x: x if "\n" not in str(x) else "")
def test_figure(where, name, text):
    result = expected_figure(name, text)
    assert result is not None, f"{where}: <!--fig:{name}--> is not a figure tests/test_docs.py knows how to compute"
    expected, got = result
    assert got == expected, f"{where}: <!--fig:{name}--> says {got!r}, the code gives {expected!r}"


def _table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells, stripped) of the Markdown table right after ``<!--fig:marker-->``, header and rule left out."""
    assert f"<!--fig:{marker}-->" in text
    rows = []
    for line in text.split(f"<!--fig:{marker}-->", 1)[1].lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[2:]


def _marked_tables(marker: str) -> list[tuple[Path, list[list[str]]]]:
    return [(path, _table_after(path.read_text(), marker)) for path in doc_files()
            if f"<!--fig:{marker}-->" in path.read_text()]


def test_precompile_table_matches_the_kernel_list():
    tables = _marked_tables("precompile-table")
    assert tables, "no <!--fig:precompile-table--> in the docs"
    for path, rows in tables:
        documented = {row[0].strip("`"): row[1] for row in rows}
        actual = {kind: str(n) for kind, n in precompile_counts().items()}
        assert documented == actual, f"{_rel(path)}: precompile table {documented} != kernel list {actual}"


def test_kinds_table_matches_the_op_families():
    from deep_fp8_gemm.ops import FAMILIES

    tables = _marked_tables("kinds-table")
    assert tables, "no <!--fig:kinds-table--> in the docs"
    for path, rows in tables:
        documented = {row[0].strip("`"): row[1].strip("`") for row in rows}
        actual = {kind: family.public.__name__ for kind, family in FAMILIES.items()}
        assert documented == actual, f"{_rel(path)}: kinds table {documented} != ops.FAMILIES {actual}"


def env_defaults(monkeypatch) -> dict[str, str]:
    """What env.py gives with every DFG_* variable unset, as the table writes it."""
    from deep_fp8_gemm import env

    for name in list(os.environ):
        if name.startswith("DFG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    defaults = {name: "off" for name in env_switches()}
    assert all(not getattr(env, fn)() for fn in ("jit_disable_cache", "jit_debug", "jit_ptxas_verbose", "simulate",
                                                  "pdl", "check_layouts", "sim_exact_mma"))
    defaults.update({
        "DFG_JIT_CACHE_DIR": "$XDG_CACHE_HOME/deep_fp8_gemm" if env.jit_cache_dir() == Path("/xdg/deep_fp8_gemm")
        else f"?{env.jit_cache_dir()}",
        "DFG_SIM_NUM_SMS": str(env.sim_num_sms()),
        "DFG_SIM_SEED": str(env.sim_seed()),
        "DFG_SIM_TIMEOUT_SECONDS": f"{env.sim_timeout_seconds():g}",
        "DFG_SIM_RACES": {"on": "1", "off": "0", "full": "full"}[env.sim_races()],
        "DFG_WATCHDOG_SECONDS": "off" if env.watchdog_ns() == 0 else str(env.watchdog_ns()),
    })
    return defaults


def test_env_table_matches_env_py(monkeypatch):
    tables = _marked_tables("env-table")
    assert len(tables) == 1, "one <!--fig:env-table--> (docs/configuration.md)"
    path, rows = tables[0]
    read = set(re.findall(r'"(DFG_[A-Z0-9_]+)"', (REPO / "deep_fp8_gemm" / "env.py").read_text()))
    documented = {row[0].strip("`"): row[1] for row in rows}
    assert set(documented) == read, (f"{_rel(path)}: the table lists {sorted(set(documented) - read)} that env.py "
                                     f"does not read and misses {sorted(read - set(documented))}")
    defaults = env_defaults(monkeypatch)
    assert set(defaults) == read, f"test_docs.env_defaults does not cover {sorted(read - set(defaults))}"
    for name, default in defaults.items():
        cell = documented[name]
        first = re.match(r"`([^`]*)`", cell)
        got = first.group(1) if first else cell
        assert got == default, f"{_rel(path)}: {name}'s default is {cell!r}, env.py gives {default!r}"


def test_nvrtc_versions_quoted_in_the_docs_are_the_pinned_major():
    major = re.search(r">=(\d+)\.", nvrtc_pin()).group(1)
    for path in doc_files():
        for version in re.findall(r"NVRTC (\d+)\.\d+", path.read_text()):
            assert version == major, f"{_rel(path)} quotes NVRTC {version}.x; setup.py pins {nvrtc_pin()}"


def test_adversarial_counts_are_marked_wherever_quoted():
    for path in doc_files():
        for m in re.finditer(r"(?<![\w>])(\d[\d,]*) (?:bad and edge inputs|kinds of bad|adversarial cases)",
                             path.read_text()):
            pytest.fail(f"{_rel(path)}: '{m.group(0)}' is an unmarked adversarial count; write "
                        f"<!--fig:adversarial.total-->N<!--/fig-->")


# ---------------------------------------------------------------------------------------------- the drop-in table
@pytest.fixture(scope="module")
def deep_gemm():
    """The facade served as ``deep_gemm`` by the import hook, with no other provider (as tests/dropin does)."""
    from tests.dropin.conftest import clean_imports
    from deep_fp8_gemm.compat import dropin

    with clean_imports():
        dropin.enable()
        module = importlib.import_module("deep_gemm")
        for sub in ("deep_gemm.utils.layout", "deep_gemm.utils.math", "deep_gemm.testing"):
            importlib.import_module(sub)
        yield module


def dropin_table() -> list[tuple[list[str], str]]:
    """``(names in the first column, second column)`` of docs/dropin.md's name table."""
    section = (DOCS / "dropin.md").read_text().split("## The name table", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| `") or (line.startswith("| ") and "`" in line.split("|")[1]):
            first, second = line.strip().strip("|").split(" | ", 1)
            rows.append((re.findall(r"`([A-Za-z_][\w.]*)", first), second.strip()))
    assert len(rows) > 10, "docs/dropin.md: no name table under '## The name table'"
    return rows


def _resolve(module, dotted: str) -> bool:
    for base in (module, getattr(module, "utils", None), getattr(module, "testing", None)):
        obj = base
        for part in dotted.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return True
    return False


def test_dropin_table_lists_every_export_and_nothing_it_lacks(deep_gemm):
    rows = dropin_table()
    section = (DOCS / "dropin.md").read_text().split("## The name table", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([A-Za-z_][\w.]*)", section))
    missing = sorted(n for n in deep_gemm.__all__
                     if n not in listed and n not in ("layout", "math", "testing", "utils"))
    assert not missing, f"docs/dropin.md's name table does not list {missing}"
    for names, status in rows:
        absent = status.startswith("absent")
        for name in names:
            if name.endswith("_") or name.startswith("_"):
                continue  # a family (`bf16_gemm_*`) or a suffix (`_tn`): not a name
            assert _resolve(deep_gemm, name) != absent, (
                f"docs/dropin.md says {name} is {'absent' if absent else 'provided'}, deep_gemm disagrees")


# ---------------------------------------------------------------------------------------------- API coverage
def test_api_reference_names_every_export():
    import deep_fp8_gemm

    api = (DOCS / "api.md").read_text()
    missing = [n for n in deep_fp8_gemm.__all__
               if n != "__version__" and not re.search(rf"`(?:deep_fp8_gemm\.)?{re.escape(n)}\b", api)]
    assert not missing, f"docs/api.md does not name {missing}"
    model = (DOCS / "model.md").read_text()
    for module_name in ("nn", "moe", "layout", "autograd", "distributed"):
        module = importlib.import_module(f"deep_fp8_gemm.{module_name}")
        missing = [n for n in module.__all__ if not re.search(rf"`[^`]*\b{re.escape(n)}\b", model)]
        assert not missing, f"docs/model.md does not name deep_fp8_gemm.{module_name}'s {missing}"


# ---------------------------------------------------------------------------------------------- the changelog
def deprecation_message(module: str) -> str:
    """The ``warnings.warn`` text of a deprecated old path, read from its source (importing it warns only once)."""
    import ast

    tree = ast.parse((REPO / "deep_fp8_gemm" / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "warn":
            return node.args[0].value
    raise AssertionError(f"deep_fp8_gemm/{module}.py warns nothing")


def test_changelog_names_each_deprecated_path_and_its_new_home():
    import deep_fp8_gemm

    changelog = (DOCS / "changelog.md").read_text()
    for module in deep_fp8_gemm._DEPRECATED_MODULES:
        row = re.search(rf"^\| `deep_fp8_gemm\.{module}` \|(.*)$", changelog, flags=re.M)
        assert row, f"docs/changelog.md has no row for the deprecated deep_fp8_gemm.{module}"
        message = deprecation_message(module).split(":", 1)[1]  # after "... goes in the next release:"
        names = set(re.findall(r"[A-Za-z_][\w.]*(?:\[kind\]\.check)?", message)) - {"import", "from", "and", "is"}
        names = {n for n in names if "_" in n or "." in n}
        missing = sorted(n for n in names if n not in row.group(1))
        assert not missing, (f"docs/changelog.md's row for deep_fp8_gemm.{module} does not name {missing} (its "
                             f"warning does)")


# ---------------------------------------------------------------------------------------------- the README
def test_readme_fits_on_a_screen_or_five():
    lines = (REPO / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines, the limit is {README_MAX_LINES}: move prose "
                                       f"to docs/")


def readme_python_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1, f"README.md: expected one python block, got {len(blocks)}"
    return blocks[0]


def test_readme_python_block_runs_on_the_cpu(tmp_path):
    block = readme_python_block()
    assert block.count("\n") <= 25 and "import deep_gemm" in block and "FP8MoE" in block
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFG_")}
    env["PYTHONPATH"] = os.pathsep.join([str(DROPIN), str(REPO), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""
    result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"README's python block failed:\n{result.stdout}\n{result.stderr}"
    diffs = [float(x) for x in re.findall(r"calc_diff[^:]*: ([0-9.e+-]+)", result.stdout)]
    assert len(diffs) == 2 and max(diffs) < 2e-3, result.stdout
    assert "torch.Size([64, 512])" in result.stdout


# ---------------------------------------------------------------------------------------------- links and paths
def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def links() -> list[tuple[str, str]]:
    out = []
    for path in doc_files():
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        out += [(_rel(path), target) for target in re.findall(r"\]\(([^)\s]+)\)", text)]
    return out


@pytest.mark.parametrize("where,target", links())
def test_link_resolves(where, target):
    if re.match(r"[a-z]+:", target):
        return  # an external URL
    source = REPO / where
    file_part, _, anchor = target.partition("#")
    dest = (source.parent / file_part).resolve() if file_part else source
    assert dest.exists(), f"{where}: link to {target}: {dest} does not exist"
    if anchor:
        assert dest.suffix == ".md", f"{where}: anchor on a non-Markdown link {target}"
        assert anchor in anchors(dest), f"{where}: {target}: no heading '{anchor}' in {_rel(dest)}"


def test_docs_index_lists_every_page():
    index = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w.\-]+\.md)\)", index))
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= linked, f"docs/index.md does not link {sorted(pages - linked)}: add a row for each page"
    readme = (REPO / "README.md").read_text()
    assert "docs/index.md" in readme and "docs/batch-invariance.md" in readme


PATH_SPAN = re.compile(r"^([\w.\-/]+\.(?:py|md|cuh|hpp|cu|json|sh|toml|ini))(?:::(\w+))?$")
PATH_ROOTS = ("", "deep_fp8_gemm", "include/deep_fp8_gemm", "dropin/deep_gemm_dropin")


@functools.lru_cache(maxsize=None)
def repo_file_names() -> frozenset[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    return frozenset(Path(f).name for f in files) | frozenset(p.name for p in DOCS.glob("*.md"))


def backticked_paths() -> list[tuple[str, str]]:
    out = []
    for path in doc_files():
        if path.name == "changelog.md":
            continue
        for span in sorted(_names(path.read_text())):
            if PATH_SPAN.match(span):
                out.append((_rel(path), span))
    return out


@pytest.mark.parametrize("where,span", backticked_paths())
def test_backticked_path_exists(where, span):
    path, symbol = PATH_SPAN.match(span).groups()
    if "/" not in path:
        assert path in repo_file_names(), f"{where}: `{span}`: no file {path} in the repository"
        return
    candidates = [REPO / root / path for root in PATH_ROOTS if (REPO / root / path).is_file()]
    assert candidates, f"{where}: `{span}`: {path} is not a file under {', '.join(r or '.' for r in PATH_ROOTS)}"
    if symbol:
        text = candidates[0].read_text()
        assert re.search(rf"^\s*(?:def|class|async def) {symbol}\b|^{symbol}\s*[:=]", text, flags=re.M), (
            f"{where}: `{span}`: no {symbol} in {_rel(candidates[0])}")


DOTTED = re.compile(r"(?<![.\w])(deep_fp8_gemm(?:\.\w+)+|(?:config|ops|kernels|runtime|_core)\.\w+(?:\.\w+)*)")


def dotted_names() -> list[tuple[str, str]]:
    out = set()
    for path in doc_files():
        if path.name in ("changelog.md", "dropin.md"):
            continue  # removed paths on purpose; deep_gemm's own `utils.*`
        for span in _names(path.read_text()):
            for m in DOTTED.finditer(span):
                if not PATH_SPAN.match(m.group(1)):
                    out.add((_rel(path), m.group(1)))
    return sorted(out)


@pytest.mark.parametrize("where,name", dotted_names())
def test_dotted_name_resolves(where, name):
    parts = name.split(".")
    if parts[0] != "deep_fp8_gemm":
        parts = ["deep_fp8_gemm", *parts]
    obj, i = None, len(parts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        while i > 0:
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ModuleNotFoundError:
                i -= 1
        assert obj is not None, f"{where}: `{name}`: no module"
        for part in parts[i:]:
            assert hasattr(obj, part), f"{where}: `{name}`: {'.'.join(parts[:i])} has no {part}"
            obj = getattr(obj, part)
            i += 1
