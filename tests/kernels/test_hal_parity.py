"""The two hardware-layer implementations declare the same operations.

hal/ptx.cuh (sm_90a) and hal/sim.hpp (CPU simulator) must offer the same dfg::hal functions and templates:
kernel code calls only these, so a function missing from one build would make the "same source runs in
both" promise false (the other build would fail to compile the kernel, or a kernel would avoid the op).
"""

from __future__ import annotations

import re

from deep_fp8_gemm.runtime import paths

_DECL = re.compile(r"^\s*(?:DFG_DEVICE|inline)\s+[\w:<>*&\s]+?\b(\w+)\s*\(", re.M)
_STRUCT = re.compile(r"^\s*struct\s+(\w+)\s*[;{]", re.M)


def _hal_block(text: str) -> str:
    start = text.index("namespace hal {")
    end = text.index("}  // namespace hal", start)
    return text[start:end]


def _operations(header: str) -> set[str]:
    block = _hal_block((paths.include_dir() / "deep_fp8_gemm" / "hal" / header).read_text())
    return set(_DECL.findall(block)) | set(_STRUCT.findall(block))


def test_ptx_and_sim_declare_the_same_operations():
    ptx, sim = _operations("ptx.cuh"), _operations("sim.hpp")
    assert len(ptx) > 30, f"parser found too few operations in ptx.cuh: {sorted(ptx)}"
    assert ptx == sim, f"only in ptx.cuh: {sorted(ptx - sim)}; only in sim.hpp: {sorted(sim - ptx)}"
