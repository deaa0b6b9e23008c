"""Programmatic dependent launch (issue 25, item 1): ``set_pdl(True)`` / ``DFG_PDL=1`` launches every kernel with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, and every kernel waits (``griddepcontrol.wait``: ACQBULK
in the SASS) before its first global access, so the flag changes no result.

CPU: the launches through FakeDriver (the plan fast path, the explicit-config path, a quantiser, the k-grouped map
builder and GEMM) carry the attribute exactly when the flag is set; the audit reports ``"pdl": true`` for each
family's kernels and fails a kernel whose wait was planted away. GPU (skipped here): a chain of dependent calls
gives the same bits with and without PDL, eagerly and replayed from a CUDA graph.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import utils
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.config import get_config
from deep_fp8_gemm.kernels import gemm, group_maps
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.ops import k_grouped
from deep_fp8_gemm.runtime import target
from deep_fp8_gemm.runtime.audit import AuditTarget, audit
from tests._gpu import requires_sm90
from tests._mutate import mutated_headers
from tests.ops.test_k_grouped import k_grouped_operands
from tests.ops.test_prepared import fake_gpu  # noqa: F401 (fixture)

PDL_ATTR = 6  # CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
#: The row counts of the GPU chain test (m x 2048 x 2048 layers).
PDL_CHAIN_MS = [1, 16, 128, 4096]
GPU_CASE_TABLES = (PDL_CHAIN_MS,)


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Plans bind the driver they were made with: each test makes its own (as tests/ops/test_prepared.py)."""
    plans.clear()
    yield
    plans.clear()


@pytest.fixture
def pdl_flag():
    """Restores the process-wide flag after the test."""
    before = dfg.get_pdl()
    yield
    dfg.set_pdl(before)


def _pdl(launch: dict) -> bool:
    return any(attr[0] == PDL_ATTR for attr in launch["attrs"])


@pytest.mark.parametrize("enabled", [False, True])
def test_every_launch_carries_the_attribute_exactly_when_set(fake_gpu, pdl_flag, enabled):  # noqa: F811
    dfg.set_pdl(enabled)
    fake_gpu.param_sizes = [gemm.PARAMS_BYTES]
    fake_gpu.param_sizes_by_name[group_maps.kernel_name()] = [ctypes.sizeof(group_maps.GroupMapParams)]
    m, n, k = 64, 256, 512
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(m, k))
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(n, k))
    sa = utils.get_col_major_tma_aligned_tensor(sa)
    out = torch.empty(m, n, dtype=torch.bfloat16)
    ks = [128, 0, 256]
    ka, ksa, kb, ksb, kc = k_grouped_operands(32, 48, ks, seed=1)
    fake_gpu.on()
    before = len(fake_gpu.launches)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)  # the plan's prepared launch
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)  # its fast path
    gemm.launch_1d2d(get_config(m, n, k, 1, "dense", 132), a, sa, b, sb, out, None, "cuda")  # explicit config
    fake_gpu.param_sizes_by_name.update({name: [kq.QUANT_PARAMS_BYTES] for name in _quant_kernel_names()})
    dfg.per_token_cast_to_fp8(torch.randn(16, 256, dtype=torch.bfloat16))
    k_grouped.FAMILY.dispatch(ka, ksa, kb, ksb, torch.empty_like(kc), ks, torch.tensor(ks, dtype=torch.int32), kc)
    launches = fake_gpu.launches[before:]
    assert len(launches) == 6, [x["name"] for x in launches]  # 3 GEMMs, a quantiser, the builder, the k-grouped GEMM
    assert [_pdl(x) for x in launches] == [enabled] * 6


def _quant_kernel_names():
    return [kq.render_source(kq.QuantKernelConfig(kind, t, v))[0]
            for kind in kq.QuantKind for t in kq.InputType for v in (True, False)]


def test_dfg_pdl_sets_the_initial_flag(monkeypatch):
    monkeypatch.setenv("DFG_PDL", "1")
    assert utils.ProcessSettings().pdl is True
    monkeypatch.setenv("DFG_PDL", "0")
    assert utils.ProcessSettings().pdl is False


def test_set_pdl_is_part_of_the_plan_signature(pdl_flag):
    dfg.set_pdl(False)
    off = utils.PROCESS_SETTINGS.key
    dfg.set_pdl(True)
    assert utils.PROCESS_SETTINGS.key != off
    with pytest.raises(TypeError, match="enabled must be a bool"):
        dfg.set_pdl(1)


def _targets():
    from deep_fp8_gemm.kernels import targets

    dense = targets.audit_targets("dense", shapes=[(576, 7168)], ms=[16, 4096])  # swap-AB and plain
    quant = [t for t in kq.audit_targets() if "per_token" in t.name][:1]
    return dense + quant + [group_maps.audit_target()]


def test_every_family_waits_before_it_reads():
    records = audit(_targets(), progress=False)
    assert all(r["ok"] and r["pdl"] and r["sass"]["ACQBULK"] >= 1 for r in records), \
        [(r["name"], r["problems"], r["pdl"]) for r in records]


def test_planted_missing_wait_fails_the_audit(tmp_path, monkeypatch):
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh",
                    "            hal::setmaxnreg_inc<kMathRegisters>();\n            hal::grid_dependency_wait();\n",
                    "            hal::setmaxnreg_inc<kMathRegisters>();\n")
    dense = [t for t in _targets() if t.kind == "dense"][:1]
    (record,) = audit(dense, progress=False)
    # The producer still waits (ACQBULK present): the math warpgroups' missing wait shows as a count below two.
    assert record["sass"]["ACQBULK"] < 2


# ---------------------------------------------------------------------------------------------- GPU
def _chain(x, weights, pdl: bool):
    """Four dependent layers: quantise, GEMM, the GEMM's output the next layer's input."""
    dfg.set_pdl(pdl)
    for b, sb in weights:
        a, sa = dfg.per_token_cast_to_fp8(x)
        y = torch.empty(x.shape[0], b.shape[0], device=x.device, dtype=torch.bfloat16)
        dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), y)
        x = y
    return x


@pytest.mark.gpu
@requires_sm90
@pytest.mark.parametrize("m", PDL_CHAIN_MS)
def test_gpu_dependent_chain_same_bits_with_pdl(pdl_flag, m):
    torch.manual_seed(m)
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    weights = [dfg.per_block_cast_to_fp8(torch.randn(2048, 2048, device="cuda") / 32) for _ in range(4)]
    plain = _chain(x, weights, False)
    with_pdl = _chain(x, weights, True)
    torch.cuda.synchronize()
    assert torch.equal(plain, with_pdl)
    graph = torch.cuda.CUDAGraph()
    static_x = x.clone()
    _chain(static_x, weights, True)  # warm-up outside the capture
    with torch.cuda.graph(graph):
        out = _chain(static_x, weights, True)
    static_x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _chain(static_x, weights, False))
