"""The kinds table (``deep_fp8_gemm.kinds``): the legality relation over the whole product of the axes, the generated
C++ header against the Python table (text and compiled meaning), everything derived from the table, and a dummy
value added through the table alone reaching config, CLI, audit list, op registration and the header."""

from __future__ import annotations

import inspect
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deep_fp8_gemm import config, kinds, ops
from deep_fp8_gemm.kinds import TABLE

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "deep_fp8_gemm" / "kinds.cuh"


# ---------------------------------------------------------------------------------------------- legality
def test_every_point_of_the_product_is_a_row_or_refused_naming_two_axis_values():
    """The rows and the pairwise rules are two statements of the same set: walk the full product."""
    points = list(TABLE.product())
    assert len(points) == eval("*".join(str(len(a.values)) for a in TABLE.axes))
    legal = []
    for point in points:
        message = TABLE.conflict(point)
        row = TABLE.find(point)
        if message is None:
            assert row is not None, f"legal by the rules but no row: {point}"
            legal.append((row.name, point["order"]))
            continue
        assert row is None, f"row {row.name} is refused: {message}"
        named = [f"{a}={v}" for a, v in point.items() if f"{a}={v}" in message]
        assert len(named) == 2, (message, point)  # the two conflicting axis values, by name
    assert sorted(legal) == sorted((r.name, o) for r in TABLE.rows for o in r.orders)


def test_a_row_that_breaks_a_rule_is_refused_when_the_table_is_built():
    bad = kinds.KindRow("dense_swiglu", "DenseSwiglu", len(TABLE.rows), "dense", accumulation="1d2d",
                        granularity="1x128/128x128", output="swiglu_fp8")
    with pytest.raises(ValueError, match=r"output=swiglu_fp8 conflicts with layout=dense"):
        TABLE.extended(rows=(bad,))
    with pytest.raises(ValueError, match="illegal kernel kind: order=swap_ab conflicts with layout=masked"):
        TABLE.check(**TABLE.row("masked").point("swap_ab"))


def test_config_sets_are_derived_from_the_table():
    assert config.KINDS == TABLE.names_of("fp8_gemm")
    assert [k.name for k in config.GemmKind] == [r.cpp for r in TABLE.rows]
    assert config.FP8_OUTPUT_KINDS == tuple(k for k in TABLE.kinds_where(output=("fp8", "swiglu_fp8"))
                                            if k in config.KINDS)  # the FP8 template's (MXFP4: its own family)
    assert config.FP32_ACCUMULATE_KINDS == tuple(k for k in TABLE.kinds_where(output="fp32_acc") if k in config.KINDS)
    for kind in config.KINDS:
        layout_kind = TABLE.row(config.LAYOUT_OF[kind])
        assert layout_kind.layout == TABLE.row(kind).layout and layout_kind.output in ("bf16", "fp32_acc")
    assert list(ops.FAMILIES) == list(TABLE.names_of("fp8_gemm"))


def test_every_public_gemm_op_has_a_reference_under_its_name():
    """``deep_fp8_gemm.reference`` covers the library's own GEMM op of every kind (one per family; the 2.x names
    call these ops and have no references of their own)."""
    import deep_fp8_gemm
    from deep_fp8_gemm import reference

    publics = {f.public.__name__ for f in ops.FAMILIES.values()}
    exported = {n for n in deep_fp8_gemm.__all__ if n in publics}
    assert exported == publics  # every family's public op is exported at the top
    for name in publics:
        assert getattr(reference, name) is next(f.reference for f in ops.FAMILIES.values()
                                                if f.public.__name__ == name), name


# ---------------------------------------------------------------------------------------------- the header
def test_the_checked_in_header_is_the_table():
    assert HEADER.read_text() == TABLE.render_header(), (
        "include/deep_fp8_gemm/kinds.cuh differs from deep_fp8_gemm/kinds.py: regenerate it with "
        "`python -m deep_fp8_gemm kinds --header > include/deep_fp8_gemm/kinds.cuh`")


def header_probe(table) -> str:
    """A translation unit that includes the generated header and static_asserts every kind's axis values, layout
    kind and orders as the Python table states them (so a hand edit of the header fails to compile)."""
    lines = ["#include <deep_fp8_gemm/kinds.cuh>", "namespace probe {", "using namespace dfg;"]
    fields = [a for a in table.axes if a.name != "order"]
    for row in table.rows:
        point = row.point()
        for axis in fields:
            lines.append(f"static_assert(kind_axes(GemmKind::{row.cpp}).{axis.name} == "
                         f"{axis.cpp}::{axis.value(point[axis.name]).cpp}, \"{row.name} {axis.name}\");")
        lines.append(f"static_assert(layout_of(GemmKind::{row.cpp}) == GemmKind::{table.row(table.layout_kind(row.name)).cpp},"
                     f" \"{row.name} layout kind\");")
        lines.append(f"static_assert(static_cast<int>(GemmKind::{row.cpp}) == {row.id}, \"{row.name} id\");")
        for order in table.axis("order").values:
            lines.append(f"static_assert(supports_order(GemmKind::{row.cpp}, KindOperandOrder::{order.cpp}) == "
                         f"{'true' if order.name in row.orders else 'false'}, \"{row.name} {order.name}\");")
    lines.append(f"static_assert(num_gemm_kinds() == {len(table.rows)}, \"count\");")
    lines += ["}  // namespace probe", 'extern "C" __global__ void kinds_probe(int* out) { *out = dfg::num_gemm_kinds(); }']
    return "\n".join(lines) + "\n"


