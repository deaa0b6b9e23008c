"""The BF16 / TF32 names (issue 41) on an sm_90 device (marked ``gpu``: skipped, with the reason, anywhere else),
through ``deep_gemm`` with the consumers' call shapes, and on the CPU the legality of every case they launch.

On the GPU, each name against the exact float64 CPU path (calc_diff <= 1e-4 for BF16 / TF32 outputs, <= 1e-3 for
``fp8_einsum``; the reference's own BF16 head test asks 1e-10 of its fp32-accumulated bf16 output against torch's
bf16 einsum, which this compares as well where the shapes are the reference test's), a row's bits unchanged when the
batch changes (the batch-invariance contract), and twenty calls bitwise equal.

The cases are module-level tables (``GPU_CASE_TABLES``): ``test_gpu_cases_are_legal_on_the_cpu`` runs each through
the names' checks on meta tensors, so an illegal case fails here, not only on the rare GPU run.
"""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm.compat.deep_gemm as deep_gemm
from deep_fp8_gemm import calc_diff

BF16 = torch.bfloat16
# (layout, m, n, k, out dtype, accumulate): DeepSeek-V3 / V4 projections, SGLang's batch-invariant mm (fp32 out, NN)
DENSE = [
    ("nt", 4096, 7168, 2048, "bfloat16", False),
    ("nn", 128, 4096, 7168, "float32", False),
    ("tn", 2048, 1536, 4096, "float32", True),
    ("tt", 257, 576, 7168, "bfloat16", True),
    ("nt", 1, 7168, 16384, "bfloat16", False),
]
# (groups, m per group, n, k): SGLang's BF16 MoE runner (DeepSeek-V3 / V4 experts: N 4096 / 7168 / 2048)
GROUPED = [
    (8, 256, 4096, 7168),
    (32, 64, 7168, 2048),
    (4, 1024, 2048, 4096),
]
# (b, h, r, d): the reference test's shapes and V4's o_proj (h 8 of 64, r 4096 / 512)
HEADS = [
    (4, 128, 512, 128),
    (4096, 8, 4096, 1024),
    (128, 64, 512, 1024),
]
# (m, k, num_splits): V4's mHC pre-norm (n 24, k = 4 * 7168) at decode and prefill sizes
HC = [
    (16, 4 * 7168, 16),
    (4096, 4 * 7168, 16),
    (1024, 4 * 4096, None),
]
GPU_CASE_TABLES = (DENSE, GROUPED, HEADS, HC)


def _dense_operands(layout, m, n, k, out, accumulate, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*((m, k) if layout[0] == "n" else (k, m)), generator=g).to(BF16).to(device)
    b = torch.randn(*((n, k) if layout[1] == "t" else (k, n)), generator=g).to(BF16).to(device)
    d = torch.empty(m, n, dtype=getattr(torch, out), device=device)
    c = torch.randn(m, n, generator=g).to(d.dtype).to(device) if accumulate else None
    return a, b, d, c


