"""MXFP4 experts, host side (issue 42): per_token_cast_to_fp4, the prepared form, the float64 reference and the
bit model of the in-register e2m1 -> e4m3 conversion."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from deep_fp8_gemm.compat.casts import per_token_cast_to_fp4
from deep_fp8_gemm.ops import mxfp4
from deep_fp8_gemm.utils import calc_diff


def _numpy_fp4(x: np.ndarray, gran_k: int, ue8m0: bool):
    """An independent float32 model of the reference's cast (DeepGEMM 54e2261 deep_gemm/utils/math.py semantics)."""
    m, k = x.shape
    pk = -(-k // gran_k) * gran_k
    xp = np.zeros((m, pk), np.float32)
    xp[:, :k] = x
    v = xp.reshape(m, -1, gran_k)
    sf = (np.maximum(np.abs(v).max(-1), np.float32(1e-4)) / np.float32(6.0)).astype(np.float32)
    if ue8m0:
        sf = np.exp2(np.ceil(np.log2(sf.astype(np.float64)))).astype(np.float32)
    s = v * (np.float32(1.0) / sf)[..., None]
    mag = np.abs(s)
    code = sum((mag > b).astype(np.uint8) for b in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)).astype(np.uint8)
    code |= (((s < 0) & (code != 0)).astype(np.uint8) << 3)
    code = code.reshape(m, pk)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    return packed[:, :k // 2], sf


@pytest.mark.parametrize("ue8m0", [True, False])
@pytest.mark.parametrize("shape,gran_k", [((5, 64), 32), ((3, 96), 32), ((4, 256), 128), ((2, 34), 32)])
def test_cast_to_fp4_bits(shape, gran_k, ue8m0):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 6, (shape[0], 1), generator=g).float())
    codes, sf = per_token_cast_to_fp4(x, ue8m0, gran_k)
    ref_codes, ref_sf = _numpy_fp4(x.numpy(), gran_k, ue8m0)
    assert codes.dtype == torch.int8 and codes.shape == (shape[0], shape[1] // 2) and codes.is_contiguous()
    assert np.array_equal(codes.numpy(), ref_codes)
    assert np.array_equal(sf.numpy(), ref_sf)


def test_cast_to_fp4_ties_toward_zero_and_nibble_order():
    # scale 1 (amax 6): 0.75 -> 0.5 (code 1, not 1.0), 2.5 -> 2 (code 4), -0.25 -> +0, low nibble = even K
    x = torch.tensor([[0.75, 2.5, -0.25, 6.0, -1.0, 5.0] + [0.0] * 26])
    codes, sf = per_token_cast_to_fp4(x, True)
    assert sf.tolist() == [[1.0]]
    b = codes[0].to(torch.int64) & 0xFF
    assert b[:3].tolist() == [0x1 | 0x4 << 4, 0x0 | 0x7 << 4, 0xA | 0x6 << 4]


def test_cast_to_fp4_refusals():
    with pytest.raises(ValueError, match="k=3"):
        per_token_cast_to_fp4(torch.zeros(2, 3), True)
    with pytest.raises(TypeError, match="gran_k"):
        per_token_cast_to_fp4(torch.zeros(2, 4), True, 32.0)
    with pytest.raises(TypeError, match="use_ue8m0"):
        per_token_cast_to_fp4(torch.zeros(2, 4), 1)
    with pytest.raises(NotImplementedError):
        per_token_cast_to_fp4(torch.zeros(2, 32), True, use_packed_ue8m0=True)


def test_facade_exports_fp4_cast():
    from deep_fp8_gemm.compat.deep_gemm.utils import math as dg_math
    assert dg_math.per_token_cast_to_fp4 is per_token_cast_to_fp4


# ------------------------------------------------------------------------------------------------- preparation
def _weights(g, n, k, span=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(g * n, k, generator=gen)
    # per-32 magnitudes spread over `span` binades
    w = w * torch.exp2(torch.randint(0, span + 1, (g * n, k // 32), generator=gen).float()).repeat_interleave(32, 1)
    codes, sf = per_token_cast_to_fp4(w, True, 32)
    return codes.view(g, n, k // 2), sf.view(g, n, k // 32)


def test_prepare_keeps_codes_and_values():
    w, sf = _weights(3, 128, 256, span=10)
    p = mxfp4.prepare_mxfp4_weights(w, sf)
    assert torch.equal(p.codes(), w) and p.tiles.numel() == w.numel()  # a permutation of the codes
    per32, _, shift = p.paths()
    assert not bool(per32.any()) and not bool(p.wave_per32.any())
    assert int(shift.min()) >= mxfp4.SHIFT_MIN and int(shift.max()) == mxfp4.SHIFT_MAX
    exact = mxfp4.decode_e2m1(mxfp4.unpack_nibbles(w)) * sf.to(torch.float64).repeat_interleave(32, -1)
    assert torch.equal(mxfp4.dequantize_prepared(p), exact)
    # 272 bytes per 64 rows and 128 K beside the codes' 4096: 4.25 per row (the checkpoint's UE8M0 scales: 4)
    assert p.extra_bytes() == 3 * 2 * (256 // 128) * 272 + 3 * 2


def test_prepare_in_place_reuses_the_storage():
    w, sf = _weights(2, 64, 256, span=10)
    want = mxfp4.prepare_mxfp4_weights(w, sf)
    w2 = w.clone()
    p = mxfp4.prepare_mxfp4_weights(w2, sf, in_place=True)
    assert p.tiles.data_ptr() == w2.data_ptr() and torch.equal(p.tiles, want.tiles)
    assert torch.equal(p.codes(), w)


def test_tiles_hold_each_threads_fragment_words():
    """The stored tile is the fragment order the kernel's two 16-byte loads assume: thread t's word j of half h is
    fragment_a_words of sub-block 2h + j / 2 (row r0 + 8 (j % 2)) of the checkpoint's codes."""
    w, sf = _weights(1, 64, 128, span=4)
    tile = mxfp4.prepare_mxfp4_weights(w, sf).tiles[0, 0, 0].numpy()
    codes = w[0].numpy().view(np.uint8)
    for t in range(128):
        for s in range(4):
            words = mxfp4.fragment_a_words(codes[:, 16 * s:16 * s + 16], t // 32, t % 32)
            at = (s // 2) * 2048 + 16 * t + 8 * (s % 2)
            assert tuple(int(x) for x in tile[at:at + 8].view("<u4")) == words, (t, s)


def _planted_span(sf, span):
    """Row 0, block 0 of expert 0: sub-block exponents t, t - span, t, t (a block spanning `span` binades; t = 0, or
    above 0 where 2^-span would be below UE8M0's 2^-126)."""
    t = max(0, span - 126)
    sf = sf.clone()
    sf[0, 0, 0:4] = torch.tensor([2.0 ** t, 2.0 ** (t - span), 2.0 ** t, 2.0 ** t])
    return sf


@pytest.mark.parametrize("span,per32", [(14, False), (15, True), (40, True), (128, True)])
def test_prepare_flags_wide_blocks(span, per32):
    w, sf = _weights(1, 64, 256)
    p = mxfp4.prepare_mxfp4_weights(w, _planted_span(sf, span))
    flags, block_exp, shift = p.paths()
    assert bool(flags[0, 0, 0]) is per32
    assert int(flags.sum()) == 64 * int(per32)  # the whole wave of that block
    assert p.wave_per32.tolist() == [[int(per32)]]
    t = max(0, span - 126)
    if per32:  # the scales themselves, per sub-block
        assert shift[0, 0, :4].tolist() == [t, t - span, t, t] and int(block_exp[0, 0, 0]) == 0
    else:
        assert shift[0, 0, :4].tolist() == [6, 6 - 14, 6, 6] and int(block_exp[0, 0, 0]) == -6


def test_prepare_refusals():
    w, sf = _weights(1, 64, 128)
    with pytest.raises(ValueError, match="N = 8 must be a multiple of 64"):
        mxfp4.prepare_mxfp4_weights(w[:, :8], sf[:, :8])
    with pytest.raises(TypeError, match=r"rhs\[0\]"):
        mxfp4.prepare_mxfp4_weights(w.float(), sf)
    with pytest.raises(ValueError, match=r"rhs\[1\] must have shape"):
        mxfp4.prepare_mxfp4_weights(w, sf[..., :2])
    with pytest.raises(ValueError, match="K = 2 \\* 48 = 96"):
        mxfp4.prepare_mxfp4_weights(w[..., :48], sf[..., :3])
    bad = sf.clone()
    bad[0, 1, 2] = 0.75
    with pytest.raises(ValueError, match=r"rhs\[1\]\[0, 1, 2\]=0.75"):
        mxfp4.prepare_mxfp4_weights(w, bad)
    # any span is stored (a per-32 block keeps each sub-block's own exponent): 129 binades, exactly
    wide = sf.clone()
    wide[0, 1, 0:4] = torch.tensor([2.0 ** 100, 2.0 ** -29, 1.0, 1.0])
    p = mxfp4.prepare_mxfp4_weights(w, wide)
    exact = mxfp4.decode_e2m1(mxfp4.unpack_nibbles(w)) * wide.to(torch.float64).repeat_interleave(32, -1)
    assert bool(p.paths()[0][0, 1, 0]) and torch.equal(mxfp4.dequantize_prepared(p), exact)
    with pytest.raises(ValueError, match="max_span"):
        mxfp4.prepare_mxfp4_weights(w, sf, max_span=15)


# ------------------------------------------------------------------------------------------------- reference
@pytest.mark.parametrize("span", [6, 15, 30])
def test_reference_follows_the_recorded_path(span):
    g, m_max, n, k = 2, 5, 64, 256
    w, sf = _weights(g, n, k, seed=3)
    p = mxfp4.prepare_mxfp4_weights(w, _planted_span(sf, span))
    gen = torch.Generator().manual_seed(4)
    a = (torch.randn(g, m_max, k, generator=gen) * 4).to(torch.float8_e4m3fn)
    sa = torch.exp2(torch.randint(-3, 3, (g, m_max, k // 128), generator=gen).float())
    masked_m = torch.tensor([5, 2])
    d = mxfp4.masked_gemm_reference(a, sa, p, masked_m)
    wd = mxfp4.dequantize_prepared(p)
    ad = a.to(torch.float64) * sa.to(torch.float64).repeat_interleave(128, -1)
    plain = torch.einsum("gmk,gnk->gmn", ad, wd)
    assert torch.allclose(d[0], plain[0], rtol=1e-12, atol=1e-12)
    assert torch.allclose(d[1, :2], plain[1, :2], rtol=1e-12, atol=1e-12)
    assert not bool(d[1, 2:].any())
    assert calc_diff(d[0].float(), plain[0].float()) < 1e-6


# ------------------------------------------------------------------------------------------------- conversion
def test_conversion_exact_exactly_for_shifts_minus8_to_6():
    assert mxfp4.conversion_exact_shifts() == tuple(range(-8, 7))
    with pytest.raises(ValueError, match="shift=7"):
        mxfp4.lookup_table(7)
    with pytest.raises(ValueError, match="shift=-9"):
        mxfp4.lookup_table(-9)


def test_prmt_model():
    a, b = 0x33221100, 0x77665544
    assert mxfp4.prmt(a, b, 0x7654) == 0x77665544
    assert mxfp4.prmt(a, b, 0x0123) == 0x00112233
    assert mxfp4.prmt(0x80, 0, 0x1118) == 0x000000FF  # bit 3: the selected byte's sign replicated


def _decode_e4m3(bytes_: np.ndarray) -> np.ndarray:
    return torch.from_numpy(bytes_.astype(np.uint8)).view(torch.float8_e4m3fn).to(torch.float64).numpy()


def test_conversion_model_every_code_every_shift():
    # each row: the 16 codes twice (every nibble position sees every code), shifts -8..6
    codes = np.tile(np.arange(16, dtype=np.uint8), 2)
    rng = np.random.default_rng(0)
    rows = [codes, rng.permutation(codes), rng.integers(0, 16, 32, dtype=np.uint8)]
    for shift in range(mxfp4.SHIFT_MIN, mxfp4.SHIFT_MAX + 1):
        for c in rows:
            packed = (c[0::2] | (c[1::2] << 4)).astype(np.uint8)[None]
            out = mxfp4.convert_rows(packed, np.array([shift]))[0]
            want = mxfp4.decode_e2m1(torch.from_numpy(c.astype(np.int64))).numpy() * 2.0 ** shift
            assert np.array_equal(_decode_e4m3(out), want), shift
            # the sign bit is the code's sign bit (code 8, -0, gives e4m3 -0)
            assert np.array_equal(out >> 7, c >> 3)


@pytest.mark.parametrize("bug", ["nibble_order", "shift"])
def test_conversion_model_planted_bugs_fail(bug):
    c = np.arange(32, dtype=np.uint8) % 16
    packed = (c[0::2] | (c[1::2] << 4)).astype(np.uint8)
    if bug == "nibble_order":
        packed = ((packed >> 4) | (packed << 4)).astype(np.uint8)
    shift = 3 if bug == "shift" else 2
    out = mxfp4.convert_rows(packed[None], np.array([shift]))[0]
    want = mxfp4.decode_e2m1(torch.from_numpy(c.astype(np.int64))).numpy() * 4.0
    assert not np.array_equal(_decode_e4m3(out), want)


# ------------------------------------------------------------------------------------------------- the kinds table
def test_kinds_table_has_the_mxfp4_rows():
    """The MXFP4 kernels are eight rows (their own kernel family): masked, contiguous and psum in bf16 and FP8 out,
    SwiGLU·FP8 on masked and contiguous; register-A for all, and the shared-memory conversion (order convert_smem,
    issue 43) for the contiguous layouts' bf16 and FP8 outputs; every other e2m1x2 / 1x32 / mx / register_a /
    convert_smem point is refused by a named rule."""
    from deep_fp8_gemm.kinds import KERNEL_FAMILY, TABLE
    assert "e2m1x2" in TABLE.axis("packing").names and "1x128/1x32" in TABLE.axis("granularity").names
    points = [p for p in TABLE.product() if p["packing"] == "e2m1x2" or p["granularity"] == "1x128/1x32"
              or p["accumulation"] == "mx" or p["order"] in ("register_a", "convert_smem")]
    legal = [p for p in points if not TABLE.conflict(p)]
    bf16 = ("mxfp4_masked", "mxfp4_contiguous", "mxfp4_psum")
    fp8 = ("mxfp4_masked_fp8out", "mxfp4_contiguous_fp8out", "mxfp4_psum_fp8out")
    swiglu = ("mxfp4_masked_swiglu", "mxfp4_contiguous_swiglu")
    rows = bf16 + fp8 + swiglu
    converted = bf16[1:] + fp8[1:]
    assert sorted(map(str, legal)) == sorted([str(TABLE.row(r).point("register_a")) for r in rows] +
                                             [str(TABLE.row(r).point("convert_smem")) for r in converted])
    assert TABLE.names_of("mxfp4_gemm") == rows and KERNEL_FAMILY["e2m1x2"] == "mxfp4_gemm"
    assert not set(rows) & set(TABLE.names_of("fp8_gemm"))  # the FP8 template never sees them
    stated = {(r.other, r.allowed) for r in TABLE.rules if (r.axis, r.value) == ("packing", "e2m1x2")}
    assert stated == {("layout", ("masked", "contiguous", "psum")), ("output", ("bf16", "fp8", "swiglu_fp8")),
                      ("order", ("register_a", "convert_smem")),
                      ("granularity", ("1x128/1x32",)), ("accumulation", ("mx",))}
    message = TABLE.conflict(dict(TABLE.row("masked").point(), packing="e2m1x2"))
    assert "packing=e2m1x2 conflicts with" in message
    assert "order=register_a conflicts with packing=e4m3" in TABLE.conflict(dict(TABLE.row("masked").point("ab"),
                                                                                   order="register_a"))
    assert "output=swiglu_fp8 conflicts with" in TABLE.conflict(dict(TABLE.row("mxfp4_psum").point("register_a"),
                                                                      output="swiglu_fp8"))
    assert "order=convert_smem" in TABLE.conflict(dict(TABLE.row("mxfp4_contiguous_swiglu").point("register_a"),
                                                       order="convert_smem"))
    # the kernel's layouts and outputs are the rows' (kernels/mxfp4_gemm.py LAYOUTS / OUTPUTS), and every kernel the
    # audit lists is a row, by its path's order
    from deep_fp8_gemm.kernels import mxfp4_gemm
    assert {TABLE.row(r).layout for r in rows} == set(mxfp4_gemm.LAYOUTS)
    assert {TABLE.row(r).output for r in rows} == set(mxfp4_gemm.OUTPUTS)
    assert {TABLE.row(r).cpp.removeprefix("Mxfp4") for r in bf16} == set(mxfp4_gemm.LAYOUTS.values())
    audited = {c.kind for c in mxfp4_gemm.audit_configs() + mxfp4_gemm.convert_audit_configs()}
    assert audited == set(rows)  # every row has a kernel in the audit
    assert {(c.kind, c.path) for c in mxfp4_gemm.convert_audit_configs()} <= {(r, "convert") for r in converted}


def test_mxfp4_configs_and_names_refuse_what_is_not_a_kind():
    """A combination the kinds table has no row for is refused by name, on the CPU path as on the kernels': SwiGLU on
    the psum layout, SwiGLU or masked on the conversion kernel."""
    from deep_fp8_gemm.kernels import mxfp4_gemm
    with pytest.raises(ValueError, match="no MXFP4 GEMM kind has layout 'psum' and output 'swiglu_fp8'"):
        mxfp4_gemm.pick_config(256, 256, 2, 16, 132, "psum", 64, "swiglu_fp8")
    with pytest.raises(ValueError, match="mxfp4_contiguous_swiglu .* not path 'convert'"):
        mxfp4_gemm.Mxfp4Config(256, 256, 2, 128, 128, 2, "contiguous", 128, "swiglu_fp8", path="convert")
    with pytest.raises(ValueError, match="mxfp4_masked .* not path 'convert'"):
        mxfp4_gemm.Mxfp4Config(256, 256, 2, 128, 128, 2, "masked", 128, path="convert")
    assert mxfp4_gemm.kind_of("psum", "fp8", "convert") == "mxfp4_psum_fp8out"
    g, n, k = 2, 256, 256
    w, sf = _weights(g, n, k, seed=3)
    p = mxfp4.interleave_swiglu_mxfp4(mxfp4.prepare_mxfp4_weights(w, sf))
    a = torch.zeros(128, k).to(torch.float8_e4m3fn), torch.ones(128, k // 128)
    from deep_fp8_gemm.utils import empty_m_major
    out = torch.empty(128, n // 2).to(torch.float8_e4m3fn), empty_m_major((128, n // 256), "cpu")
    with pytest.raises(ValueError, match=r"swiglu=True takes the m_indices layout \(use_psum_layout=False\)"):
        mxfp4.m_grouped_gemm_fp8_fp4_fp8_nt_contiguous(a, p, out, torch.tensor([64, 128], dtype=torch.int32),
                                                       use_psum_layout=True, swiglu=True)


# ------------------------------------------------------------------------------------------------- register A fragment
def _fragment_case(seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 16, (64, 32), dtype=np.uint8)
    shifts = rng.integers(mxfp4.SHIFT_MIN, mxfp4.SHIFT_MAX + 1, 64)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    want = mxfp4.decode_e2m1(torch.from_numpy(codes.astype(np.int64))).numpy() * np.exp2(shifts)[:, None]
    return packed, shifts, want


def _check_fragment(packed, shifts, want, registers=mxfp4.fragment_a_registers):
    for warp in range(4):
        for lane in range(32):
            regs = registers(packed, shifts, warp, lane)
            for j, reg in enumerate(regs):
                for b in range(4):
                    value = _decode_e4m3(np.array([(reg >> (8 * b)) & 0xFF]))[0]
                    row, k = mxfp4.fragment_a_row(warp, lane, j), mxfp4.fragment_a_k(lane, j, b)
                    if value != want[row, k]:
                        return False
    return True


def test_fragment_a_matches_wgmma_register_layout():
    """Every thread's converted registers hold exactly the e4m3 values dfg::WgmmaFragmentA places there."""
    packed, shifts, want = _fragment_case()
    assert _check_fragment(packed, shifts, want)
    # the Python mirror of WgmmaFragmentA is the header's formula
    text = (Path(__file__).resolve().parents[2] / "include/deep_fp8_gemm/mma.cuh").read_text()
    assert "return 16 * warp + lane / 4 + 8 * (j % 2);" in text and "return 4 * (lane % 4) + b + 16 * (j / 2);" in text


@pytest.mark.parametrize("bug", ["nibble_order", "fragment_row", "shift"])
def test_fragment_a_planted_bugs_fail(bug):
    packed, shifts, want = _fragment_case(1)

    def registers(p, s, warp, lane):
        if bug == "nibble_order":
            p = ((p >> 4) | (p << 4)).astype(np.uint8)
        if bug == "shift":
            s = np.where(s < mxfp4.SHIFT_MAX, s + 1, s)
        regs = mxfp4.fragment_a_registers(p, s, warp, lane)
        return (regs[1], regs[0], regs[3], regs[2]) if bug == "fragment_row" else regs

    assert not _check_fragment(packed, shifts, want, registers)


# ------------------------------------------------------------------------------------------------- the 2.x entry point
def _mxfp4_call(span=6, m_max=4, masked=(4, 1)):
    g, n, k = len(masked), 64, 256
    w, sf = _weights(g, n, k, seed=7)
    sf = _planted_span(sf, span)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(g * m_max, k, generator=gen)
    from deep_fp8_gemm.compat.casts import per_token_cast_to_fp8
    a, sa = per_token_cast_to_fp8(x, True)
    a, sa = a.view(g, m_max, k), sa.view(g, m_max, k // 128)
    d = torch.full((g, m_max, n), 7.0, dtype=torch.bfloat16)
    return (a, sa), (w, sf), d, torch.tensor(masked, dtype=torch.int32)


@pytest.mark.parametrize("span", [6, 15, 30])
def test_fp8_fp4_masked_on_cpu_against_float64(span, monkeypatch):
    from deep_fp8_gemm.compat.api import m_grouped_fp8_fp4_gemm_nt_masked
    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    a, b, d, masked_m = _mxfp4_call(span)
    m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 2, recipe_a=(1, 128), recipe_b=(1, 32))
    wd = mxfp4.decode_e2m1(mxfp4.unpack_nibbles(b[0])) * b[1].to(torch.float64).repeat_interleave(32, -1)
    ad = a[0].to(torch.float64) * a[1].to(torch.float64).repeat_interleave(128, -1)
    want = torch.einsum("gmk,gnk->gmn", ad, wd)
    assert calc_diff(d[0].double(), want[0]) < 1e-3 and calc_diff(d[1, :1].double(), want[1, :1]) < 1e-3
    assert bool((d[1, 1:] == 7.0).all())  # rows past masked_m untouched


def test_fp8_fp4_masked_keeps_fp8_b_on_the_fp8_kernel(monkeypatch):
    import deep_fp8_gemm.compat.api as api
    calls = []
    monkeypatch.setattr(api, "m_grouped_gemm_fp8_fp8_bf16_nt_masked", lambda *args: calls.append("fp8"))
    monkeypatch.setattr(api, "m_grouped_gemm_fp8_fp4_bf16_nt_masked", lambda *args: calls.append("fp4"))
    a, b, d, masked_m = _mxfp4_call()
    b8 = (torch.zeros(2, 64, 256, dtype=torch.float8_e4m3fn), torch.ones(2, 1, 2))
    api.m_grouped_fp8_fp4_gemm_nt_masked(a, b8, d, masked_m, 2)
    api.m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 2, recipe_a=(1, 128), recipe_b=(1, 32))
    assert calls == ["fp8", "fp4"]


def test_fp8_fp4_masked_refusals(monkeypatch):
    from deep_fp8_gemm.compat.api import m_grouped_fp8_fp4_gemm_nt_masked
    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    a, b, d, masked_m = _mxfp4_call()
    with pytest.raises(ValueError, match=r"recipe_a=\(1, 128\), recipe_b=\(1, 32\).*recipe_b=\(1, 128\)"):
        m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 2, recipe_a=(1, 128), recipe_b=(1, 128))
    with pytest.raises(ValueError, match=r"d must be bfloat16"):
        m_grouped_fp8_fp4_gemm_nt_masked(a, b, d.float(), masked_m, 2, recipe_a=(1, 128), recipe_b=(1, 32))
    with pytest.raises(ValueError, match=r"masked_m\[1\]=9"):
        m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, torch.tensor([1, 9], dtype=torch.int32), 2,
                                         recipe_a=(1, 128), recipe_b=(1, 32))
    with pytest.raises(TypeError, match="expected_m"):
        m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, 2.0, recipe_a=(1, 128), recipe_b=(1, 32))
    with pytest.raises(ValueError, match="must be a multiple of 64"):  # the kernel's waves, on every backend
        m_grouped_fp8_fp4_gemm_nt_masked(a, (b[0][:, :16], b[1][:, :16]), d[..., :16], masked_m, 2,
                                         recipe_a=(1, 128), recipe_b=(1, 32))


# ------------------------------------------------------------------------------------------------- outputs apart
def _laid_over(inputs: dict, over: str, shape, dtype) -> tuple[dict, torch.Tensor]:
    """Copies of ``inputs`` back to back (16-byte aligned) in one byte buffer, and a ``dtype`` ``shape`` output whose
    bytes start where input ``over``'s copy does: an output laid over an input."""
    offsets, end = {}, 0
    for name, t in inputs.items():
        offsets[name] = end
        end += -(-t.numel() * t.element_size() // 16) * 16
    out_bytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    buf = torch.zeros(max(end, offsets[over] + out_bytes), dtype=torch.uint8)
    copies = {}
    for name, t in inputs.items():
        copies[name] = buf[offsets[name]:offsets[name] + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
        copies[name].copy_(t)
    return copies, buf[offsets[over]:offsets[over] + out_bytes].view(dtype).view(shape)


@pytest.mark.parametrize("over", ["a[0]", "a[1]", "masked_m", "b (tiles)"])
def test_outputs_overlapping_an_input_are_refused(over, monkeypatch):
    """The MXFP4 names refuse an output whose bytes meet an input's, on every backend (the kernel would read what it
    writes; the CPU path computes first, so it would not show): masked and contiguous, bf16 and FP8 out."""
    from deep_fp8_gemm.utils import empty_m_major

    monkeypatch.delenv("DFG_SIMULATE", raising=False)
    (x, sa), (w, sf), d, masked_m = _mxfp4_call()
    p = mxfp4.prepare_mxfp4_weights(w, sf)
    g, n, k = p.shape
    inputs = {"a[0]": x, "a[1]": sa.contiguous(), "masked_m": masked_m, "b (tiles)": p.tiles}
    view, d2 = _laid_over(inputs, over, d.shape, torch.bfloat16)
    p2 = mxfp4.PreparedMxfp4(view["b (tiles)"], p.meta, p.wave_per32)
    a2 = (view["a[0]"], view["a[1]"])
    with pytest.raises(ValueError, match=rf"^d must not overlap {re.escape(over)}:"):
        mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked(a2, p2, d2, view["masked_m"], 2)
    view, d8 = _laid_over(inputs, over, (g, x.shape[1], n), torch.float8_e4m3fn)  # FP8 out: D over the input
    p2, a2 = mxfp4.PreparedMxfp4(view["b (tiles)"], p.meta, p.wave_per32), (view["a[0]"], view["a[1]"])
    out = (d8, empty_m_major((g, x.shape[1], -(-n // 128)), "cpu"))
    with pytest.raises(ValueError, match=rf"^out\[0\] \(D\) must not overlap {re.escape(over)}:"):
        mxfp4.m_grouped_gemm_fp8_fp4_fp8_nt_masked(a2, p2, out, view["masked_m"], 2)
    if over == "masked_m":
        return
    # the contiguous layouts: the same rows flattened, all of expert 0
    view, d2 = _laid_over(inputs, over, d.shape, torch.bfloat16)
    p2 = mxfp4.PreparedMxfp4(view["b (tiles)"], p.meta, p.wave_per32)
    flat = (view["a[0]"].view(-1, k), view["a[1]"].view(-1, k // 128))
    m_indices = torch.zeros(flat[0].shape[0], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^d must not overlap {re.escape(over)}:"):
        mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_contiguous(flat, p2, d2.view(-1, n), m_indices)
    view, d8 = _laid_over(inputs, over, (g * x.shape[1], n), torch.float8_e4m3fn)
    p2 = mxfp4.PreparedMxfp4(view["b (tiles)"], p.meta, p.wave_per32)
    flat = (view["a[0]"].view(-1, k), view["a[1]"].view(-1, k // 128))
    out = (d8, empty_m_major((flat[0].shape[0], -(-n // 128)), "cpu"))
    with pytest.raises(ValueError, match=rf"^out\[0\] \(D\) must not overlap {re.escape(over)}:"):
        mxfp4.m_grouped_gemm_fp8_fp4_fp8_nt_contiguous(flat, p2, out, m_indices)


def test_outputs_apart_from_inputs_still_compute():
    """The same buffers with the output past every input: no refusal (the check compares bytes, not storages)."""
    (x, sa), (w, sf), d, masked_m = _mxfp4_call()
    p = mxfp4.prepare_mxfp4_weights(w, sf)
    inputs = {"a[0]": x, "a[1]": sa.contiguous(), "masked_m": masked_m, "b (tiles)": p.tiles}
    end = sum(-(-t.numel() * t.element_size() // 16) * 16 for t in inputs.values())
    view, _ = _laid_over(dict(inputs, end=torch.zeros(d.numel() * 2 // 16 * 16 + 16, dtype=torch.uint8)), "end",
                         d.shape, torch.bfloat16)
    d_far = view["end"][:d.numel() * 2].view(torch.bfloat16).view(d.shape)
    assert view["end"].data_ptr() - view["a[0]"].data_ptr() == end
    want = d.clone()
    mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked((x, sa), p, want, masked_m, 2)
    d_far.fill_(7.0)
    p2 = mxfp4.PreparedMxfp4(view["b (tiles)"], p.meta, p.wave_per32)
    mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked((view["a[0]"], view["a[1]"]), p2, d_far, view["masked_m"], 2)
    assert torch.equal(d_far, want)
