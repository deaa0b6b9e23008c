"""MXFP4 expert weights for Hopper's FP8 tensor cores (issues 42, 43): the stored form, its preparation, the exact
reference, the bit models of the in-register e2m1 -> e4m3 conversion, and the row maps of the layouts (the ops:
:mod:`deep_fp8_gemm.ops.mxfp4`).

A checkpoint's MXFP4 weight is ``w [G, N, K/2]`` int8 (two e2m1 codes per byte, the low nibble first: K index
``2j`` in bits 0-3, ``2j + 1`` in bits 4-7) with ``sf [G, N, K/32]`` float32 UE8M0 scales (positive powers of two,
one per row per 32 K). Hopper has no FP4 tensor core; e2m1 x 2^d is exactly an e4m3 value for every
``d`` in [-8, +6] (:func:`conversion_exact_shifts` proves it), so within a 128-K block a row's four sub-block scales
2^e_s fold into the operand when they span at most 14 binades: ``E = max(max_s e_s - 6, -126)`` is the block's
exponent, the sub-block shifts ``d_s = e_s - E`` lie in [-8, +6], and the K loop promotes once per 128 K by
``2^E x sA``. A 64-row wave with a block spanning more than 14 binades takes the per-32 path in that 128-K block
(all its 64 rows: the warpgroup issues one path per wave): its operand is e2m1 alone and each 32-K partial is
promoted by its own ``2^e_s x sA``.

The fold is exact in the operand values, not in the result: a 128-K block runs in one tensor-core chain (about 13
bits kept, aligned to the largest term), so a sub-block far below its neighbours loses bits as in the FP8 kernel.

The stored form (:class:`PreparedMxfp4`) is what the kernel's TMA loads: the codes, unchanged in value, permuted into
the math threads' fragment order per (expert, 128-K block, 64-row wave), and per wave and block a 272-byte record
(per row a u32: the two pair-table indices of its folded shifts and 2^E's exponent bits, or its four UE8M0 exponents
on a per-32 wave; the wave's flag). 64 + 4.25 bytes per row and 128 K against the checkpoint's 64 + 4 (codes + UE8M0
bytes): the kernel reads 0.4% more than the checkpoint's bytes.
NOTES: measured on the 2-core development machine (torch 2.13 CPU): 16 experts of Kimi-K3's w13 (N 6144, K 3584;
168 MiB of codes) prepare in 0.83 s (~13 s for a 256-expert layer), one expert's codes transient at a time;
``in_place=True`` leaves no second copy even while the caller holds the checkpoint tensor.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..constants import GRAN_K

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


#: Weight rows per wave (the wgmma M side of one warpgroup) and the kernel's stored-form units per (expert, 128-K
#: block, wave): the packed codes in fragment order and the wave's metadata (include/deep_fp8_gemm/mxfp4.cuh).
WAVE_ROWS = 64
TILE_BYTES = WAVE_ROWS * GRAN_K // 2  # 4096
META_WORD_BYTES = 256  # 64 rows x u32, in pair order (r0, r0 + 8)
META_BYTES = META_WORD_BYTES + 16  # + the wave's per-32 flag (u32) and 12 bytes of padding (TMA boxes: 16-byte rows)
#: Shifts a folded sub-block's table takes (d + 8 in 0..14) and the pair tables' index: 15 (d_a + 8) + (d_b + 8).
NUM_SHIFTS = SHIFT_MAX - SHIFT_MIN + 1
#: The biased exponent byte (UE8M0: 2^(e - 127)); a folded row's E byte is >= 1, a per-32 wave's E bytes are 0.
EXP_BIAS = 127
MIN_EXP = -126  # the smallest UE8M0 scale a float32 holds as a normal number (2^-127 is refused)


def _thread_rows() -> tuple[np.ndarray, np.ndarray]:
    """``(r0 [128], q [128])``: thread t = 32 warp + lane of the math warpgroup holds rows r0 and r0 + 8 of every
    wave, and K 4q.. / 16 + 4q.. of every k32 sub-block (dfg::WgmmaFragmentA)."""
    t = np.arange(128)
    return 16 * (t // 32) + (t % 32) // 4, t % 4


def _pair_rows() -> np.ndarray:
    """``[64]``: the wave's rows in metadata order: pair p = 8 warp + lane / 4 is (r0, r0 + 8) of the quad of threads
    holding them, so that one 8-byte load gives a thread both rows' words (the quad's four lanes read the same
    address: a broadcast)."""
    p = np.arange(32)
    r0 = 16 * (p // 8) + p % 8
    return np.stack((r0, r0 + 8), -1).reshape(-1)


def _tile_gather() -> np.ndarray:
    """``[2048]``: for each u16 of a wave's 4096-byte tile, its index in the wave's ``[64 rows, 32 u16]`` codes of one
    128-K block (u16 i of a row = codes 4i..4i+3). Tile byte ``h 2048 + 16 t + 4 j + 2 p``: half h holds sub-blocks
    2h, 2h + 1; word j = (sub-block 2h + j / 2, row r0 + 8 (j % 2)); u16 p = the codes of K 4q.. (p = 0) or
    16 + 4q.. (p = 1) of that sub-block, so that a thread's two 16-byte loads hold its eight words in
    ``convert_word`` order and a warp's loads are 512 contiguous bytes (conflict-free)."""
    r0, q = _thread_rows()
    h, t, j, p = np.meshgrid(np.arange(2), np.arange(128), np.arange(4), np.arange(2), indexing="ij")
    s = 2 * h + j // 2
    row = r0[t] + 8 * (j % 2)
    return (row * 32 + 8 * s + 4 * p + q[t]).reshape(-1)