@pytest.mark.gpu
@pytest.mark.parametrize("layout,m,n,k,out,accumulate", DENSE)
def test_gpu_dense(layout, m, n, k, out, accumulate):
    a, b, d, c = _dense_operands(layout, m, n, k, out, accumulate, "cuda")
    fn = getattr(deep_gemm, f"bf16_gemm_{layout}")
    fn(a, b, d, c)
    ref = torch.empty_like(d, device="cpu")
    fn(a.cpu(), b.cpu(), ref, None if c is None else c.cpu())
    assert calc_diff(d.cpu(), ref) < 1e-4
    first = d.clone()
    for _ in range(20):
        fn(a, b, d, c)
        assert torch.equal(d, first)
    if layout == "nn" and m > 1:  # SGLang's batch-invariant mm: a row's bits do not depend on the batch
        one = torch.empty(1, n, dtype=d.dtype, device="cuda")
        fn(a[m // 2: m // 2 + 1], b, one)
        assert torch.equal(one[0], d[m // 2])


@pytest.mark.gpu
@pytest.mark.parametrize("groups,m,n,k", GROUPED)
def test_gpu_grouped(groups, m, n, k):
    g = torch.Generator().manual_seed(groups)
    a = torch.randn(groups, m, k, generator=g).to(BF16).cuda()
    b = torch.randn(groups, n, k, generator=g).to(BF16).cuda()
    masked_m = torch.randint(0, m + 1, (groups,), generator=g, dtype=torch.int32)
    d = torch.zeros(groups, m, n, dtype=BF16, device="cuda")
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m.cuda(), m)
    for grp, rows in enumerate(masked_m.tolist()):
        assert not d[grp, rows:].any()
        if rows:
            assert calc_diff(d[grp, :rows].cpu(), a[grp, :rows].double().cpu() @ b[grp].double().cpu().T) < 1e-4
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    layout = torch.cat([torch.full((align * 2,), grp, dtype=torch.int32) for grp in range(groups)])
    layout[align * 2 - 7: align * 2] = -1
    x = torch.randn(layout.numel(), k, generator=g).to(BF16).cuda()
    out = torch.zeros(layout.numel(), n, dtype=BF16, device="cuda")
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x, b, out, layout.cuda())
    ref = torch.zeros_like(out, device="cpu")
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(x.cpu(), b.cpu(), ref, layout)
    assert calc_diff(out.cpu(), ref) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("bsz,h,r,dd", HEADS)
def test_gpu_einsum_heads(bsz, h, r, dd):
    g = torch.Generator().manual_seed(bsz)
    x = torch.randn(bsz, h, r, generator=g).to(BF16).cuda()
    y = torch.randn(h, dd, r + 128, generator=g).to(BF16).cuda()[:, :, :r]  # the reference test's strided y
    z = torch.empty(bsz, h, dd, dtype=BF16, device="cuda")
    deep_gemm.einsum("bhr,hdr->bhd", x, y, z)
    assert calc_diff(z.cpu(), torch.einsum("bhr,hdr->bhd", x.double().cpu(), y.double().cpu())) < 1e-4
    x2 = torch.randn(bsz, h, dd, generator=g).to(BF16).cuda()
    z2 = torch.empty(bsz, h, r, dtype=BF16, device="cuda")
    deep_gemm.einsum("bhd,hdr->bhr", x2, y, z2)
    assert calc_diff(z2.cpu(), torch.einsum("bhd,hdr->bhr", x2.double().cpu(), y.double().cpu())) < 1e-4
    from deep_fp8_gemm.compat import per_block_cast_to_fp8, per_token_cast_to_fp8

    xf, sx = per_token_cast_to_fp8(x.float().view(-1, r), use_ue8m0=True)
    yf = torch.empty(h, dd, r, dtype=torch.float8_e4m3fn, device="cuda")
    sy = torch.empty(h, (dd + 127) // 128, (r + 127) // 128, device="cuda")
    for i in range(h):
        yf[i], sy[i] = per_block_cast_to_fp8(y[i].float().contiguous(), use_ue8m0=True)
    z3 = torch.empty(bsz, h, dd, dtype=BF16, device="cuda")
    deep_gemm.fp8_einsum("bhr,hdr->bhd", (xf.view(bsz, h, r), sx.view(bsz, h, -1)), (yf, sy), z3)
    assert calc_diff(z3.cpu(), torch.einsum("bhr,hdr->bhd", x.double().cpu(), y.double().cpu())) < 1e-3



@pytest.mark.gpu
@pytest.mark.parametrize("bsz,h,r,dd", HEADS)
def test_gpu_fp8_einsum_reads_sx_where_it_lies(bsz, h, r, dd):
    """sx row-major (K-major for the kernel) and as per_token_cast_to_fp8 returns it, viewed back (G-major): the bits
    of a layout the op copies into the M-major one (rows of kb + 1 floats) (issue 45)."""
    from deep_fp8_gemm import per_block_cast_to_fp8, per_token_cast_to_fp8
    from deep_fp8_gemm.kernels.gemm import sa_major_of

    g = torch.Generator().manual_seed(bsz + 45)
    x = torch.randn(bsz, h, r, generator=g).cuda()
    y = torch.randn(h, dd, r, generator=g).cuda()
    xf, sx = per_token_cast_to_fp8(x.view(-1, r))
    kb = sx.shape[-1]
    pairs = [per_block_cast_to_fp8(y[i]) for i in range(h)]
    yf, sy = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    sx_g = sx.view(bsz, h, kb) if sx.stride(0) == 1 else sx.t().contiguous().t().view(bsz, h, kb)
    sx_k = sx_g.contiguous()
    sx_copied = torch.empty(bsz, h, kb + 1, device="cuda")[:, :, :kb]
    sx_copied.copy_(sx_k)
    assert [sa_major_of(s.permute(1, 0, 2)) for s in (sx_g, sx_k, sx_copied)] == ["g", "k", None]
    outs = []
    for s in (sx_copied, sx_k, sx_g):
        z = torch.empty(bsz, h, dd, dtype=BF16, device="cuda")
        deep_gemm.fp8_einsum("bhr,hdr->bhd", (xf.view(bsz, h, r), s), (yf, sy), z)
        outs.append(z)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.gpu
def test_gpu_einsum_bmk_bnk_mn():
    g = torch.Generator().manual_seed(5)
    for s, m, n, k in ((129, 128, 384, 128), (4096, 256, 256, 256)):
        a = torch.randn(s, m, k, generator=g).to(BF16).cuda()
        b = torch.randn(s, n, k, generator=g).to(BF16).cuda()
        d = torch.randn(m, n, generator=g).cuda()
        ref = d.double().cpu() + torch.einsum("bmk,bnk->mn", a.double().cpu(), b.double().cpu())
        deep_gemm.einsum("bmk,bnk->mn", a, b, d, c=d)
        assert calc_diff(d.cpu(), ref) < 1e-5  # the reference test's bound


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,num_splits", HC)
def test_gpu_hc_prenorm(m, k, num_splits):
    g = torch.Generator().manual_seed(m)
    a = torch.randn(m, k, generator=g).to(BF16).cuda()
    b = torch.randn(24, k, generator=g).cuda()
    shape_d, shape_s = ((m, 24), (m,)) if num_splits is None else ((num_splits, m, 24), (num_splits, m))
    d, s = torch.empty(shape_d, device="cuda"), torch.empty(shape_s, device="cuda")
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d, s, num_splits)
    d_ref, s_ref = torch.empty(shape_d), torch.empty(shape_s)
    deep_gemm.tf32_hc_prenorm_gemm(a.cpu(), b.cpu(), d_ref, s_ref, num_splits)
    assert calc_diff(d.cpu(), d_ref) < 1e-4 and calc_diff(s.cpu(), s_ref) < 1e-4


@pytest.mark.parametrize("case", DENSE, ids=str)
def test_dense_cases_are_legal_on_the_cpu(case):
    a, b, d, c = _dense_operands(*case, "meta")
    getattr(deep_gemm, f"bf16_gemm_{case[0]}")(a, b, d, c)


@pytest.mark.parametrize("case", GROUPED + HEADS + HC, ids=str)
def test_other_cases_are_legal_on_the_cpu(case):
    meta = dict(device="meta")
    if case in GROUPED:
        groups, m, n, k = case
        deep_gemm.m_grouped_bf16_gemm_nt_masked(torch.empty(groups, m, k, dtype=BF16, **meta),
                                                torch.empty(groups, n, k, dtype=BF16, **meta),
                                                torch.empty(groups, m, n, dtype=BF16, **meta),
                                                torch.empty(groups, dtype=torch.int32, **meta), m)
    elif case in HEADS:
        bsz, h, r, dd = case
        deep_gemm.einsum("bhr,hdr->bhd", torch.empty(bsz, h, r, dtype=BF16, **meta),
                         torch.empty(h, dd, r + 128, dtype=BF16, **meta)[:, :, :r],
                         torch.empty(bsz, h, dd, dtype=BF16, **meta))
    else:
        m, k, splits = case
        shape_d, shape_s = ((m, 24), (m,)) if splits is None else ((splits, m, 24), (splits, m))
        deep_gemm.tf32_hc_prenorm_gemm(torch.empty(m, k, dtype=BF16, **meta), torch.empty(24, k, **meta),
                                       torch.empty(shape_d, **meta), torch.empty(shape_s, **meta), splits)
