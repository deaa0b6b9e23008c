"""Every case the GPU tests (and device_check's benchmarks) launch is legal by the library's own rules, on the CPU.

A GPU test that is illegal fails only on the GPU, whose runs are short and rare; here, without a GPU:
  * GEMMs (tests/gpu/test_gpu_gemm.py ``launch_cases``, tests/gpu/test_gpu_smoke.py, bench/shapes.py tables): the
    operand checks of the public op (its family's ``check``), the config (the heuristic's, or the forced
    one) through ``config.check_config``, every tensor map through ``TensorMapSpec.validate`` (the driver's
    cuTensorMapEncodeTiled rules), and the launch shape through the driver layer's launch-config checks;
  * TMA round trips (tests/gpu/test_gpu_jit.py ``TMA_CASES``): both tensor maps, the launch, and that the
    epilogue's D map (bf16, SWIZZLE_32B, box 16 x rows) and every (dtype, swizzle) the GEMM maps use has a case;
  * quantisers (tests/kernels/test_quant_kernels.py, tests/ops/test_quant.py, the smoke step): the host path of the
    fused kernels (kernels/quant.py) with a launcher that checks the kernel config and the launch instead
    of running it;
  * the plain JIT kernels' launches (scale, cluster);
  * the model-facing layers' GPU tests (MoE, FP8Linear, the validation test): their launches recorded on the CPU.
``test_gpu_parameters_come_from_case_tables`` keeps this complete: every ``parametrize`` of a GPU test
must take its values from a table its module lists in ``GPU_CASE_TABLES``.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from deep_fp8_gemm import ops
from deep_fp8_gemm.config import FP8_OUTPUT_KINDS, LAYOUT_OF, SMEM_LIMIT, GemmConfig, check_config, output_columns
from deep_fp8_gemm.config import k_grouped_config
from deep_fp8_gemm.kernels import gemm, group_maps
from deep_fp8_gemm.kinds import TABLE
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec, TmaDtype, TmaSwizzle
from deep_fp8_gemm.utils import get_col_major_tma_aligned_tensor
from deep_fp8_gemm.ops import outputs
from tests.gpu import (test_gpu_attention, test_gpu_batch_invariance, test_gpu_bf16, test_gpu_bf16_ops,
                       test_gpu_block32, test_gpu_fp8_output, test_gpu_gemm, test_gpu_jit, test_gpu_mxfp4, test_gpu_smoke,
                       test_gpu_swap_ab)
# test_gpu_attention's cases' legality: its own test_gpu_cases_are_legal_on_the_cpu
from tests.kernels import test_cast_transpose_kernels, test_quant_kernels
from tests.ops import test_k_grouped, test_quant

GPU_MODULES = (test_gpu_gemm, test_gpu_jit, test_gpu_smoke, test_quant, test_quant_kernels, test_k_grouped,
               test_cast_transpose_kernels, test_gpu_fp8_output, test_gpu_swap_ab, test_gpu_batch_invariance,
               test_gpu_block32, test_gpu_attention, test_gpu_bf16, test_gpu_bf16_ops, test_gpu_mxfp4)
NUM_SMS = 132  # H100 / H200
FP8 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------------------------- checkers
def _launch(grid: int, block: int, cluster: int, smem_bytes: int) -> None:
    """The driver layer's launch-shape rules, plus the sm_90 per-block shared-memory limit."""
    drv._launch_config(grid, block, cluster, smem_bytes, 0)
    if smem_bytes > SMEM_LIMIT:
        raise ValueError(f"{smem_bytes} B of dynamic shared memory exceeds the sm_90 limit {SMEM_LIMIT} B")