_GATHER = torch.from_numpy(_tile_gather())
_SCATTER = torch.from_numpy(np.argsort(_tile_gather()))


@dataclasses.dataclass(frozen=True)
class PreparedMxfp4:
    """MXFP4 expert weights in the stored form the kernel reads (include/deep_fp8_gemm/mxfp4.cuh has the byte maps).

    ``tiles [G, K/128, N/64, 4096]`` uint8: the checkpoint's e2m1 codes, unchanged in value, permuted in 16-bit units
    (four codes) into each math thread's fragment order per (expert, 128-K block, 64-row wave) (:func:`_tile_gather`);
    ``meta [G, K/128, N/64, 272]`` uint8 per wave: 64 x u32 in :func:`_pair_rows` order, then the wave's per-32 flag
    (u32, 1: per-32) and 12 zero bytes. A folded row's word: bits 0-7 the pair-table index ``15 (d_0 + 8) + (d_1 + 8)``
    of sub-blocks 0 and 1, bits 8-15 that of sub-blocks 2 and 3, bits 23-30 ``E + 127`` (>= 1: the float32 bits of
    2^E under the mask 0x7F800000); a per-32 wave's words: byte s = the biased exponent ``e_s + 127``.
    ``wave_per32 [G, N/64]`` uint8: 1 where some 128-K block of that wave takes the per-32 path (the kernel's tile
    dispatch). 4096 + 272 bytes per 64 rows and 128 K: per row the checkpoint's 64 + 4 bytes (codes + UE8M0 scales)
    plus 0.25.
    """

    tiles: torch.Tensor
    meta: torch.Tensor
    wave_per32: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        g, kb, waves, _ = self.tiles.shape
        return g, waves * WAVE_ROWS, kb * GRAN_K

    def extra_bytes(self) -> int:
        """Resident bytes beside the codes (the metadata and the wave flags)."""
        return sum(t.numel() * t.element_size() for t in (self.meta, self.wave_per32))

    def codes(self) -> torch.Tensor:
        """``[G, N, K/2]`` int8: the codes back in the checkpoint's order (a copy)."""
        g, n, k = self.shape
        u16 = self.tiles.view(torch.int16).reshape(g, k // GRAN_K, n // WAVE_ROWS, 2048)[..., _SCATTER]
        return u16.view(g, k // GRAN_K, n // WAVE_ROWS, WAVE_ROWS, 32).permute(0, 2, 3, 1, 4).reshape(
            g, n, k // 4).contiguous().view(torch.int8)

    def paths(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(per32 [G, N, K/128] bool, block_exp [G, N, K/128] int64, shift [G, N, K/32] int64)`` as the metadata
        records them: a folded block's E and shifts d_s (operand e2m1 x 2^d_s, sum x 2^E); a per-32 block (its whole
        wave) E = 0 and shift = e_s (operand e2m1, 32-K partial s x 2^e_s)."""
        g, n, k = self.shape
        kb, waves = k // GRAN_K, n // WAVE_ROWS
        order = torch.argsort(torch.from_numpy(_pair_rows())).to(self.meta.device)
        b = self.meta[..., :META_WORD_BYTES].reshape(g, kb, waves, WAVE_ROWS, 4).to(torch.int64)[..., order, :]
        flag = self.meta[..., META_WORD_BYTES].to(torch.bool)  # [g, kb, waves]
        per32 = flag.unsqueeze(-1).expand(g, kb, waves, WAVE_ROWS)
        word = b[..., 0] | b[..., 1] << 8 | b[..., 2] << 16 | b[..., 3] << 24
        pairs = torch.stack((b[..., 0] // NUM_SHIFTS, b[..., 0] % NUM_SHIFTS, b[..., 1] // NUM_SHIFTS,
                             b[..., 1] % NUM_SHIFTS), -1) + SHIFT_MIN
        shift = torch.where(per32.unsqueeze(-1), b - EXP_BIAS, pairs)
        block_exp = torch.where(per32, torch.zeros_like(word), ((word >> 23) & 0xFF) - EXP_BIAS)
        as_rows = lambda t: t.permute(0, 2, 3, 1, *range(4, t.dim())).reshape(g, n, kb, *t.shape[4:])
        return as_rows(per32), as_rows(block_exp), as_rows(shift).reshape(g, n, k // MX_GRAN_K)


def prepare_mxfp4_weights(w: torch.Tensor, sf: torch.Tensor, *, max_span: int = MAX_FOLD_SPAN,
                          in_place: bool = False) -> PreparedMxfp4:
    """A checkpoint's ``(w [G, N, K/2] int8, sf [G, N, K/32] float32 UE8M0)`` -> :class:`PreparedMxfp4`.

    Per row and 128-K block with sub-block exponents e_0..e_3: when ``max e - min e <= max_span`` (14 by default, the
    widest span e4m3 represents exactly) the block folds: ``E = max(max e - 6, -126)`` (a normal float32 2^E) and
    ``d_s = e_s - E`` in [-8, +6]. A 64-row wave with a wider block anywhere in a 128-K block takes the per-32 path
    there for all its 64 rows (the warpgroup issues one path per wave): operand e2m1, each 32-K partial scaled by
    2^e_s. N must be a multiple of 64 (the waves). The codes are copied into fragment order one expert at a time;
    ``in_place=True`` writes them into ``w``'s own storage instead (``w`` then holds the stored form, not the
    checkpoint's order), so that a caller holding ``w`` does not keep two copies.
    """
    g, n, k = check_mxfp4_weights(w, sf)
    if isinstance(max_span, bool) or not isinstance(max_span, int) or not 0 <= max_span <= MAX_FOLD_SPAN:
        raise ValueError(f"max_span must be an int in [0, {MAX_FOLD_SPAN}], got max_span={max_span!r}")
    if n % WAVE_ROWS:
        raise ValueError(f"rhs[0]: N = {n} must be a multiple of {WAVE_ROWS} (the MXFP4 kernel's 64-row waves)")
    if in_place and not w.is_contiguous():
        raise ValueError("rhs[0] must be contiguous to be prepared in_place")
    kb, waves = k // GRAN_K, n // WAVE_ROWS
    e = _ue8m0_exponents(sf, "rhs[1]").view(g, n, kb, SUBBLOCKS)
    hi, lo = e.amax(dim=-1), e.amin(dim=-1)
    wide = (hi - lo) > max_span  # [g, n, kb]
    wave32 = wide.view(g, waves, WAVE_ROWS, kb).any(dim=2)  # [g, waves, kb]
    per32 = wave32.unsqueeze(2).expand(g, waves, WAVE_ROWS, kb).reshape(g, n, kb)
    block_exp = (hi - SHIFT_MAX).clamp(min=MIN_EXP)
    d = e - block_exp.unsqueeze(-1) - SHIFT_MIN  # d + 8 in 0..14 on a folded block
    folded = (NUM_SHIFTS * d[..., 0] + d[..., 1]) | (NUM_SHIFTS * d[..., 2] + d[..., 3]) << 8 | (
        block_exp + EXP_BIAS) << 23
    biased = e + EXP_BIAS
    per32_word = biased[..., 0] | biased[..., 1] << 8 | biased[..., 2] << 16 | biased[..., 3] << 24
    word = torch.where(per32, per32_word, folded).to(torch.int64)  # [g, n, kb]
    rows = torch.from_numpy(_pair_rows()).to(w.device)  # per wave: the rows in metadata order
    word_w = word.view(g, waves, WAVE_ROWS, kb)[:, :, rows].permute(0, 3, 1, 2)  # [g, kb, waves, 64]
    word_bytes = torch.stack([(word_w >> (8 * i)) & 0xFF for i in range(4)], -1).reshape(g, kb, waves, META_WORD_BYTES)
    tail = torch.zeros(g, kb, waves, META_BYTES - META_WORD_BYTES, dtype=torch.int64, device=w.device)
    tail[..., 0] = wave32.permute(0, 2, 1).to(torch.int64)
    meta = torch.cat((word_bytes, tail), dim=-1).to(torch.uint8)
    tiles = w.view(torch.uint8) if in_place else torch.empty(g, kb, waves, TILE_BYTES, dtype=torch.uint8,
                                                              device=w.device)
    for x in range(g):  # one expert at a time: the transient copy is one expert's codes
        u16 = w[x].contiguous().view(torch.int16).view(waves, WAVE_ROWS, kb, 32).permute(2, 0, 1, 3)
        fragment = u16.reshape(kb, waves, 2048)[..., _GATHER.to(w.device)].contiguous()
        tiles.view(g, -1)[x].copy_(fragment.view(torch.uint8).view(-1))
    tiles = tiles.view(g, kb, waves, TILE_BYTES)
    return PreparedMxfp4(tiles=tiles, meta=meta.contiguous(), wave_per32=wave32.any(dim=-1).to(torch.uint8))


def dequantize_prepared(p: PreparedMxfp4) -> torch.Tensor:
    """float64 ``[G, N, K]`` weights the prepared form records (equal to the checkpoint's values exactly)."""
    g, n, k = p.shape
    per32, block_exp, shift = p.paths()
    vals = decode_e2m1(unpack_nibbles(p.codes())).view(g, n, k // MX_GRAN_K, MX_GRAN_K)
    exp = block_exp.repeat_interleave(SUBBLOCKS, dim=-1) + shift
    return (vals * torch.exp2(exp.to(torch.float64)).unsqueeze(-1)).view(g, n, k)


def masked_gemm_reference(a: torch.Tensor, sa: torch.Tensor, p: PreparedMxfp4, masked_m: torch.Tensor
                          ) -> torch.Tensor:
    """float64 ``D [G, m_max, N]`` of FP8 activations ``a [G, m_max, K]`` (``sa [G, m_max, K/128]`` fp32) times the
    prepared weights, following the path each block records (:meth:`PreparedMxfp4.paths`): a folded block is one
    128-K sum of ``a x (e2m1 x 2^d)`` scaled by ``2^E x sa``; a per-32 block is four 32-K sums of ``a x e2m1`` each
    scaled by ``2^e_s x sa``. Rows at or past ``masked_m[g]`` are zero."""
    g, n, k = p.shape
    m_max = a.shape[1]
    kb = k // GRAN_K
    per32, block_exp, shift = p.paths()
    av = a.to(torch.float64).view(g, m_max, kb, SUBBLOCKS, MX_GRAN_K)
    codes = decode_e2m1(unpack_nibbles(p.codes())).view(g, n, kb, SUBBLOCKS, MX_GRAN_K)
    scale = torch.exp2(shift.to(torch.float64)).view(g, n, kb, SUBBLOCKS)
    block = torch.exp2(block_exp.to(torch.float64))
    # The operand the tensor core reads: e2m1 x 2^d folded, e2m1 alone on a per-32 block.
    operand = codes * torch.where(per32.unsqueeze(-1), torch.ones_like(scale), scale).unsqueeze(-1)
    part = torch.einsum("gmbsk,gnbsk->gmnbs", av, operand)  # [g, m, n, kb, 4]: the 32-K partial sums
    fold_sum = part.sum(-1) * block.unsqueeze(1)
    per32_sum = (part * scale.unsqueeze(1)).sum(-1)
    blocks = torch.where(per32.unsqueeze(1), per32_sum, fold_sum)  # [g, m, n, kb]
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


# ---------------------------------------------------------------------------------------------- layouts
def contiguous_row_groups(grouped_layout: torch.Tensor, m_sum: int, num_groups: int, use_psum_layout: bool,
                          alignment: int) -> torch.Tensor:
    """``[m_sum]`` int64: the group each row is computed with, -1 for rows left untouched, as the kernels (and the FP8
    contiguous kernels) compute rows: per ``alignment``-row block, the larger of its first and last rows'
    ``m_indices`` (``scheduler.cuh`` ``contiguous_block_expert``), or the psum group holding its first row
    (``psum_block_group``); every row of a block with a group takes it, padding rows included."""
    blocks = -(-m_sum // alignment)
    first = torch.arange(blocks) * alignment
    if use_psum_layout:
        ends = grouped_layout.to(torch.int64).cpu()
        starts = torch.cat((torch.zeros(1, dtype=torch.int64),
                            (ends[:-1].clamp(min=0) + alignment - 1) // alignment * alignment))
        g = torch.searchsorted(ends, first, right=True)  # the first group with ends[g] > first
        valid = g < num_groups
        gc = g.clamp(max=num_groups - 1)
        group = torch.where(valid & (starts[gc] <= first), gc, torch.full_like(gc, -1))
    else:
        idx = grouped_layout.to(torch.int64).cpu()
        last = torch.minimum(first + alignment, torch.tensor(m_sum)) - 1
        group = torch.maximum(idx[first], idx[last])
    return group.repeat_interleave(alignment)[:m_sum]


def interleave_swiglu_mxfp4(w13: PreparedMxfp4) -> PreparedMxfp4:
    """A prepared ``w13 [G, 2I, H]`` (rows ``[0, I)`` gate, ``[I, 2I)`` up, ``I % 128 == 0``) in the SwiGLU kinds' row
    order (``ops.outputs.interleave_swiglu_weights``: 128-row blocks gate c, up c, ...): its 64-row wave records and
    flags reordered, nothing re-encoded (a copy of the stored form)."""
    g, two_i, _ = w13.shape
    inter = two_i // 2
    if inter % GRAN_K:
        raise ValueError(f"the SwiGLU layout interleaves 128-row blocks: I = {inter} must be a multiple of 128")
    order = []
    for c in range(inter // GRAN_K):
        order += [2 * c, 2 * c + 1, inter // WAVE_ROWS + 2 * c, inter // WAVE_ROWS + 2 * c + 1]
    order = torch.tensor(order, device=w13.tiles.device)
    return PreparedMxfp4(w13.tiles[:, :, order].contiguous(), w13.meta[:, :, order].contiguous(),
                         w13.wave_per32[:, order].contiguous())
