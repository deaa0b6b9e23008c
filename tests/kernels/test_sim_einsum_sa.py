"""``fp8_einsum("bhr,hdr->bhd")`` reads ``sx`` where its caller left it (issue 45): the masked kernel compiled for a
K- or G-major sA (``GemmConfig.sa_major``, scales.cuh ``ScaleMajor``), run by the simulator, gives the bits of the
M-major copy path for the two layouts the consumers pass:

* "k": row-major ``sx [b, h, kb]`` (vLLM / SGLang's ``per_token_group_quant`` output viewed back), ``kb % 4 == 0``;
* "g": ``per_token_cast_to_fp8``'s M-major TMA-aligned ``[b * h, kb]`` viewed back as ``[b, h, kb]`` (strides
  ``(h, 1, align(b * h, 4))``), ``h % 4 == 0``;

at h = 8 heads, b = 70 tokens (not a multiple of BLOCK_M: TMA's zero fill of the last row block), r = 512 (kb = 4:
the K-major box's four floats are the row's whole sA row). Planted bugs in a copy of the headers must change the bits:
the math warps reading ``sa[r]`` instead of ``sa[r * 4]``, and a box coordinate order swapped.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from deep_fp8_gemm import calc_diff, per_block_cast_to_fp8, per_token_cast_to_fp8
from deep_fp8_gemm.kernels import gemm as gemm_host
from deep_fp8_gemm.ops import einsum
from tests._mutate import mutated_headers

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")

NB, H, R, DD = 70, 8, 512, 128
EXPR = "bhr,hdr->bhd"
BF16 = torch.bfloat16


def _operands():
    """``(x, sx_g, sx_k, y, sy, exact)``: x quantised by the library's per-token cast (its M-major sx viewed back: G-major),
    the same scales row-major (K-major), y per 128x128 block, and the float64 einsum of the dequantised operands."""
    g = torch.Generator().manual_seed(45)
    xf = torch.randn(NB, H, R, generator=g) * torch.rand(NB, H, 1, generator=g).add(0.1)
    yf = torch.randn(H, DD, R, generator=g)
    x, sx = per_token_cast_to_fp8(xf.view(-1, R))  # CPU: the torch quantiser, the kernel's bits
    sx_g = sx.view(NB, H, -1)
    sx_k = sx_g.contiguous()
    pairs = [per_block_cast_to_fp8(yf[i]) for i in range(H)]
    y, sy = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    exact = torch.einsum("bhr,hdr->bhd", x.view(NB, H, R).double() * sx_k.double().repeat_interleave(128, -1),
                         y.double() * sy.double().repeat_interleave(128, -2).repeat_interleave(128, -1))
    return x.view(NB, H, R), sx_g, sx_k, y, sy, exact


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("DFG_SIMULATE", "1")
    monkeypatch.setenv("DFG_SIM_NUM_SMS", "4")
    launched = []
    launch = gemm_host.launch

    def spy(cfg, *args, **kwargs):
        launched.append(cfg)
        return launch(cfg, *args, **kwargs)

    monkeypatch.setattr(gemm_host, "launch", spy)
    einsum.clear_plans()
    yield launched
    einsum.clear_plans()


def _run(x, sx, y, sy) -> torch.Tensor:
    d = torch.full((NB, H, DD), float("nan"), dtype=BF16)
    einsum.fp8_einsum(EXPR, (x, sx), (y, sy), d)
    return d


def _copy_path(monkeypatch, x, sx, y, sy) -> torch.Tensor:
    """Today's path: no layout read where it lies, sx copied into the M-major layout by the masked op."""
    with monkeypatch.context() as m:
        m.setattr(gemm_host, "sa_major_of", lambda sa, address=True: None)
        return _run(x, sx, y, sy)


def test_layouts_are_recognised():
    x, sx_g, sx_k, *_ = _operands()
    assert sx_g.stride() == (H, 1, NB * H) and sx_k.is_contiguous()
    assert gemm_host.sa_major_of(sx_k.permute(1, 0, 2)) == "k"
    assert gemm_host.sa_major_of(sx_g.permute(1, 0, 2)) == "g"
    padded = torch.zeros(NB, H, R // 128 + 1)[:, :, :R // 128]  # kb rows of 5 floats: not a 16-byte stride
    assert gemm_host.sa_major_of(padded.permute(1, 0, 2)) is None
    assert gemm_host.sa_major_of(sx_k[:, :6].permute(1, 0, 2)) == "k"  # h = 6: K-major needs only kb % 4 == 0
    six = torch.zeros(NB * 6, R // 128).t().contiguous().t().view(NB, 6, -1)  # G-major with h = 6: rows 24 bytes
    assert six.stride() == (6, 1, NB * 6) and gemm_host.sa_major_of(six.permute(1, 0, 2)) is None
    shifted = torch.zeros(sx_k.numel() + 1)[1:].view(sx_k.shape)
    assert gemm_host.sa_major_of(shifted.permute(1, 0, 2)) is None
    assert gemm_host.sa_major_of(shifted.permute(1, 0, 2), address=False) == "k"


@pytest.mark.parametrize("major", ["k", "g"])
def test_sx_read_where_it_lies_gives_the_copy_paths_bits(simulate, monkeypatch, major):
    x, sx_g, sx_k, y, sy, exact = _operands()
    sx = sx_k if major == "k" else sx_g
    d = _run(x, sx, y, sy)
    assert [cfg.sa_major for cfg in simulate] == [major]
    ref = _copy_path(monkeypatch, x, sx_k, y, sy)
    assert [cfg.sa_major for cfg in simulate[1:]] == ["m"]
    assert simulate[0].block_m == simulate[1].block_m and simulate[0].block_n == simulate[1].block_n
    assert not d.isnan().any() and torch.equal(d, ref)
    assert calc_diff(d, exact) < 1e-4


def test_other_strides_are_copied(simulate):
    x, _, sx_k, y, sy, exact = _operands()
    padded = torch.zeros(NB, H, R // 128 + 1)[:, :, :R // 128]
    padded.copy_(sx_k)
    d = _run(x, padded, y, sy)
    assert [cfg.sa_major for cfg in simulate] == ["m"] and calc_diff(d, exact) < 1e-4


# name: (header, original, planted, the layout it breaks)
PLANTED = {
    "sa_read_at_the_row_not_its_pitch": (
        "kernels/fp8_gemm.cuh",
        "sa[(frag_row + w * 64) * kSaPitch];",
        "sa[(frag_row + w * 64)];",
        "k"),
    "g_major_box_at_the_k_major_coordinates": (
        "kernels/fp8_gemm.cuh",
        "&params.tma_sa, bar, a_batch, row0,\n                                     static_cast<i32>(kb));",
        "&params.tma_sa, bar, static_cast<i32>(kb), row0,\n                                     a_batch);",
        "g"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bug_changes_the_bits(simulate, monkeypatch, tmp_path, bug):
    header, original, planted, major = PLANTED[bug]
    x, sx_g, sx_k, y, sy, exact = _operands()
    sx = sx_k if major == "k" else sx_g
    ref = _copy_path(monkeypatch, x, sx_k, y, sy)
    mutated_headers(tmp_path, monkeypatch, header, original, planted)
    d = _run(x, sx, y, sy)
    assert simulate[-1].sa_major == major
    assert not torch.equal(d, ref) and calc_diff(d, exact) > 1e-3