def check_gemm_case(case: dict) -> GemmConfig:
    """Operands of the case's shapes (uninitialised CPU tensors: only shapes, strides and addresses matter)
    through the op's validation, the config through check_config, the tensor maps and the launch."""
    kind, a_shape, n, k = case["kind"], tuple(case["a_shape"]), case["n"], case["k"]
    groups, expected_m = case.get("groups"), case.get("expected_m")
    gran = TABLE.traits(kind, "granularity")  # 128 x 128, or the 1x32 / 32x32 recipe's 32 x 32
    kb = -(-k // gran["gran_k"])
    a = torch.empty(a_shape, dtype=FP8)
    sa = torch.empty((*a_shape[:-1], kb), dtype=torch.float32)
    b_lead = () if LAYOUT_OF[kind] == "dense" else (groups,)
    b = torch.empty((*b_lead, n, k), dtype=FP8)
    sb = torch.empty((*b_lead, -(-n // gran["gran_n"]), kb), dtype=torch.float32)
    out = torch.empty((*a_shape[:-1], n), dtype=torch.bfloat16)
    if kind in FP8_OUTPUT_KINDS:  # the output pair of the FP8-output and SwiGLU kinds (issue 27)
        out, sd = outputs.empty_out(a_shape[:-2], a_shape[-2], output_columns(kind, n), "cpu")
        layout = LAYOUT_OF[kind]
        extra = (() if layout == "dense" else (torch.empty(a_shape[0], dtype=torch.int32),) if layout == "contiguous"
                 else (torch.empty(groups, dtype=torch.int32),) if layout == "psum"
                 else (torch.empty(groups, dtype=torch.int32), expected_m))
        ops.FAMILIES[kind].check(a, sa, b, sb, out, sd, *extra)
    elif LAYOUT_OF[kind] == "dense":  # dense, dense_block32
        ops.FAMILIES[kind].check(a, sa, b, sb, out)
    elif kind == "contiguous":
        ops.FAMILIES["contiguous"].check(a, sa, b, sb, out, torch.empty(a_shape[0], dtype=torch.int32))
    else:
        ops.FAMILIES["masked"].check(a, sa, b, sb, out, torch.empty(groups, dtype=torch.int32), expected_m)
    cfg = case.get("config") or ops.FAMILIES[kind].plan(a, b, expected_m, NUM_SMS)
    check_config(cfg)
    for spec in gemm.tensor_map_specs_1d2d(cfg, a, get_col_major_tma_aligned_tensor(sa), b, out):
        spec.validate()
    _launch(cfg.grid_size, cfg.num_threads, cfg.cluster_size, cfg.smem_bytes)
    return cfg


def check_k_grouped_case(case: tuple) -> None:
    """A k-grouped GEMM (m, n, ks): the public op's checks, the config, every per-group and scale map, the launch."""
    m, n, ks = case
    k_sum = sum(ks)
    a, b = torch.empty(m * k_sum, dtype=FP8), torch.empty(n * k_sum, dtype=FP8)
    sa, sb = torch.empty(m, k_sum // 128), torch.empty(n, k_sum // 128)
    d, c = torch.empty(len(ks), m, n), torch.empty(len(ks), m, n)
    ops.FAMILIES["k_grouped"].check(a, sa, b, sb, d, ks, torch.tensor(ks, dtype=torch.int32), c)
    cfg = k_grouped_config(m, n, len(ks), NUM_SMS)
    check_config(cfg)
    templates = group_maps.template_map_args(cfg, a, b, m, n)
    for args in [*templates, *gemm.k_grouped_scale_map_args(cfg, get_col_major_tma_aligned_tensor(sa),
                                                             get_col_major_tma_aligned_tensor(sb), m, n)]:
        TensorMapSpec(*args).validate()
    for g, k in enumerate(ks):  # every map the builder derives from the templates is a legal one too
        if k:
            k_off = sum(ks[:g])
            for (dtype, base, dims, _, box, swizzle), rows in zip(templates, (m, n)):
                TensorMapSpec(dtype, base + rows * k_off, (k, dims[1], 1), (k, rows * k), box, swizzle).validate()
    _launch(-(-2 * len(ks) // group_maps.WARPS), group_maps.NUM_THREADS, 1, group_maps.SMEM_BYTES)
    _launch(cfg.grid_size, cfg.num_threads, cfg.cluster_size, cfg.smem_bytes)


def _check_quant_launch(config: kq.QuantKernelConfig, params, grid: int, device) -> None:
    kq.render_source(config)  # every template constant present
    _launch(grid, config.num_threads, 1, config.smem_bytes)


def check_quant_call(fn: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """The fused quantisers' host path (kernels/quant.py) on a CPU tensor, launching nothing."""
    x = torch.empty(shape, dtype=dtype)
    if fn == "per_block":
        kq.run_per_block(x, launch=_check_quant_launch)
    else:
        kind = kq.QuantKind.PER_TOKEN if fn == "per_token" else kq.QuantKind.SILU_MUL_PER_TOKEN
        kq.run_per_token(x, kind, "x", launch=_check_quant_launch)


def check_transpose_call(fn: str, shape: tuple, dtype: torch.dtype) -> None:
    """The cast-transpose kernels' host path on a CPU tensor (shape: (m, k), or (ks, n) for k_grouped)."""
    if fn == "cast_transpose":
        kq.run_cast_transpose(torch.empty(shape, dtype=dtype), launch=_check_quant_launch)
    else:
        ks, n = shape
        kq.run_k_grouped_transpose(torch.empty(sum(ks), n, dtype=dtype), list(ks), launch=_check_quant_launch)


def check_tma_case(case: tuple) -> None:
    geo = test_gpu_jit.TmaGeometry(*case)
    for address in (0x7F0000000000, 0x7F0000100000):  # load and store maps (16-byte-aligned tensors)
        geo.spec(address).validate()
    _launch(geo.num_blocks, 128, 1, geo.smem_bytes)


def _problems(cases, check, label) -> list[str]:
    problems = []
    for case in cases:
        try:
            check(case)
        except (ValueError, TypeError) as exc:
            problems.append(f"{label(case)}: {exc}")
    return problems


def _gemm_label(case: dict) -> str:
    return f"{case['test']} {case['kind']} A{tuple(case['a_shape'])} n={case['n']} k={case['k']}"


def bench_gemm_cases() -> list[dict]:
    """The GEMMs of device_check's benchmarks (bench/shapes.py, quick and full tables)."""
    from bench import shapes

    cases = []
    for quick in (True, False):
        for s in shapes.dense_shapes("all", quick=quick):
            cases.append(dict(kind="dense", a_shape=(s.m, s.k), n=s.n, k=s.k, test=f"bench {s.label}"))
        for s in shapes.contiguous_shapes(quick=quick):
            cases.append(dict(kind="contiguous", a_shape=(s.num_groups * s.segment, s.k), n=s.n, k=s.k,
                              groups=s.num_groups, test=f"bench contiguous {s.label}"))
        for s in shapes.masked_shapes(quick=quick):
            cases.append(dict(kind="masked", a_shape=(s.num_groups, s.rows_per_group, s.k), n=s.n, k=s.k,
                              groups=s.num_groups, expected_m=s.expected_m, test=f"bench masked {s.label}"))
    return cases


def layer_launches() -> tuple[list[dict], list[tuple]]:
    """The GEMMs and quantisers launched by the GPU tests of the model-facing layers (tests/model/test_moe.py,
    tests/model/test_nn.py, tests/ops/test_validation.py), recorded by running the same calls on CPU tensors (same shapes;
    the CPU path computes with the reference) with the ops' device dispatch and the torch quantisers wrapped."""
    import deep_fp8_gemm as dfg_pkg
    from deep_fp8_gemm import moe, nn as dfg_nn, quant
    from tests import _gemm_cases
    from tests.model import test_moe, test_nn

    gemms, quants = [], []
    per_token, per_block, silu = (quant.per_token_cast_to_fp8_torch, quant.per_block_cast_to_fp8_torch,
                                  quant.silu_mul_quant_torch)

    def gemm_recorder(kind, dispatch):
        def record_gemm(a, sa, b, sb, out, grouped_layout=None, expected_m=None):
            gemms.append(dict(kind=kind, a_shape=tuple(a.shape), n=b.shape[-2], k=b.shape[-1],
                              groups=b.shape[0] if b.dim() == 3 else None, expected_m=expected_m, test="layer"))
            return dispatch(a, sa, b, sb, out, grouped_layout, expected_m)
        return record_gemm

    def fp8_recorder(kind, dispatch):
        def record_fp8(a, sa, b, sb, d, sd, grouped_layout=None, expected_m=None, use_ue8m0=False):
            gemms.append(dict(kind=kind, a_shape=tuple(a.shape), n=b.shape[-2], k=b.shape[-1],
                              groups=b.shape[0] if b.dim() == 3 else None, expected_m=expected_m, test="layer"))
            return dispatch(a, sa, b, sb, d, sd, grouped_layout, expected_m, use_ue8m0)
        return record_fp8

    def recorder(name, fn):
        def wrapped(x, *args):
            quants.append((name, tuple(x.shape), x.dtype))
            return fn(x, *args)
        return wrapped

    with pytest.MonkeyPatch.context() as mp:
        for kind in ("dense", "contiguous", "masked", "psum"):  # the family records: the one dispatch seam
            family = ops.FAMILIES[kind]
            mp.setattr(family, "dispatch", gemm_recorder(kind, family.dispatch))
        for kind in FP8_OUTPUT_KINDS:  # (a, sa, b, sb, d, sd, grouped_layout, expected_m, use_ue8m0)
            family = ops.FAMILIES[kind]
            mp.setattr(family, "dispatch", fp8_recorder(kind, family.dispatch))
        mp.setattr(quant, "per_token_cast_to_fp8_torch", recorder("per_token", per_token))
        mp.setattr(quant, "per_block_cast_to_fp8_torch", recorder("per_block", per_block))
        mp.setattr(quant, "silu_mul_quant_torch", recorder("silu_mul", silu))
        E, H, I = test_moe.E, test_moe.H, test_moe.I  # noqa: E741
        layer = moe.FP8MoE.from_weights(torch.randn(E, 2 * I, H, dtype=torch.bfloat16),
                                        torch.randn(E, H, I, dtype=torch.bfloat16))
        w = test_moe._weights(layer)
        del gemms[:], quants[:]  # weight quantisation happens on the CPU in the GPU tests too
        # test_moe.test_gpu_matches_cpu, test_gpu_masked_cuda_graph
        hidden, ids, weights = test_moe._inputs(256, seed=11, drop=0.1, empty_experts=(3,))
        moe.fp8_moe_forward(hidden, ids, weights, *w)
        moe.fp8_moe_forward(hidden, ids, weights, *w, max_m_sum=dfg_pkg.layout.max_m_sum_bound(ids.numel(), E))
        moe.fp8_moe_forward_masked(torch.randn(E, 16, H, dtype=torch.bfloat16),
                                   torch.tensor([16, 0, 3, 1, 16, 5, 0, 9], dtype=torch.int32), *w)
        # tests/gpu/test_gpu_fp8_output.py::test_moe_layer_fused_on_the_gpu: the module's fused forwards
        layer(hidden, ids, weights)
        moe.fp8_moe_forward_masked(torch.randn(E, 16, H, dtype=torch.bfloat16),
                                   torch.tensor([16, 0, 3, 1, 16, 5, 0, 9], dtype=torch.int32), *w,
                                   w13_swiglu=layer.swiglu_pair)
        # test_nn.test_gpu_matches_cpu (the weight is quantised on the CPU there too)
        fp8 = dfg_nn.FP8Linear.from_linear(test_nn._linear(7168, 2112, bias=True))
        del quants[-1:]
        fp8(torch.randn(64, 7168, dtype=torch.bfloat16))
        # test_validation.test_cuda_sm90_matches_reference
        before = len(quants)
        args = _gemm_cases.dense_args()  # operands quantised on the CPU there as well
        del quants[before:]
        _gemm_cases.call_gemm("dense", args)
    return gemms, quants


FAMILIES = {
    "gemm": lambda: _problems(test_gpu_gemm.launch_cases() + test_gpu_smoke.launch_cases(), check_gemm_case,
                              _gemm_label),
    "bench": lambda: _problems(bench_gemm_cases(), check_gemm_case, _gemm_label),
    "fp8_output": lambda: _problems(test_gpu_fp8_output.launch_cases(), check_gemm_case, _gemm_label),
    "swap_ab": lambda: _problems(test_gpu_swap_ab.launch_cases(), check_gemm_case, _gemm_label),
    "batch_invariance": lambda: _problems(test_gpu_batch_invariance.launch_cases(), check_gemm_case, _gemm_label),
    "block32": lambda: _problems(test_gpu_block32.launch_cases(), check_gemm_case, _gemm_label),
    "k_grouped": lambda: _problems(test_k_grouped.K_GROUPED_GPU_CASES, check_k_grouped_case,
                                   lambda c: f"k-grouped (m, n, ks) = {c}"),
    "tma": lambda: _problems(test_gpu_jit.TMA_CASES, check_tma_case, lambda c: f"TMA case {c}"),
    "quant": lambda: _problems(
        test_quant_kernels.gpu_quant_inputs() + test_gpu_smoke.quant_calls()
        + [(fn, shape, torch.bfloat16) for shape in test_quant.GPU_SHAPES for fn in ("per_token", "per_block")],
        lambda c: check_quant_call(*c), lambda c: f"quantiser {c}"),
    "cast_transpose": lambda: _problems(test_cast_transpose_kernels.gpu_transpose_calls(),
                                       lambda c: check_transpose_call(*c), lambda c: f"cast-transpose {c}"),
    "layers": lambda: (lambda g, q: _problems(g, check_gemm_case, _gemm_label)
                       + _problems(q, lambda c: check_quant_call(*c), lambda c: f"layer quantiser {c}"))(*layer_launches()),
    "launch": lambda: _problems(
        [((test_gpu_jit.SCALE_N + 127) // 128, 128, 1, test_gpu_jit.SCALE_SMEM_BYTES)]
        + [(test_gpu_jit.CLUSTER_GRID, 128, c, 0) for c in test_gpu_jit.CLUSTER_SIZES],
        lambda c: _launch(*c), lambda c: f"launch (grid, block, cluster, smem) = {c}"),
}


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gpu_cases_are_legal(family):
    problems = FAMILIES[family]()
    assert not problems, f"{len(problems)} illegal GPU case(s):\n" + "\n".join(problems)


def test_gpu_cases_cover_the_kernels_tensor_maps():
    """The TMA round trips exercise every (dtype, swizzle) the GEMM's maps use, and the epilogue's exact D box."""
    covered = {(dtype, swizzle) for _, dtype, swizzle, _ in test_gpu_jit.TMA_CASES}
    boxes = {(tma_dtype, swizzle, test_gpu_jit.TmaGeometry(t, tma_dtype, swizzle, rows).box)
             for t, tma_dtype, swizzle, rows in test_gpu_jit.TMA_CASES}
    for block_m in (64, 128, 256):  # wg_rows 64 and 128
        block_n = 112 if block_m == 256 else 128
        cfg = GemmConfig(kind="dense", shape_n=4096, shape_k=1024, num_groups=1, block_m=block_m, block_n=block_n, num_stages=3, cluster_m=1, cluster_n=1, band_width=16, grid_size=NUM_SMS)
        a, sa = torch.empty(256, 1024, dtype=FP8), get_col_major_tma_aligned_tensor(torch.empty(256, 8))
        b, out = torch.empty(4096, 1024, dtype=FP8), torch.empty(256, 4096, dtype=torch.bfloat16)
        maps = gemm.tensor_map_args_1d2d(cfg, a, sa, b, out)
        for dtype, _, _, _, box, swizzle in maps:
            assert (dtype, swizzle) in covered, f"no TMA round trip for ({dtype.name}, {swizzle.name})"
        d_dtype, _, _, _, d_box, d_swizzle = maps[3]
        assert (d_dtype, d_swizzle) == (TmaDtype.BFLOAT16, TmaSwizzle.B32)
        assert (d_dtype, d_swizzle, d_box) in boxes, f"the epilogue's D box {d_box} has no round trip (block_m={block_m})"


def _parametrize_tables(fn) -> list[tuple[str, object]]:
    return [(m.args[0], m.args[1]) for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]


def _is_gpu_test(module, fn) -> bool:
    module_marks = getattr(module, "pytestmark", [])
    module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
    return any(m.name == "gpu" for m in list(getattr(fn, "pytestmark", [])) + module_marks)


@pytest.mark.parametrize("module", GPU_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_gpu_parameters_come_from_case_tables(module):
    tables = getattr(module, "GPU_CASE_TABLES", None)
    assert tables is not None, f"{module.__name__} declares no GPU_CASE_TABLES"
    gpu_tests = [fn for name, fn in inspect.getmembers(module, inspect.isfunction)
                 if name.startswith("test_") and fn.__module__ == module.__name__ and _is_gpu_test(module, fn)]
    assert gpu_tests, f"no GPU tests found in {module.__name__}"
    for fn in gpu_tests:
        for argnames, values in _parametrize_tables(fn):
            assert any(values is t for t in tables), (
                f"{module.__name__}.{fn.__name__}: parametrize({argnames!r}) values are not one of the module's "
                "GPU_CASE_TABLES, so tests/gpu/test_gpu_cases.py cannot check them; declare them as a table"
            )
