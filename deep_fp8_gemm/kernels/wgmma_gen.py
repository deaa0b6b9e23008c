"""Generates the inline-PTX wgmma wrappers (FP8; BF16 and TF32, issue 41) for exactly the N a kernel uses.

Inline asm needs every accumulator register spelled out (N/2 of them), so instead of a hand-expanded
header with one specialisation per N (the reference design's 1,000-line MMA header), the JIT emits the
one a translation unit needs. The PTX string and operand order follow CuTe's
``MMA_64xNx32_F32E4M3E4M3_SS_TN`` (cute/arch/mma_sm90_gmma.hpp): scale-d as a run-time predicate,
scale-a and scale-b as the immediates 1.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def wgmma_fp8_wrapper(n: int) -> str:
    """C++ specialisation ``dfg::hal::WgmmaFp8<n>`` for ``wgmma.mma_async ... m64n{n}k32.f32.e4m3.e4m3``."""
    if n % 8 != 0 or not 8 <= n <= 256:
        raise ValueError(f"e4m3 wgmma N must be a multiple of 8 in [8, 256], got {n=}")
    return _wgmma_ss_wrapper(f"WgmmaFp8<{n}>", n, f"m64n{n}k32.f32.e4m3.e4m3", (1, 1))


@functools.lru_cache(maxsize=None)
def wgmma_fp8_rs_wrapper(n: int) -> str:
    """C++ specialisation ``dfg::hal::WgmmaFp8RegA<n>``: ``wgmma.mma_async ... m64n{n}k32.f32.e4m3.e4m3`` with A from
    four registers (the thread's A fragment, ``dfg::WgmmaFragmentA``) and B through its descriptor. Operand order and
    PTX string as CuTe's ``MMA_64xNx32_F32E4M3E4M3_RS_TN`` (cute/arch/mma_sm90_gmma.hpp): scale-d a run-time
    predicate, scale-a and scale-b the immediates 1 (an e4m3 register A takes no transpose immediate)."""
    if n % 8 != 0 or not 8 <= n <= 256:
        raise ValueError(f"e4m3 wgmma N must be a multiple of 8 in [8, 256], got {n=}")
    num_regs = n // 2
    d_list = ", ".join(f"%{i}" for i in range(num_regs))
    a_list = ", ".join(f"%{num_regs + i}" for i in range(4))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(num_regs))
    return (
        "namespace dfg::hal {\n"
        f"template <> struct WgmmaFp8RegA<{n}> {{\n"
        "    DFG_DEVICE static void mma(const u32 (&a)[4], u64 desc_b, float* d, bool scale_d) {\n"
        "        asm volatile(\n"
        '            "{\\n.reg .pred p;\\n"\n'
        f'            "setp.ne.b32 p, %{num_regs + 5}, 0;\\n"\n'
        f'            "wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "\n'
        f'            "{{{d_list}}}, {{{a_list}}}, %{num_regs + 4}, p, 1, 1;\\n}}\\n"\n'
        f"            : {outputs}\n"
        '            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(scale_d)));\n'
        "    }\n"
        "};\n"
        "}  // namespace dfg::hal\n"
    )


def _wgmma_ss_wrapper(struct: str, n: int, shape_types: str, immediates: tuple[int, ...]) -> str:
    num_regs = n // 2
    d_list = ", ".join(f"%{i}" for i in range(num_regs))
    outputs = ", ".join(f'"+f"(d[{i}])' for i in range(num_regs))
    imm = "".join(f", {v}" for v in immediates)
    return (
        "namespace dfg::hal {\n"
        f"template <> struct {struct} {{\n"
        "    DFG_DEVICE static void mma(u64 desc_a, u64 desc_b, float* d, bool scale_d) {\n"
        "        asm volatile(\n"
        '            "{\\n.reg .pred p;\\n"\n'
        f'            "setp.ne.b32 p, %{num_regs + 2}, 0;\\n"\n'
        f'            "wgmma.mma_async.sync.aligned.{shape_types} "\n'
        f'            "{{{d_list}}}, %{num_regs}, %{num_regs + 1}, p{imm};\\n}}\\n"\n'
        f"            : {outputs}\n"
        '            : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(scale_d)));\n'
        "    }\n"
        "};\n"
        "}  // namespace dfg::hal\n"
    )


@functools.lru_cache(maxsize=None)
def wgmma_bf16_wrapper(n: int, trans_a: int = 0, trans_b: int = 0) -> str:
    """C++ specialisation ``dfg::hal::WgmmaBf16<n, trans_a, trans_b>`` for ``wgmma.mma_async ...
    m64n{n}k16.f32.bf16.bf16`` (CuTe ``MMA_64xNx16_F32BF16BF16_SS``: scale-d a predicate, then imm-scale-a,
    imm-scale-b = 1, imm-trans-a, imm-trans-b; a transposed operand is MN-major)."""
    if n % 8 != 0 or not 8 <= n <= 256:
        raise ValueError(f"bf16 wgmma N must be a multiple of 8 in [8, 256], got {n=}")
    if trans_a not in (0, 1) or trans_b not in (0, 1):
        raise ValueError(f"trans_a and trans_b must be 0 or 1, got {trans_a=}, {trans_b=}")
    return _wgmma_ss_wrapper(f"WgmmaBf16<{n}, {trans_a}, {trans_b}>", n, f"m64n{n}k16.f32.bf16.bf16",
                             (1, 1, trans_a, trans_b))


@functools.lru_cache(maxsize=None)
def wgmma_tf32_wrapper(n: int) -> str:
    """C++ specialisation ``dfg::hal::WgmmaTf32<n>`` for ``wgmma.mma_async ... m64n{n}k8.f32.tf32.tf32`` (CuTe
    ``MMA_64xNx8_F32TF32TF32_SS_TN``: K-major only, no transpose immediates for 32-bit types)."""
    if n % 8 != 0 or not 8 <= n <= 256:
        raise ValueError(f"tf32 wgmma N must be a multiple of 8 in [8, 256], got {n=}")
    return _wgmma_ss_wrapper(f"WgmmaTf32<{n}>", n, f"m64n{n}k8.f32.tf32.tf32", (1, 1))