def test_the_header_compiles_for_sm_90a_and_states_the_table():
    from deep_fp8_gemm.runtime.compiler import compile_kernel

    compiled = compile_kernel("kinds_probe", header_probe(TABLE))
    assert compiled.cubin[:4] == b"\x7fELF"


def host_probe(include: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """The probe through the simulator's compiler (g++, ``-DDFG_SIMULATOR``) against the headers under ``include``."""
    src = tmp_path / "kinds_probe.cpp"
    src.write_text(header_probe(TABLE).split('extern "C"')[0] + "int main() { return dfg::num_gemm_kinds() == 0; }\n")
    return subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-DDFG_SIMULATOR", f"-I{include}", str(src)],
                          capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator's compiler (g++) is not installed")
def test_the_simulator_build_compiles_the_header_too(tmp_path):
    done = host_probe(ROOT / "include", tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator's compiler (g++) is not installed")
def test_a_hand_edited_header_fails_the_probe(tmp_path):
    """The probe is what catches a header that says something else than the table (here: one layout kind swapped)."""
    root = tmp_path / "include"
    shutil.copytree(ROOT / "include", root)
    text = TABLE.render_header().replace("case GemmKind::DenseFp8Out: return GemmKind::Dense;",
                                         "case GemmKind::DenseFp8Out: return GemmKind::GroupedMasked;")
    assert text != TABLE.render_header()
    (root / "deep_fp8_gemm" / "kinds.cuh").write_text(text)
    done = host_probe(root, tmp_path)
    assert done.returncode != 0 and "dense_fp8out layout kind" in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------- a new value
DUMMY_TABLE = '''
# --- a test's dummy output value, added through the table alone (tests/ops/test_kinds.py) ---
TABLE = TABLE.extended(
    values={"output": (AxisValue("bf16x2", "Bf16Twice", "bf16 D, every value doubled (a test's dummy)", _BF16),)},
    rules=(Rule("output", "bf16x2", "layout", ("dense",), "the dummy is dense only"),),
    rows=(KindRow("dense_bf16x2", "DenseBf16Twice", len(ROWS), "dense", output="bf16x2", **_E4M3_1D2D),))
'''
DUMMY_POLICY = '''
# --- the dummy output's policy (tests/ops/test_kinds.py): bf16, every value written twice as large ---
class _Bf16Twice(Bf16Output):
    name, dtype_name = "bf16x2", "bf16x2"

    def store(self, outs, sel, acc, options):
        outs[0][sel] = (2 * acc).to(torch.bfloat16)


POLICIES["bf16x2"] = _Bf16Twice()
'''
DUMMY_CHECKS = '''
import json, subprocess, sys
import torch
import deep_fp8_gemm as dfg
from deep_fp8_gemm import config, ops, reference
from deep_fp8_gemm.kernels import targets
from deep_fp8_gemm.kinds import TABLE
from deep_fp8_gemm.runtime.compiler import compile_kernel

out = {}
DUMMY_ID = len(TABLE.rows) - 1  # the row the dummy added last
out["config"] = "dense_bf16x2" in config.KINDS and config.KIND_IDS["dense_bf16x2"] == DUMMY_ID
cfg = config.get_config(256, 256, 512, 1, "dense_bf16x2", 132)
config.check_config(cfg)
out["kernel_name"] = cfg.kernel_name()
help_text = subprocess.run([sys.executable, "-m", "deep_fp8_gemm", "audit", "--help"], capture_output=True,
                           text=True).stdout
out["cli"] = "dense_bf16x2" in help_text
audit = targets.audit_targets("dense_bf16x2", [(256, 512)], [256])
out["audit"] = [t.name for t in audit]
compiled = compile_kernel(audit[0].name, audit[0].source)
out["audit_compiles"] = compiled.cubin[:4] == b"\\x7fELF"
family = ops.FAMILIES["dense_bf16x2"]
out["op"] = str(family.op)
a = torch.randn(64, 512).to(torch.float8_e4m3fn)
b = torch.randn(256, 512).to(torch.float8_e4m3fn)
sa, sb = torch.ones(64, 4), torch.ones(2, 4)
twice, once = torch.empty(64, 256, dtype=torch.bfloat16), torch.empty(64, 256, dtype=torch.bfloat16)
family.public((a, sa), (b, sb), twice)
getattr(torch.ops.deep_fp8_gemm, "gemm_fp8_fp8_bf16x2_nt")(a, sa, b, sb, twice)
dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), once)
out["computes"] = bool(torch.equal(twice, (2 * once.float()).to(torch.bfloat16)))
out["reference"] = "gemm_fp8_fp8_bf16x2_nt" in reference.REFERENCES
header = TABLE.render_header()
out["header"] = f"DenseBf16Twice = {DUMMY_ID}" in header and "Bf16Twice = 4" in header
print(json.dumps(out))
'''


def test_a_value_added_through_the_table_alone_reaches_everything(tmp_path):
    """A copy of the package whose kinds.py gains an output value (with its rule and row) and whose ops/outputs.py
    gains that value's policy — no other file edited: config, the CLI's --kind choices, the audit list (its kernel
    compiles for sm_90a), the op registration and its reference, and the generated header (compiled for sm_90a)."""
    copy = tmp_path / "tree"
    for name in ("deep_fp8_gemm", "include", "jit"):
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "deep_fp8_gemm" / "kinds.py", "a") as f:
        f.write(DUMMY_TABLE)
    with open(copy / "deep_fp8_gemm" / "ops" / "outputs.py", "a") as f:
        f.write(DUMMY_POLICY)
    env = dict(os.environ, PYTHONPATH=str(copy), XDG_CACHE_HOME=os.environ.get("XDG_CACHE_HOME", str(tmp_path)))
    header = subprocess.run([sys.executable, "-m", "deep_fp8_gemm", "kinds", "--header"], capture_output=True,
                            text=True, env=env, cwd=copy, check=True).stdout
    (copy / "include" / "deep_fp8_gemm" / "kinds.cuh").write_text(header)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DUMMY_CHECKS)], capture_output=True, text=True,
                          env=env, cwd=copy)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["config"] and got["kernel_name"].startswith("dfg_fp8_gemm_dense_bf16x2_"), got
    assert got["cli"] and got["audit"] and got["audit_compiles"], got
    assert got["op"] == "deep_fp8_gemm.gemm_fp8_fp8_bf16x2_nt.default" and got["computes"], got
    assert got["reference"] and got["header"], got
    # The header of the extended table compiles for sm_90a and states the extended table.
    script = (inspect.getsource(header_probe) + textwrap.dedent('''
        from deep_fp8_gemm.kinds import TABLE
        from deep_fp8_gemm.runtime.compiler import compile_kernel
        assert "dense_bf16x2" in TABLE.names
        print(len(compile_kernel("kinds_probe_dummy", header_probe(TABLE)).cubin))
        '''))
    probe = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=copy)
    assert probe.returncode == 0, probe.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- operand types (issue 41)
