"""PDL as the ops use it, in the simulator (issue 38): the ops' own launch sequence, under ``set_pdl(True)`` and
``DFG_SIMULATE=1`` inside ``deep_fp8_gemm.simulator.stream()``, runs as one simulated stream across kernel libraries
(quantiser -> GEMM, GEMM -> GEMM of another family), each launch a programmatic dependent launch of the one before.

* The real kernels run clean and give the bits of the same chain without PDL.
* Planted, each reported as ``pdl`` with both kernels, both threads and both call sites:
  (a) the dependent reads its predecessor's output before griddepcontrol.wait: the GEMM's producer without its wait
      loads A while the quantiser that wrote it is (as far as ordering goes) still running;
  (b) it writes memory the predecessor still reads or writes before the wait: a split-K GEMM that clears its first
      partial slot of the workspace before its wait (its own slot in its own launch: no race there), after a split-K
      GEMM that used the same cached workspace;
  (c) a kernel launched with the PDL attribute that never waits but touches predecessor data: the quantiser without
      its griddepcontrol.wait, reading the GEMM's output.
Before the stream across libraries existed, none of these ran as a PDL chain in the simulator (each op's launch was
a stream of its own, and set_pdl changed nothing there).
"""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import simulator
from deep_fp8_gemm.config import check_config
from deep_fp8_gemm.kernels import gemm, split_k
from deep_fp8_gemm.simulator import SimulationError
from deep_fp8_gemm.utils import empty_m_major

from tests._mutate import mutated_headers
from .test_sim_gemm import make_config, quantised_operands

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

M, K, N1, N2, N3 = 64, 256, 128, 256, 128


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    before = dfg.get_pdl()
    yield
    dfg.set_pdl(before)


def _weights():
    g = torch.Generator().manual_seed(5)
    return [dfg.per_block_cast_to_fp8(torch.randn(n, k, generator=g) / 16) for n, k in ((N1, K), (N2, N1), (N3, N2))]


