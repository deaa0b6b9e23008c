"""MXFP4 expert weights for Hopper's FP8 tensor cores (issue 42): the stored form, its preparation, the exact
reference and a bit model of the in-register e2m1 -> e4m3 conversion.

A checkpoint's MXFP4 weight is ``w [G, N, K/2]`` int8 (two e2m1 codes per byte, the low nibble first: K index
``2j`` in bits 0-3, ``2j + 1`` in bits 4-7) with ``sf [G, N, K/32]`` float32 UE8M0 scales (positive powers of two,
one per row per 32 K). Hopper has no FP4 tensor core; e2m1 x 2^d is exactly an e4m3 value for every
``d`` in [-8, +6] (:func:`conversion_exact_shifts` proves it), so within a 128-K block a row's four sub-block scales
2^e_i fold into the operand when they span at most 14 binades: ``E = max_i e_i - 6`` is the block's exponent, the
sub-block shifts ``d_i = e_i - E`` lie in [-8, +6], and the K loop promotes once per 128 K by ``2^E x sA``.
A block spanning more than 14 binades is flagged: its operand takes shift 0 and each 32-K partial is promoted by its
own ``2^(E + d_i) x sA`` with ``E = max_i e_i`` (the per-32 path; its ``d_i`` in [-128, 0]).

The fold is exact in the operand values, not in the result: a 128-K block runs in one tensor-core chain (about 13
bits kept, aligned to the largest term), so a sub-block far below its neighbours loses bits as in the FP8 kernel.

Preparation stores the nibbles unchanged (the same tensor, not copied) plus per row: ``shift [G, N, K/32]`` int8,
``block_exp [G, N, K/128]`` int16 (E) and ``per32 [G, N, K/128]`` bool. Bytes beside the nibbles per row and 128 K:
4 (shifts) + 2 (E) + 1 (flag) = 7 against 64 of nibbles (11%; the checkpoint's fp32 scales are 16, dropped).
NOTES: measured on the 2-core development machine (torch 2.13 CPU, one thread): 16 experts of Kimi-K3's w13
(N 6144, K 3584; 168 MiB of nibbles) prepare in 0.31 s, ~4.9 s for a 256-expert layer, adding 18.4 MiB (0.109 of the
nibbles); the transient working set is a few int32 copies of the scales (one expert at a time would bound it).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .._core.checks import check_expected_m
from ..constants import GRAN_K
from ..env import simulate

#: K elements per MXFP4 scale (the recipe's ``recipe_b = (1, 32)``).
MX_GRAN_K = 32
#: Sub-blocks of 32 K per 128-K promotion block.
SUBBLOCKS = GRAN_K // MX_GRAN_K
#: The shifts e2m1 x 2^d keeps exact in e4m3 (min subnormal 2^-9 = 0.5 x 2^-8; max normal 448 >= 6 x 2^6 = 384).
SHIFT_MIN, SHIFT_MAX = -8, 6
#: A block whose sub-block exponents span more than this many binades takes the per-32 path.
MAX_FOLD_SPAN = SHIFT_MAX - SHIFT_MIN
#: e2m1 magnitudes by code & 7.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """float64 values of e2m1 codes (any integer dtype, low 4 bits used; code 8 is -0 and decodes to 0)."""
    c = codes.to(torch.int64) & 0xF
    mag = torch.tensor(E2M1_VALUES, dtype=torch.float64, device=codes.device)[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def unpack_nibbles(w: torch.Tensor) -> torch.Tensor:
    """``[..., K/2]`` int8 -> ``[..., K]`` int64 codes, the low nibble first."""
    b = w.to(torch.int64) & 0xFF
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def _ue8m0_exponents(sf: torch.Tensor, name: str) -> torch.Tensor:
    """int64 exponents of float32 UE8M0 scales; ``ValueError`` naming the first value that is not 2^e."""
    bits = sf.contiguous().view(torch.int32).to(torch.int64)
    bad = (bits <= 0) | ((bits & 0x7FFFFF) != 0) | ((bits >> 23) >= 255)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must hold UE8M0 scales (positive finite powers of two 2^-126..2^127 as float32), "
                         f"got {name}[{', '.join(map(str, idx))}]={float(sf[idx])!r}")
    return (bits >> 23) - 127


def check_mxfp4_weights(w: object, sf: object, name: str = "rhs") -> tuple[int, int, int]:
    """Checks a checkpoint's ``(w [G, N, K/2] int8/uint8, sf [G, N, K/32] float32)``; returns ``(G, N, K)``."""
    if not isinstance(w, torch.Tensor) or not isinstance(sf, torch.Tensor):
        raise TypeError(f"{name} must be a pair of tensors (weights, scales), got "
                        f"({type(w).__name__}, {type(sf).__name__})")
    if w.dtype not in (torch.int8, torch.uint8) or w.dim() != 3:
        raise TypeError(f"{name}[0] must be [G, N, K/2] int8 (two e2m1 codes per byte), got {w.dtype} "
                        f"of shape {tuple(w.shape)}")
    if sf.dtype != torch.float32 or sf.dim() != 3:
        raise TypeError(f"{name}[1] must be [G, N, K/32] float32 UE8M0 scales, got {sf.dtype} of shape "
                        f"{tuple(sf.shape)}")
    g, n, half_k = w.shape
    k = 2 * half_k
    if k % GRAN_K != 0 or k == 0:
        raise ValueError(f"{name}[0]: K = 2 * {half_k} = {k} must be a positive multiple of {GRAN_K}")
    if tuple(sf.shape) != (g, n, k // MX_GRAN_K):
        raise ValueError(f"{name}[1] must have shape [G, N, K/32] = {(g, n, k // MX_GRAN_K)}, got {tuple(sf.shape)}")
    if w.device != sf.device:
        raise ValueError(f"{name}: weights on {w.device}, scales on {sf.device}")
    return g, n, k


@dataclasses.dataclass(frozen=True)
class PreparedMxfp4:
    """MXFP4 expert weights in the stored form the kernel reads (see the module docstring).

    ``nibbles [G, N, K/2]`` int8: the checkpoint's tensor itself; ``shift [G, N, K/32]`` int8 (d_i = e_i - E: the
    operand's shift on a folded block, the 32-K partial's scale offset on a per-32 block); ``block_exp
    [G, N, K/128]`` int16 (E: ``max e - 6`` folded, ``max e`` per-32); ``per32 [G, N, K/128]`` bool.
    """

    nibbles: torch.Tensor
    shift: torch.Tensor
    block_exp: torch.Tensor
    per32: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        g, n, half_k = self.nibbles.shape
        return g, n, 2 * half_k

    def extra_bytes(self) -> int:
        """Resident bytes beside the nibbles."""
        return sum(t.numel() * t.element_size() for t in (self.shift, self.block_exp, self.per32))


def prepare_mxfp4_weights(w: torch.Tensor, sf: torch.Tensor, *, max_span: int = MAX_FOLD_SPAN) -> PreparedMxfp4:
    """A checkpoint's ``(w [G, N, K/2] int8, sf [G, N, K/32] float32 UE8M0)`` -> :class:`PreparedMxfp4`.

    The nibbles are not copied. Per row and 128-K block with sub-block exponents e_0..e_3: when
    ``max e - min e <= max_span`` (14 by default, the widest span e4m3 represents exactly) ``E = max e - 6`` and
    ``shift = e - E`` (in [-8, +6]); otherwise the block is flagged ``per32``, ``E = max e`` and ``shift = e - E``
    (``ValueError`` naming the block when a shift is below -128: a sub-block 2^-128 below its block's largest).
    """
    g, n, k = check_mxfp4_weights(w, sf)
    if isinstance(max_span, bool) or not isinstance(max_span, int) or not 0 <= max_span <= MAX_FOLD_SPAN:
        raise ValueError(f"max_span must be an int in [0, {MAX_FOLD_SPAN}], got max_span={max_span!r}")
    e = _ue8m0_exponents(sf, "rhs[1]").to(torch.int32).view(g, n, k // GRAN_K, SUBBLOCKS)
    hi, lo = e.amax(dim=-1), e.amin(dim=-1)
    per32 = (hi - lo) > max_span
    if bool(((hi - lo) > 128).any()):
        idx = tuple(int(i) for i in ((hi - lo) > 128).nonzero()[0])
        raise ValueError(f"rhs[1]: the scales of 128-K block {idx} (expert, row, block) span {int(hi[idx] - lo[idx])} "
                         f"binades; at most 128 are stored")
    block_exp = torch.where(per32, hi, hi - SHIFT_MAX)
    shift = e - block_exp.unsqueeze(-1)
    return PreparedMxfp4(nibbles=w.view(torch.int8), shift=shift.to(torch.int8).view(g, n, k // MX_GRAN_K),
                         block_exp=block_exp.to(torch.int16), per32=per32)


def dequantize_prepared(p: PreparedMxfp4) -> torch.Tensor:
    """float64 ``[G, N, K]`` weights the prepared form records (equal to the checkpoint's values exactly)."""
    g, n, k = p.shape
    vals = decode_e2m1(unpack_nibbles(p.nibbles)).view(g, n, k // MX_GRAN_K, MX_GRAN_K)
    exp = p.block_exp.to(torch.int64).repeat_interleave(SUBBLOCKS, dim=-1) + p.shift.to(torch.int64)
    return (vals * torch.exp2(exp.to(torch.float64)).unsqueeze(-1)).view(g, n, k)


def masked_gemm_reference(a: torch.Tensor, sa: torch.Tensor, p: PreparedMxfp4, masked_m: torch.Tensor
                          ) -> torch.Tensor:
    """float64 ``D [G, m_max, N]`` of FP8 activations ``a [G, m_max, K]`` (``sa [G, m_max, K/128]`` fp32) times the
    prepared weights, following the path each block records: a folded block is one 128-K sum of
    ``a x (e2m1 x 2^d)`` scaled by ``2^E x sa``; a per-32 block is four 32-K sums of ``a x e2m1`` each scaled by
    ``2^(E + d_i) x sa``.
    Rows at or past ``masked_m[g]`` are zero."""
    g, n, k = p.shape
    m_max = a.shape[1]
    kb = k // GRAN_K
    av = a.to(torch.float64).view(g, m_max, kb, SUBBLOCKS, MX_GRAN_K)
    codes = decode_e2m1(unpack_nibbles(p.nibbles)).view(g, n, kb, SUBBLOCKS, MX_GRAN_K)
    shift = torch.exp2(p.shift.to(torch.float64)).view(g, n, kb, SUBBLOCKS)
    block = torch.exp2(p.block_exp.to(torch.float64))
    per32 = p.per32.unsqueeze(-1)
    # The operand the tensor core reads: e2m1 x 2^d folded, e2m1 alone on a per-32 block.
    operand = codes * torch.where(per32, torch.ones_like(shift), shift).unsqueeze(-1)
    part = torch.einsum("gmbsk,gnbsk->gmnbs", av, operand)  # [g, m, n, kb, 4]: the 32-K partial sums
    fold_sum = part.sum(-1) * block.unsqueeze(1)
    per32_sum = (part * (shift * block.unsqueeze(-1)).unsqueeze(1)).sum(-1)
    blocks = torch.where(p.per32.unsqueeze(1), per32_sum, fold_sum)  # [g, m, n, kb]
    d = (blocks * sa.to(torch.float64).unsqueeze(2)).sum(-1)
    rows = torch.arange(m_max, device=a.device).view(1, m_max, 1)
    return torch.where(rows < masked_m.to(a.device).view(g, 1, 1), d, torch.zeros((), dtype=torch.float64))


# ---------------------------------------------------------------------------------------------- conversion model
def _e4m3_bits(value: float) -> int | None:
    """The e4m3fn byte of an exactly representable non-negative value, else None."""
    byte = int(torch.tensor(value, dtype=torch.float64).to(torch.float8_e4m3fn).view(torch.uint8))
    back = float(torch.tensor(byte, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64))
    return byte if back == value else None


def lookup_table(shift: int) -> tuple[int, int]:
    """The per-(row, sub-block) table of shift ``d``: the e4m3 bytes of ``E2M1_VALUES[c] x 2^d`` for c = 0..7 as
    two u32 (bytes 0-3, 4-7), the operands of one ``prmt``. ``ValueError`` for a shift e4m3 cannot hold."""
    if not SHIFT_MIN <= shift <= SHIFT_MAX:
        raise ValueError(f"shift must be in [{SHIFT_MIN}, {SHIFT_MAX}], got shift={shift}")
    b = [_e4m3_bits(v * 2.0 ** shift) for v in E2M1_VALUES]
    return b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24


def conversion_exact_shifts() -> tuple[int, ...]:
    """Every shift d for which all eight e2m1 magnitudes x 2^d are e4m3 values (proof by enumeration)."""
    return tuple(d for d in range(-20, 20) if all(_e4m3_bits(v * 2.0 ** d) is not None for v in E2M1_VALUES))


def prmt(a: int, b: int, selector: int) -> int:
    """PTX ``prmt.b32`` default mode: byte i of the result is byte ``selector[4i+2:4i]`` of {b, a}, sign-replicated
    when ``selector`` bit 4i+3 is set."""
    pool = (a & 0xFFFFFFFF) | (b & 0xFFFFFFFF) << 32
    out = 0
    for i in range(4):
        s = selector >> (4 * i) & 0xF
        byte = pool >> (8 * (s & 7)) & 0xFF
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


#: ALU instructions per packed u32 (8 codes -> 8 e4m3 bytes) of :func:`convert_u32`, as the kernel issues them
#: (include/deep_fp8_gemm/mxfp4.cuh ``convert_word``): 1 LOP3 (the codes' magnitudes, ``& 0x77777777``), 1 SHF (the
#: high half's selectors), 2 PRMT (magnitudes through the table), 1 SHL (``raw << 4``), 2 PRMT (each code's sign bit
#: to bit 7 of its byte), 2 LOP3 (``mag | (signs & 0x80808080)``) = 9, i.e. 72 per thread per 64-row wave and 128-K
#: block (two rows x four sub-blocks), plus the fragment's loads and the tables' loads. A model count: the audit
#: measures the compiled loop.
CONVERT_OPS_PER_U32 = 9

#: PRMT selectors moving each code's sign bit (bit 3 of its nibble) to bit 7 of its output byte: over {raw, raw << 4},
#: byte 2i of the result is byte i of ``raw << 4`` (bit 7 = bit 3 of the low nibble of raw byte i) and byte 2i + 1 is
#: raw byte i itself (bit 7 = the high nibble's sign); the low half's four codes, then the high half's.
SIGN_SELECTORS = (0x1504, 0x3726)


def convert_u32(packed: int, lut: tuple[int, int]) -> tuple[int, int]:
    """The register conversion of one u32 of eight e2m1 codes (low nibble first) into two u32 of e4m3 bytes (K
    order kept; the low half's four codes into the first), through the row's sub-block table ``lut``
    (:func:`lookup_table`): magnitudes by ``prmt`` over the codes' low three bits (the selector's bit 3 clear: no
    sign replication); each code's sign moved to bit 7 of its byte by a ``prmt`` over ``{raw, raw << 4}``
    (:data:`SIGN_SELECTORS`) and OR'd in under the mask 0x80808080. The e4m3 magnitudes have bit 7 clear, so the
    OR is the sign."""
    packed &= 0xFFFFFFFF
    mags = packed & 0x77777777
    shifted = (packed << 4) & 0xFFFFFFFF
    out = []
    for sel, sign_sel in ((mags, SIGN_SELECTORS[0]), (mags >> 16, SIGN_SELECTORS[1])):
        mag = prmt(lut[0], lut[1], sel)
        signs = prmt(packed, shifted, sign_sel)
        out.append(mag | (signs & 0x80808080))
    return out[0], out[1]


def convert_rows(nibbles: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Model of the whole conversion: ``nibbles [R, 16]`` uint8 (32 codes of one sub-block per row) and
    ``shifts [R]`` -> ``[R, 32]`` uint8 e4m3 bytes, u32 by u32 through :func:`convert_u32`."""
    words = np.ascontiguousarray(nibbles, dtype=np.uint8).view("<u4")
    out = np.empty((words.shape[0], words.shape[1] * 2), dtype="<u4")
    for r in range(words.shape[0]):
        lut = lookup_table(int(shifts[r]))
        for j in range(words.shape[1]):
            out[r, 2 * j], out[r, 2 * j + 1] = convert_u32(int(words[r, j]), lut)
    return out.view(np.uint8)


# ---------------------------------------------------------------------------------------------- register A fragment
def fragment_a_row(warp: int, lane: int, j: int) -> int:
    """``dfg::WgmmaFragmentA::row`` (include/deep_fp8_gemm/mma.cuh): the M row of byte b of register a[j]."""
    return 16 * warp + lane // 4 + 8 * (j % 2)


def fragment_a_k(lane: int, j: int, b: int) -> int:
    """``dfg::WgmmaFragmentA::k``: the K index (within a k32 wgmma) of byte b of register a[j]."""
    return 4 * (lane % 4) + b + 16 * (j // 2)


def fragment_a_words(sub_block: np.ndarray, warp: int, lane: int) -> tuple[int, int]:
    """The two u32 of packed codes thread (warp, lane) converts for one k32 wgmma: ``sub_block [64, 16]`` uint8
    holds the 64 M rows' 32 codes each (one sub-block, nibbles as stored). Word i is row ``16 warp + lane / 4 + 8 i``:
    low half the bytes of K 4q..4q+3 (q = lane % 4), high half those of K 16+4q..16+4q+3, so that
    :func:`convert_u32` yields a[i] (low half) and a[i + 2] (high half); both halves share the row's sub-block shift,
    so one table serves the word."""
    q = lane % 4
    words = []
    for i in range(2):
        row = sub_block[16 * warp + lane // 4 + 8 * i]
        lo = int(row[2 * q]) | int(row[2 * q + 1]) << 8
        hi = int(row[8 + 2 * q]) | int(row[8 + 2 * q + 1]) << 8
        words.append(lo | hi << 16)
    return words[0], words[1]


def fragment_a_registers(sub_block: np.ndarray, shifts: np.ndarray, warp: int, lane: int) -> tuple[int, ...]:
    """a[0..3] of thread (warp, lane) for one k32 wgmma: ``shifts [64]`` the rows' shifts for this sub-block."""
    w0, w1 = fragment_a_words(sub_block, warp, lane)
    r0 = 16 * warp + lane // 4
    a0, a2 = convert_u32(w0, lookup_table(int(shifts[r0])))
    a1, a3 = convert_u32(w1, lookup_table(int(shifts[r0 + 8])))
    return a0, a1, a2, a3


# ---------------------------------------------------------------------------------------------- the op (CPU path)
def m_grouped_gemm_fp8_fp4_bf16_nt_masked(a: tuple[torch.Tensor, torch.Tensor],
                                           b: tuple[torch.Tensor, torch.Tensor] | PreparedMxfp4,
                                           d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    """``d[g, :masked_m[g]] = (a[g] * sa[g]) . W_g^T`` in bf16 for MXFP4 experts.

    ``a = (e4m3 [G, m_max, K], sa fp32 [G, m_max, K/128])`` (1x128 per-token scales, row-major); ``b`` a
    checkpoint's ``(int8 [G, N, K/2], fp32 UE8M0 [G, N, K/32])`` (prepared on every call) or a
    :class:`PreparedMxfp4`; ``d`` bf16 ``[G, m_max, N]`` written in place (rows past ``masked_m[g]`` untouched);
    ``masked_m`` int32 ``[G]``; ``expected_m`` a positive int hint. CPU tensors run the float64 reference of the
    path the prepared weights record; on an sm_90 GPU, or CPU tensors under ``DFG_SIMULATE=1``, the MXFP4 kernel
    (include/deep_fp8_gemm/kernels/mxfp4_gemm.cuh: swap-AB, the weights converted to e4m3 in registers), which needs
    N a multiple of 64 and ``d`` contiguous."""
    p = b if isinstance(b, PreparedMxfp4) else prepare_mxfp4_weights(*b)
    g, n, k = p.shape
    if not isinstance(a, (tuple, list)) or len(a) != 2 or not all(isinstance(t, torch.Tensor) for t in a):
        raise TypeError(f"a must be a pair of tensors (e4m3 [G, m_max, K], fp32 [G, m_max, K/128]), got {a!r:.80}")
    x, sa = a
    if x.dtype != torch.float8_e4m3fn or x.dim() != 3 or x.shape[0] != g or x.shape[2] != k:
        raise ValueError(f"a[0] must be float8_e4m3fn [G, m_max, K] with G={g}, K={k}, got {x.dtype} "
                         f"{tuple(x.shape)}")
    m_max = x.shape[1]
    if sa.dtype != torch.float32 or tuple(sa.shape) != (g, m_max, k // GRAN_K):
        raise ValueError(f"a[1] must be float32 [G, m_max, K/128] = {(g, m_max, k // GRAN_K)}, got {sa.dtype} "
                         f"{tuple(sa.shape)}")
    if not isinstance(d, torch.Tensor) or d.dtype != torch.bfloat16 or tuple(d.shape) != (g, m_max, n):
        raise ValueError(f"d must be bfloat16 [G, m_max, N] = {(g, m_max, n)}, got "
                         f"{getattr(d, 'dtype', type(d).__name__)} {tuple(getattr(d, 'shape', ()))}")
    if not isinstance(masked_m, torch.Tensor) or masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (g,):
        raise ValueError(f"masked_m must be int32 [G] = [{g}], got {getattr(masked_m, 'dtype', type(masked_m))} "
                         f"{tuple(getattr(masked_m, 'shape', ()))}")
    check_expected_m(expected_m)
    bad = (masked_m < 0) | (masked_m > m_max)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(f"masked_m[{i}]={int(masked_m[i])} must be in [0, m_max={m_max}]")
    if x.device.type != "cpu" or simulate():
        _run_kernel(x, sa, p, d, masked_m, expected_m)
        return
    ref = masked_gemm_reference(x, sa, p, masked_m).to(torch.bfloat16)
    rows = torch.arange(m_max).view(1, m_max, 1) < masked_m.view(g, 1, 1)
    d.copy_(torch.where(rows, ref, d))


def kernel_metadata(p: PreparedMxfp4) -> torch.Tensor:
    """The kernel's per-row records of ``p`` (kernels/mxfp4_gemm.py ``kernel_metadata``, 8 bytes per row and 128 K),
    built once per prepared weight and kept beside it."""
    from ..kernels import mxfp4_gemm

    meta = _KERNEL_METADATA.get(id(p))
    if meta is None or meta[0] is not p:
        meta = (p, mxfp4_gemm.kernel_metadata(p.shift, p.block_exp, p.per32))
        _KERNEL_METADATA[id(p)] = meta
    return meta[1]


#: id(prepared) -> (prepared, metadata): the prepared form is a frozen dataclass; the entry keeps it alive, so the
#: id is not reused while the entry exists.
_KERNEL_METADATA: dict[int, tuple[PreparedMxfp4, torch.Tensor]] = {}


def _run_kernel(x: torch.Tensor, sa: torch.Tensor, p: PreparedMxfp4, d: torch.Tensor, masked_m: torch.Tensor,
                expected_m: int) -> None:
    """The MXFP4 kernel on checked tensors (CUDA on an sm_90 GPU, the simulator for CPU tensors)."""
    from ..kernels import mxfp4_gemm
    from ..runtime.target import backend_of

    g, n, k = p.shape
    if n % 64 or not d.is_contiguous() or not x.is_contiguous():
        raise ValueError(f"the MXFP4 kernel needs N a multiple of 64 and contiguous a[0] and d, got N={n}, "
                         f"a[0] contiguous {x.is_contiguous()}, d contiguous {d.is_contiguous()}")
    backend = backend_of(x.device, "gemm")
    config = mxfp4_gemm.pick_config(n, k, g, expected_m, mxfp4_gemm.num_ctas(backend))
    mxfp4_gemm.launch(config, x, sa.contiguous(), p.nibbles.contiguous(), kernel_metadata(p), d,
                      masked_m.to(x.device), backend)