def test_bf16_and_tf32_are_operand_values_whose_rules_say_where_they_fit():
    """BF16 / TF32 operands: fp32 accumulation in the tensor core (no promotion, no scales), B stored as bf16 / fp32,
    no swap-AB, their own kernels; their rows are the reference's SM90 forms and every other point of theirs is
    refused naming the operand and one other axis value."""
    assert {"bf16", "tf32"} <= set(TABLE.axis("operand").names)
    assert TABLE.names_of("bf16_gemm") == ("bf16_dense", "bf16_dense_fp32", "bf16_contiguous", "bf16_masked")
    assert TABLE.names_of("hc_prenorm") == ("tf32_hc_prenorm",)
    assert config.KINDS == TABLE.names_of("fp8_gemm") and not set(config.KINDS) & set(TABLE.names_of("bf16_gemm"))
    base = TABLE.row("bf16_dense").point()
    assert base == dict(layout="dense", operand="bf16", accumulation="none", granularity="none", scale_dtype="none",
                        packing="bf16", output="bf16", order="ab")
    for axis, value in (("accumulation", "1d2d"), ("packing", "e4m3"), ("output", "fp8"), ("order", "swap_ab"),
                        ("scale_dtype", "fp32"), ("layout", "psum"), ("layout", "k_grouped")):
        assert f"{axis}={value}" in TABLE.conflict(dict(base, **{axis: value})), (axis, value)
    assert "operand=bf16 conflicts with packing=e4m3" in TABLE.conflict(dict(base, packing="e4m3"))
    assert "output=fp32_acc conflicts with layout=masked" in TABLE.conflict(dict(base, layout="masked",
                                                                                     output="fp32_acc"))
    tf32 = TABLE.row("tf32_hc_prenorm").point()
    assert "layout=masked" in TABLE.conflict(dict(tf32, layout="masked"))
    assert "operand=tf32 conflicts with output=bf16" in TABLE.conflict(dict(tf32, output="bf16"))
    e4m3 = TABLE.row("dense").point()
    assert "accumulation=none conflicts with operand=e4m3" in TABLE.conflict(dict(e4m3, accumulation="none"))
    assert "accumulation=1d2d conflicts with granularity=none" in TABLE.conflict(dict(e4m3, granularity="none"))
    assert TABLE.layout_kind("bf16_dense_fp32") == "bf16_dense" and TABLE.layout_kind("tf32_hc_prenorm") == \
        "tf32_hc_prenorm"
    assert ("case GemmKind::Bf16Dense: return KindAxes{KindLayout::Dense, KindOperand::Bf16, "
            "KindAccumulation::TensorCore") in TABLE.render_header()
    with pytest.raises(ValueError, match="family must be one of"):
        TABLE.names_of("fp4")