def _chain(x, weights):
    """Quantise -> GEMM (bf16) -> quantise -> FP8-output GEMM -> GEMM reading that FP8 output: five launches of four
    kernel libraries, as a layer stack issues them."""
    (b1, sb1), (b2, sb2), (b3, sb3) = weights
    a, sa = dfg.per_token_cast_to_fp8(x)
    y = torch.empty(M, N1, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b1, sb1), y)
    a, sa = dfg.per_token_cast_to_fp8(y)
    d, sd = torch.empty(M, N2, dtype=torch.float8_e4m3fn), empty_m_major((M, N2 // 128), "cpu")
    dfg.gemm_fp8_fp8_fp8_nt((a, sa), (b2, sb2), (d, sd))
    z = torch.empty(M, N3, dtype=torch.bfloat16)
    dfg.gemm_fp8_fp8_bf16_nt((d, sd), (b3, sb3), z)
    return z


def _x():
    return torch.randn(M, K, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)


@pytest.mark.parametrize("seed", (0, 1))
def test_ops_chain_under_pdl_runs_clean_with_the_same_bits(simulate, seed, monkeypatch):
    monkeypatch.setenv("DFG_SIM_SEED", str(seed))
    weights = _weights()
    dfg.set_pdl(False)
    plain = _chain(_x(), weights)
    dfg.set_pdl(True)
    with simulator.stream():
        chained = _chain(_x(), weights)
    assert torch.equal(plain, chained)
    assert not plain.isnan().any()


def test_stream_refuses_to_nest_and_a_pdl_launch_outside_one_is_plain(simulate):
    with simulator.stream():
        with pytest.raises(SimulationError, match="already open"):
            with simulator.stream():
                pass
    dfg.set_pdl(True)  # no stream open: every launch is a stream of its own, the flag changes nothing
    assert not _chain(_x(), _weights()).isnan().any()


def _report(run) -> str:
    with pytest.raises(SimulationError) as e:
        run()
    report = str(e.value)
    print(report[:2000])
    assert re.search(r"\bpdl: ", report), report[:3000]
    assert re.search(r"kernel (\d+) is a programmatic dependent launch, ordered after kernel \d+ only by "
                     r"griddepcontrol\.wait", report), report[:3000]
    assert len(re.findall(r"kernel \d+ cta \d+ thread \d+", report)) >= 2, report[:3000]
    return report


def test_a_dependent_reading_its_predecessors_output_before_the_wait(simulate, tmp_path, monkeypatch):
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh",
                    "            hal::setmaxnreg_dec<kProducerRegisters>();\n            hal::grid_dependency_wait();\n",
                    "            hal::setmaxnreg_dec<kProducerRegisters>();\n")
    dfg.set_pdl(True)
    weights = _weights()

    def run():
        with simulator.stream():
            _chain(_x(), weights)

    report = _report(run)
    # the GEMM's TMA load of A against the quantiser's store of it
    assert re.search(r"a TMA load's read of \d+ bytes at global 0x[0-9a-f]+ conflicts with a plain write by kernel 0 "
                     r"cta \d+ thread \d+ \(warp \d+ lane \d+\) at kernels/quant\.cuh:\d+", report), report[:3000]
    assert re.search(r"kernel 1 cta \d+ thread \d+ \(warp \d+ lane \d+\) at \S*tma\.cuh:\d+", report), report[:3000]


def test_b_dependent_writing_the_workspace_its_predecessor_uses_before_the_wait(simulate, tmp_path, monkeypatch):
    mutated_headers(tmp_path, monkeypatch, "kernels/fp8_gemm.cuh",
                    "            hal::setmaxnreg_inc<kMathRegisters>();\n            hal::grid_dependency_wait();\n",
                    "            hal::setmaxnreg_inc<kMathRegisters>();\n"
                    "            if constexpr (kSplitK > 1) {  // planted: this CTA's first partial slot cleared up front\n"
                    "                if (thread == 0)\n"
                    "                    params.split_partials[static_cast<u64>(hal::block_idx()) * kNumMathWarpgroups *\n"
                    "                                          Split::kWgFloats] = 0.0f;\n"
                    "            }\n"
                    "            hal::grid_dependency_wait();\n")
    dfg.set_pdl(True)
    split_k.clear()
    cfg = dataclasses.replace(make_config("dense", 64, 512, 64, 32, stages=2, grid=4), split_k=4)
    check_config(cfg)
    a, sa, b, sb = quantised_operands((64,), 64, 512, seed=1)
    sa = dfg.get_col_major_tma_aligned_tensor(sa)
    d1, d2 = torch.empty(64, 64, dtype=torch.bfloat16), torch.empty(64, 64, dtype=torch.bfloat16)

    def run():
        with simulator.stream():  # two split-K GEMMs on one stream share its cached workspace
            gemm.launch_1d2d(cfg, a, sa, b, sb, d1, None, backend="sim")
            gemm.launch_1d2d(cfg, a, sa, b, sb, d2, None, backend="sim")

    try:
        report = _report(run)
    finally:
        split_k.clear()
    assert re.search(r"kernel 1 cta \d+ thread 0 \(warp 0 lane 0\) at kernels/fp8_gemm\.cuh:\d+: pdl: a plain write of "
                     r"4 bytes at global 0x[0-9a-f]+ conflicts with a plain (write|read) by kernel 0 cta \d+ thread \d+ "
                     r"\(warp \d+ lane \d+\) at split_k\.cuh:\d+", report), report[:3000]


def test_c_pdl_launch_that_never_waits_but_touches_predecessor_data(simulate, tmp_path, monkeypatch):
    mutated_headers(tmp_path, monkeypatch, "kernels/quant.cuh",
                    "    hal::grid_dependency_wait();\n    hal::launch_dependents();\n",
                    "    hal::launch_dependents();\n")
    dfg.set_pdl(True)
    weights = _weights()

    def run():
        with simulator.stream():
            _chain(_x(), weights)

    report = _report(run)
    # the second quantiser (kernel 2) reading the GEMM's output (kernel 1's TMA store of y)
    assert re.search(r"kernel 2 cta \d+ thread \d+ \(warp \d+ lane \d+\) at kernels/quant\.cuh:\d+.*: pdl: a plain read "
                     r"of \d+ bytes at global 0x[0-9a-f]+ conflicts with a TMA write by kernel 1 cta \d+ thread \d+",
                     report), report[:3000]
