"""Layout and housekeeping helpers."""

from __future__ import annotations

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import utils


def test_ceil_div_and_tma_aligned_size():
    assert [dfg.ceil_div(a, 128) for a in (0, 1, 128, 129, 256)] == [0, 1, 1, 2, 2]
    assert [dfg.get_tma_aligned_size(x, 4) for x in (0, 1, 4, 5, 130)] == [0, 4, 4, 8, 132]
    assert [dfg.get_tma_aligned_size(x, 2) for x in (1, 8, 9)] == [8, 8, 16]
    assert dfg.get_tma_aligned_size(17, 1) == 32
    with pytest.raises(ValueError, match="element_size"):
        dfg.get_tma_aligned_size(8, 3)
    with pytest.raises(ValueError, match="b=0"):
        dfg.ceil_div(1, 0)


@pytest.mark.parametrize("m", [1, 3, 4, 130])
def test_col_major_2d(m):
    s = torch.randn(m, 5)
    t = dfg.get_col_major_tma_aligned_tensor(s)
    aligned = dfg.get_tma_aligned_size(m, 4)
    assert t.shape == s.shape and t.stride() == (1, aligned)
    assert torch.equal(t, s)
    assert dfg.get_col_major_tma_aligned_tensor(t) is t  # already in layout: no copy


@pytest.mark.parametrize("m", [1, 6, 128])
def test_col_major_3d(m):
    s = torch.randn(3, m, 2)
    t = dfg.get_col_major_tma_aligned_tensor(s)
    aligned = dfg.get_tma_aligned_size(m, 4)
    assert t.stride() == (aligned * 2, 1, aligned)
    assert torch.equal(t, s)
    assert dfg.get_col_major_tma_aligned_tensor(t) is t


def test_col_major_accepts_any_input_layout_and_empty():
    s = torch.randn(7, 12).t()  # [12, 7] with strides (1, 12): M-major but 12 is aligned -> as-is
    assert dfg.get_col_major_tma_aligned_tensor(s) is s
    s = torch.randn(9, 6).t()[:, ::2]  # strided view
    t = dfg.get_col_major_tma_aligned_tensor(s)
    assert torch.equal(t, s) and t.stride() == (1, 8)
    empty = dfg.get_col_major_tma_aligned_tensor(torch.empty(0, 3))
    assert empty.shape == (0, 3) and empty.stride() == (1, 0)
    empty3 = dfg.get_col_major_tma_aligned_tensor(torch.empty(2, 0, 3))
    assert empty3.shape == (2, 0, 3)


def test_col_major_rejects_bad_input():
    with pytest.raises(TypeError, match="s.dtype"):
        dfg.get_col_major_tma_aligned_tensor(torch.zeros(4, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="shape"):
        dfg.get_col_major_tma_aligned_tensor(torch.zeros(4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        dfg.get_col_major_tma_aligned_tensor([[1.0]])


def test_m_alignment():
    assert dfg.get_m_alignment_for_contiguous_layout() == 128


@pytest.fixture
def restore_num_sms():
    yield
    utils.reset_num_sms()


def test_num_sms(restore_num_sms):
    default = dfg.get_num_sms()
    if not torch.cuda.is_available():
        assert default == 132
    dfg.set_num_sms(7)
    assert dfg.get_num_sms() == 7
    dfg.set_num_sms(0)  # the reference's meaning: every SM of the device
    assert dfg.get_num_sms() == default
    dfg.set_num_sms(7)
    upper = default  # the device's SM count, or 132 with no device
    with pytest.raises(ValueError, match=rf"num_sms must be in \[0, {upper}\].*got {upper + 1}"):
        dfg.set_num_sms(upper + 1)
    with pytest.raises(ValueError, match=r"got -1"):
        dfg.set_num_sms(-1)
    for bad in (True, 1.5, "8"):
        with pytest.raises(TypeError, match="num_sms"):
            dfg.set_num_sms(bad)
    assert dfg.get_num_sms() == 7  # failed calls change nothing
    dfg.set_num_sms(upper)
    assert dfg.get_num_sms() == upper
    utils.reset_num_sms()
    assert dfg.get_num_sms() == default


def test_the_package_and_the_2x_surface_agree():
    """One 2.x surface: every name both deep_fp8_gemm and deep_fp8_gemm.compat export is the same object, but the
    three casts (the package's own, device-independent; compat's, the reference's bits); the knobs included."""
    from deep_fp8_gemm import compat

    shared = set(dfg.__all__) & set(compat.__all__)
    assert {"set_num_sms", "get_num_sms", "set_pdl", "fp8_gemm_nt"} <= shared
    differ = {name for name in shared if getattr(dfg, name) is not getattr(compat, name)}
    assert differ == {"per_token_cast_to_fp8", "per_block_cast_to_fp8", "per_channel_cast_to_fp8"}, differ


def test_calc_diff():
    x = torch.randn(64, 64)
    assert dfg.calc_diff(x, x) == 0.0
    assert dfg.calc_diff(x, -x) == pytest.approx(2.0)
    assert dfg.calc_diff(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == pytest.approx(1.0)
    assert dfg.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert dfg.calc_diff(x.bfloat16(), x) < 1e-4
    with pytest.raises(ValueError, match="shape"):
        dfg.calc_diff(torch.zeros(3), torch.zeros(4))
