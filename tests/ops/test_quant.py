"""Quantisation against an independent float64 model of e4m3 rounding (nearest even, saturating at 448)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests._hypothesis import given, settings, st  # stand-ins (skips) without hypothesis

import deep_fp8_gemm as dfg
from deep_fp8_gemm import quant
from torch.utils._python_dispatch import TorchDispatchMode

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6  # smallest normal: 2**-6
E4M3_MANTISSA_BITS = 3


def e4m3_round(v: np.ndarray) -> np.ndarray:
    """float64 -> nearest float8_e4m3fn value (ties to even, subnormals, saturation at ±448), as float64."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    _, exponent = np.frexp(a)  # a = f · 2**exponent with f in [0.5, 1)
    binade = np.maximum(exponent - 1, E4M3_MIN_NORMAL_EXP)  # subnormals share the step of the lowest binade
    step = np.ldexp(1.0, binade - E4M3_MANTISSA_BITS)
    rounded = np.round(a / step) * step  # np.round: half to even; a / step is exact (power-of-two step)
    return np.copysign(np.minimum(rounded, E4M3_MAX), v)


def model_quantise(x: torch.Tensor, rows_per_group: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 model of per-token (rows_per_group=1) / per-block (128) quantisation of x [r, k]."""
    xv = x.float().numpy()  # the op computes in float32
    r, k = xv.shape
    rb, kb = -(-r // rows_per_group), -(-k // 128)
    padded = np.zeros((rb * rows_per_group, kb * 128), dtype=np.float32)
    padded[:r, :k] = xv
    groups = np.abs(padded).reshape(rb, rows_per_group, kb, 128)
    amax = np.maximum(groups.max(axis=(1, 3)), np.float32(1e-4))
    scale = (amax.astype(np.float64) / 448.0).astype(np.float32)  # float32 division, correctly rounded
    full_scale = np.repeat(np.repeat(scale, rows_per_group, axis=0), 128, axis=1)[:r, :k]
    quotient = (xv.astype(np.float64) / full_scale.astype(np.float64)).astype(np.float32)
    clamped = np.clip(quotient.astype(np.float64), -E4M3_MAX, E4M3_MAX)
    return e4m3_round(clamped), scale.astype(np.float64)


def check_against_model(x: torch.Tensor, per_token: bool) -> None:
    if per_token:
        q, s = dfg.per_token_cast_to_fp8(x)
        expected_q, expected_s = model_quantise(x, 1)
    else:
        q, s = dfg.per_block_cast_to_fp8(x)
        expected_q, expected_s = model_quantise(x, 128)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == expected_s.shape
    np.testing.assert_array_equal(s.double().numpy(), expected_s)
    np.testing.assert_array_equal(q.float().double().numpy(), expected_q)


def test_model_is_exact_on_the_e4m3_grid():
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().double().numpy()
    finite = grid[np.isfinite(grid)]
    np.testing.assert_array_equal(e4m3_round(finite), finite)
    # ties go to the even mantissa: 1 + 1/16 -> 1, 1 + 3/16 -> 1.25; subnormal tie 2**-10 -> 0
    np.testing.assert_array_equal(e4m3_round([1 + 1 / 16, 1 + 3 / 16, 2.0**-10, 3 * 2.0**-10]), [1, 1.25, 0, 2**-8])
    np.testing.assert_array_equal(e4m3_round([460.0, -1e9]), [448.0, -448.0])


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "per_block"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(4, 128), (130, 256), (3, 200), (257, 40), (1, 1)])
def test_random_values_match_model(per_token, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g) * torch.rand(shape, generator=g).pow(4).mul(100)).to(dtype)
    check_against_model(x, per_token)


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "per_block"])
def test_zero_groups_huge_and_tiny_values(per_token):
    x = torch.zeros(256, 384)
    x[0, :128] = 3e38  # huge: scale ~6.7e35, every value exactly ±448
    x[0, 130] = -3e38
    x[1, 128:256] = torch.linspace(-1e-3, 1e-3, 128)  # whole group below the amax floor
    x[2, 256:] = torch.logspace(-12, 4, 128)  # tiny values fall into e4m3 subnormals / zero
    x[200, 5] = 7.0
    check_against_model(x, per_token)
    q, s = (dfg.per_token_cast_to_fp8 if per_token else dfg.per_block_cast_to_fp8)(x)
    assert torch.isfinite(q.float()).all() and torch.isfinite(s).all()
    assert q.float().abs().max().item() == 448.0
    assert s.min().item() == pytest.approx(1e-4 / 448)  # all-zero groups get the floor, not 0 / NaN


def test_per_token_scales_layout_and_dequantisation():
    x = torch.randn(37, 300, dtype=torch.bfloat16)
    q, s = dfg.per_token_cast_to_fp8(x)
    assert s.shape == (37, 3) and s.stride() == (1, dfg.get_tma_aligned_size(37, 4))
    assert dfg.get_col_major_tma_aligned_tensor(s) is s  # ready for a GEMM without a copy
    deq = q.float() * s.repeat_interleave(128, dim=1)[:, :300]
    assert dfg.calc_diff(deq, x.float()) < 1e-3


def test_per_block_scales_layout_and_n_not_multiple_of_128():
    w = torch.randn(200, 130)
    q, s = dfg.per_block_cast_to_fp8(w)
    assert s.shape == (2, 2) and s.is_contiguous()
    expanded = s.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :130]
    assert dfg.calc_diff(q.float() * expanded, w) < 1e-3


def test_non_contiguous_input_and_empty_rows():
    x = torch.randn(256, 64).t()  # [64, 256], column-major
    check_against_model(x, True)
    q, s = dfg.per_token_cast_to_fp8(torch.empty(0, 256))
    assert q.shape == (0, 256) and s.shape == (0, 2)
    q, s = dfg.per_block_cast_to_fp8(torch.empty(0, 256))
    assert q.shape == (0, 256) and s.shape == (0, 2)


class _RecordDivisions(TorchDispatchMode):
    """Records (dividend, divisor) of every aten division the wrapped code dispatches."""

    def __init__(self):
        super().__init__()
        self.divisions: list[tuple[object, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.div, torch.ops.aten.div_, torch.ops.aten.true_divide,
                                   torch.ops.aten.reciprocal, torch.ops.aten.reciprocal_):
            self.divisions.append((args[0], args[1] if len(args) > 1 else None))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "fn, rows",
    [(quant.per_token_cast_to_fp8_torch, 130), (quant.per_block_cast_to_fp8_torch, 130),
     (quant.per_channel_cast_to_fp8, 256)],  # per-channel scales need whole 128-row groups
    ids=["per_token", "per_block", "per_channel"],
)
def test_torch_path_divides_by_tensors_only(fn, rows):
    """Pins the torch path's arithmetic to what the fused kernels do on CUDA (IEEE division).

    A Python-scalar (or 0-dim / CPU-scalar) divisor is a true division on the CPU but ``x * (1/d)`` in
    ATen's CUDA kernel (BinaryDivTrueKernel.cu), which moves about half of all scales by 1 ulp; the CPU
    values cannot show it, so the operands are checked: every division divides a tensor by a tensor of
    the same device and rank, and nothing takes a reciprocal.
    """
    x = torch.randn(rows, 300)
    with _RecordDivisions() as rec:
        fn(x)
    assert len(rec.divisions) == 2, f"expected the scale and the value divisions, got {len(rec.divisions)}"
    for dividend, divisor in rec.divisions:
        assert isinstance(divisor, torch.Tensor), f"division by the Python scalar {divisor!r}"
        assert divisor.device == dividend.device and divisor.dim() == dividend.dim() > 0, (
            f"divisor {tuple(divisor.shape)} on {divisor.device} for dividend {tuple(dividend.shape)}: "
            "a 0-dim or other-device divisor is a CPU scalar to ATen's CUDA division (reciprocal multiply)"
        )


def test_scales_are_true_division_not_reciprocal_multiply():
    """The scales are float32(amax / 448) correctly rounded; x * float32(1/448), the CUDA CPU-scalar path,
    differs in a large fraction of cases, so this comparison detects that arithmetic wherever it runs."""
    x = torch.randn(4096, 128) * torch.rand(4096, 1) * 1000
    _, s = quant.per_token_cast_to_fp8_torch(x)
    amax = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-4)
    true_div = (amax.double() / 448.0).float()  # float64 then float32: correctly rounded float32 division
    reciprocal = amax * torch.tensor(1 / 448.0, dtype=torch.float32)
    assert torch.equal(s, true_div)
    assert (reciprocal != true_div).float().mean() > 0.1, "the reference no longer tells the two apart"


@settings(deadline=None, max_examples=30)
@given(
    m=st.integers(0, 300),
    k=st.integers(1, 400),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    per_token=st.booleans(),
    seed=st.integers(0, 2**16),
    log_scale=st.floats(-14, 10),  # keeps float16 inputs finite
)
def test_property_any_shape_matches_model(m, k, dtype, per_token, seed, log_scale):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 2.0**log_scale).to(dtype)
    check_against_model(x, per_token)


GPU_SHAPES = [(1, 128), (300, 7168), (129, 200)]  # bf16 inputs; tests/gpu/test_gpu_cases.py checks them on the CPU
GPU_CASE_TABLES = (GPU_SHAPES,)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES)
def test_cuda_quantisers_match_cpu_bits(shape):
    """On sm_90 the ops dispatch to the fused kernels, which must give the CPU definition's bits."""
    x = torch.randn(shape, dtype=torch.bfloat16)
    for fn in (dfg.per_token_cast_to_fp8, dfg.per_block_cast_to_fp8):
        q_cpu, s_cpu = fn(x)
        q_gpu, s_gpu = fn(x.cuda())
        assert s_gpu.stride() == s_cpu.stride()
        assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
        assert torch.equal(s_gpu.cpu(), s_cpu)
