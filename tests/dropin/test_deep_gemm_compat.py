"""``import deep_fp8_gemm as deep_gemm`` in code written against the reference design's 2.x API.

Every name is resolved the way its consumers resolve it (``getattr`` / ``hasattr`` on the module) and called
with their argument conventions; each call cites the consumer and file it mirrors. Each GEMM runs on the CPU
path (the exact reference) and through the real kernels in the CPU simulator (``DFG_SIMULATE=1``), into
NaN-poisoned outputs, against an independent float64 model (``tests/_operands.gemm64``): calc_diff < 1e-3.

Consumers cited: vLLM ``vllm/utils/deep_gemm.py`` (``_resolve_symbol`` of ``fp8_gemm_nt``,
``m_grouped_fp8_gemm_nt_contiguous``, ``fp8_m_grouped_gemm_nt_masked``, ``transform_sf_into_required_layout``,
``get_mk_alignment_for_contiguous_layout``; every GEMM gets ``disable_ue8m0_cast=not is_deep_gemm_e8m0_used()``),
vLLM ``vllm/model_executor/layers/quantization/utils/fp8_utils.py`` (``deepgemm_post_process_fp8_weight_block``),
SGLang ``python/sglang/srt/layers/deep_gemm_wrapper/entrypoint.py`` (``recipe_a`` / ``recipe_b`` kwargs,
``set_num_sms`` around a call), and the reference's own tests / DeepEP v2 users for the psum layout
(``use_psum_layout=True, expected_m_for_psum_layout=...``) and the casts (``per_token_cast_to_fp8(x, use_ue8m0)``).
torchao and TensorRT-LLM call the same names with ``recipe`` / ``disable_ue8m0_cast`` / ``use_psum_layout``
(ANCHORS.md section 6); those keyword forms are exercised below.
"""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch

import deep_fp8_gemm as deep_gemm  # the drop-in spelling
from tests._gpu import requires_sm90
from tests._operands import dequant64, gemm64

N, K = 256, 256  # one (N, K) everywhere: the simulator builds one kernel per config
ALIGN = 128


@pytest.fixture(params=["cpu", "simulator"])
def path(request, monkeypatch):
    """Run each call on the CPU reference and through the real kernels in the CPU simulator."""
    launched = []
    if request.param == "simulator":
        if shutil.which("g++") is None:
            pytest.skip("the simulator builds kernels with g++")
        from deep_fp8_gemm.kernels import gemm as gemm_module

        real_run = gemm_module.launch_1d2d
        monkeypatch.setattr(gemm_module, "launch_1d2d",
                            lambda cfg, *args: (launched.append(cfg.kind), real_run(cfg, *args))[1])
        monkeypatch.setenv("DFG_SIMULATE", "1")
        monkeypatch.setenv("DFG_SIM_NUM_SMS", "3")
    yield request.param
    if request.param == "simulator":
        assert launched, "DFG_SIMULATE=1 but no kernel ran in the simulator"


def _resolve_symbol(module, new: str, old: str):
    """vLLM's ``_resolve_symbol`` (vllm/utils/deep_gemm.py): the new name if present, else the legacy one.
    Here the new one must be found: a fallback would mean the 2.x name is missing."""
    assert hasattr(module, new), f"deep_fp8_gemm lacks the 2.x name {new}"
    return getattr(module, new) if hasattr(module, new) else getattr(module, old)


def _cast_activations(m: int, use_ue8m0: bool, seed: int):
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(seed))
    return deep_gemm.per_token_cast_to_fp8(x, use_ue8m0)  # reference tests: positional use_ue8m0


def _cast_weights(groups: int | None, use_ue8m0: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    if groups is None:
        return deep_gemm.per_block_cast_to_fp8(torch.randn(N, K, generator=g), use_ue8m0)
    pairs = [deep_gemm.per_block_cast_to_fp8(torch.randn(N, K, generator=g), use_ue8m0) for _ in range(groups)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _assert_close(out: torch.Tensor, a, sa, b, sb) -> None:
    assert not out.isnan().any(), "rows left unwritten"
    expected = torch.from_numpy(gemm64(a, sa.contiguous(), b, sb).value)
    assert deep_gemm.calc_diff(out, expected) < 1e-3


def _nan(*shape) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------------- names
VLLM_NAMES = [  # vllm/utils/deep_gemm.py: (new, legacy) pairs given to _resolve_symbol
    ("fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt"),
    ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous"),
    ("fp8_m_grouped_gemm_nt_masked", "m_grouped_gemm_fp8_fp8_bf16_nt_masked"),
]
OTHER_NAMES = [
    "m_grouped_fp8_gemm_nt_masked", "transform_sf_into_required_layout", "get_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout", "get_k_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor", "get_tma_aligned_size",
    "set_num_sms", "get_num_sms", "per_token_cast_to_fp8", "per_block_cast_to_fp8", "per_channel_cast_to_fp8",
    "calc_diff", "ceil_div", "fp8_fp4_gemm_nt", "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "k_grouped_fp8_gemm_nt_contiguous",
]


def test_every_name_resolves():
    for new, old in VLLM_NAMES:
        assert callable(_resolve_symbol(deep_gemm, new, old))
    for name in OTHER_NAMES:
        assert callable(getattr(deep_gemm, name)), name
    assert deep_gemm.fp8_m_grouped_gemm_nt_masked is deep_gemm.m_grouped_fp8_gemm_nt_masked
    # Layouts the Hopper kernels do not have are absent, so hasattr-based feature probes pick another path.
    for absent in ("fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt", "k_grouped_fp8_gemm_tn_contiguous"):
        assert not hasattr(deep_gemm, absent), absent


def test_alignment_helpers():
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == ALIGN
    # vLLM's wrapper: `mk_align_size = _impl(); return [mk_align_size, mk_align_size]` — needs a plain int.
    assert isinstance(deep_gemm.get_mk_alignment_for_contiguous_layout(), int)
    assert deep_gemm.get_k_alignment_for_contiguous_layout() == deep_gemm.get_m_alignment_for_contiguous_layout()


# ---------------------------------------------------------------------------------------------- GEMMs
@pytest.mark.parametrize("use_ue8m0", (False, True))
def test_vllm_fp8_gemm_nt(path, use_ue8m0):
    # vllm/utils/deep_gemm.py fp8_gemm_nt: _fp8_gemm_nt_impl(*args, disable_ue8m0_cast=not e8m0_used, **kwargs)
    impl = _resolve_symbol(deep_gemm, "fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt")
    a, sa = _cast_activations(70, use_ue8m0, seed=1)
    b, sb = _cast_weights(None, use_ue8m0, seed=2)
    out = _nan(70, N)
    impl((a, sa), (b, sb), out, disable_ue8m0_cast=not use_ue8m0)
    _assert_close(out, a, sa, b, sb)


def test_sglang_and_keyword_forms_of_fp8_gemm_nt(path):
    # sglang deep_gemm_wrapper/entrypoint.py gemm_nt_f8f8bf16: deep_gemm.fp8_gemm_nt(lhs, rhs, out);
    # torchao / TensorRT-LLM style: recipe=(1, 128, 128), compiled_dims, disable_ue8m0_cast as keywords.
    a, sa = _cast_activations(33, False, seed=3)
    b, sb = _cast_weights(None, False, seed=4)
    calls = [
        lambda out: deep_gemm.fp8_gemm_nt((a, sa), (b, sb), out),
        lambda out: deep_gemm.fp8_gemm_nt((a, sa), (b, sb), out, None, (1, 128, 128)),
        lambda out: deep_gemm.fp8_gemm_nt((a, sa), (b, sb), out, recipe=(1, 128, 128), compiled_dims="mnk",
                                          disable_ue8m0_cast=True),
        lambda out: deep_gemm.fp8_gemm_nt((a, sa), (b, sb), out, recipe_a=(1, 128), recipe_b=(128, 128)),
    ]
    results = []
    for call in calls:
        out = _nan(33, N)
        call(out)
        _assert_close(out, a, sa, b, sb)
        results.append(out)
    assert all(torch.equal(results[0], r) for r in results[1:]), "hint-only arguments changed the result"


@pytest.mark.parametrize("use_ue8m0", (False, True))
def test_vllm_contiguous(path, use_ue8m0):
    # vllm DeepGemmExperts via vllm/utils/deep_gemm.py m_grouped_fp8_gemm_nt_contiguous(
    #     (a1q, a1q_scale), (w1, w1_scale), mm1_out, expert_ids, disable_ue8m0_cast=...)
    impl = _resolve_symbol(deep_gemm, "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous")
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    sizes = [90, 0, 128]
    rows = []
    for e, s in enumerate(sizes):
        rows += [e] * s + [-1] * ((s + align - 1) // align * align - s)
    m_indices = torch.tensor(rows, dtype=torch.int32)
    a, sa = _cast_activations(len(rows), use_ue8m0, seed=5)
    w, ws = _cast_weights(len(sizes), use_ue8m0, seed=6)
    out = _nan(len(rows), N)
    impl((a, sa), (w, ws), out, m_indices, disable_ue8m0_cast=not use_ue8m0)
    for e in range(len(sizes)):
        sel = (m_indices == e).nonzero().flatten()
        if sel.numel():
            _assert_close(out[sel], a[sel], sa[sel], w[e], ws[e])


def test_sglang_contiguous_recipe_pair(path):
    # sglang entrypoint.py grouped_gemm_nt_f8f8bf16_contig: m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out,
    #     m_indices, recipe_a=..., recipe_b=...)
    m_indices = torch.tensor([0] * 128 + [1] * 100 + [-1] * 28, dtype=torch.int32)
    a, sa = _cast_activations(256, False, seed=7)
    w, ws = _cast_weights(2, False, seed=8)
    out = _nan(256, N)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, m_indices, recipe_a=(1, 128),
                                               recipe_b=(128, 128))
    _assert_close(out[:128], a[:128], sa[:128], w[0], ws[0])
    _assert_close(out[128:228], a[128:228], sa[128:228], w[1], ws[1])


@pytest.mark.parametrize("use_ue8m0", (False, True))
def test_psum_layout(path, use_ue8m0):
    # Reference tests / DeepEP v2 users: m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout,
    #     recipe=(1, 128, 128), disable_ue8m0_cast=..., use_psum_layout=True, expected_m_for_psum_layout=m)
    # with grouped_layout[g] = end row of group g, group g starting at align(grouped_layout[g-1], 128).
    sizes = [0, 256, 70, 0, 128, 0]  # empty groups (first, middle, last), multiples of 128, a partial one
    ends, cursor = [], 0
    for s in sizes:
        ends.append(cursor + s)
        cursor = (cursor + s + ALIGN - 1) // ALIGN * ALIGN
    m = ends[-1] + 64  # DeepEP's buffer is larger than the rows in use
    a, sa = _cast_activations(m, use_ue8m0, seed=9)
    w, ws = _cast_weights(len(sizes), use_ue8m0, seed=10)
    out = _nan(m, N)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, torch.tensor(ends, dtype=torch.int32),
                                               recipe=(1, 128, 128), disable_ue8m0_cast=not use_ue8m0,
                                               use_psum_layout=True, expected_m_for_psum_layout=128)
    previous = 0
    for g, end in enumerate(ends):
        start = 0 if g == 0 else (previous + ALIGN - 1) // ALIGN * ALIGN
        if end > start:
            _assert_close(out[start:end], a[start:end], sa[start:end], w[g], ws[g])
        previous = end


@pytest.mark.parametrize("name", ("fp8_m_grouped_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked"))
def test_masked(path, name):
    # vllm BatchedDeepGemmExperts via vllm/utils/deep_gemm.py fp8_m_grouped_gemm_nt_masked(
    #     (a1q, a1q_scale), (w1, w1_scale), out, expert_num_tokens, expected_m, disable_ue8m0_cast=...);
    # sglang entrypoint.py grouped_gemm_nt_f8f8bf16_masked: deep_gemm.fp8_m_grouped_gemm_nt_masked(lhs, rhs,
    #     out, masked_m, expected_m, recipe_a=..., recipe_b=...)
    groups, m_max = 3, 96
    x = torch.randn(groups * m_max, K, generator=torch.Generator().manual_seed(11))
    a, sa = deep_gemm.per_token_cast_to_fp8(x)
    a, sa = a.view(groups, m_max, K), sa.contiguous().view(groups, m_max, -1)
    w, ws = _cast_weights(groups, False, seed=12)
    masked_m = torch.tensor([0, 37, m_max], dtype=torch.int32)
    out = _nan(groups, m_max, N)
    impl = getattr(deep_gemm, name)
    if name == "fp8_m_grouped_gemm_nt_masked":
        impl((a, sa), (w, ws), out, masked_m, 64, disable_ue8m0_cast=True)
    else:
        impl((a, sa), (w, ws), out, masked_m, 64, recipe_a=(1, 128), recipe_b=(128, 128))
    for g, rows in enumerate(masked_m.tolist()):
        if rows:
            _assert_close(out[g, :rows], a[g, :rows], sa[g, :rows], w[g], ws[g])
    assert out[0].isnan().all()


def test_sglang_set_num_sms_around_a_call(path):
    # sglang entrypoint.py configure_deep_gemm_num_sms: original = get_num_sms(); set_num_sms(n); ...; restore
    @contextlib.contextmanager
    def configure(num_sms):
        original = deep_gemm.get_num_sms()
        deep_gemm.set_num_sms(num_sms)
        try:
            yield
        finally:
            deep_gemm.set_num_sms(original)

    before = deep_gemm.get_num_sms()
    a, sa = _cast_activations(16, False, seed=13)
    b, sb = _cast_weights(None, False, seed=14)
    out = _nan(16, N)
    with configure(2):
        assert deep_gemm.get_num_sms() == 2
        deep_gemm.fp8_gemm_nt((a, sa), (b, sb), out)
    assert deep_gemm.get_num_sms() == before
    _assert_close(out, a, sa, b, sb)
    from deep_fp8_gemm.utils import reset_num_sms

    reset_num_sms()


# ---------------------------------------------------------------------------------------------- layout helpers
def test_vllm_transform_sf_for_weights_is_a_no_copy():
    # vllm fp8_utils.py deepgemm_post_process_fp8_weight_block: transform_sf_into_required_layout(sf=ws,
    #     mn=wq.size(1), k=wq.size(2), recipe=(1, 128, 128), num_groups=wq.size(0), is_sfa=False), through the
    #     vllm/utils/deep_gemm.py wrapper that adds disable_ue8m0_cast=not is_deep_gemm_e8m0_used().
    w, ws = _cast_weights(2, True, seed=15)
    for disable in (True, False):
        got = deep_gemm.transform_sf_into_required_layout(sf=ws, mn=w.size(1), k=w.size(2), recipe=(1, 128, 128),
                                                          num_groups=w.size(0), is_sfa=False,
                                                          disable_ue8m0_cast=disable)
        assert got is ws, "already in the required layout: no copy"
    transposed = ws.transpose(1, 2).contiguous().transpose(1, 2)
    got = deep_gemm.transform_sf_into_required_layout(transposed, N, K, (1, 128, 128), 2, False)
    assert got.is_contiguous() and torch.equal(got, ws)


def test_transform_sf_for_activations():
    a, sa = _cast_activations(10, False, seed=16)
    assert deep_gemm.transform_sf_into_required_layout(sa, 10, K, (1, 128, 128), is_sfa=True) is sa
    row_major = sa.contiguous()
    got = deep_gemm.transform_sf_into_required_layout(row_major, 10, K, (1, 128), None)
    assert got.stride() == (1, 12) and torch.equal(got, sa)
    assert deep_gemm.get_mn_major_tma_aligned_tensor(row_major).stride() == (1, 12)


# ---------------------------------------------------------------------------------------------- errors
def _gemm_args():
    a, sa = _cast_activations(8, False, seed=17)
    b, sb = _cast_weights(None, False, seed=18)
    return (a, sa), (b, sb), torch.empty(8, N, dtype=torch.bfloat16)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(c=torch.zeros(8, N, dtype=torch.bfloat16)), ValueError, "c .* not supported"),
    (dict(recipe=(1, 1, 128)), ValueError, "c is required with recipe"),
    (dict(recipe_a=(1, 128), recipe_b=(1, 128)), ValueError, "c is required with recipe"),
    (dict(recipe=(1, 1, 128), c=torch.zeros(8, N, dtype=torch.bfloat16)), TypeError, "d must be torch.float32"),
    (dict(recipe=(1, 128, 32)), NotImplementedError, "gran_k 32"),
    (dict(recipe=(128, 128, 128)), ValueError, "not a recipe of the Hopper kernels"),
    (dict(recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(128, 128)), ValueError, "not both"),
    (dict(recipe_a=(1, 128)), ValueError, "go together"),
    (dict(recipe=(1, 128)), TypeError, "recipe must be a tuple of 3 ints"),
    (dict(compiled_dims="nkx"), ValueError, "compiled_dims"),
    (dict(compiled_dims=3), TypeError, "compiled_dims must be a str"),
    (dict(disable_ue8m0_cast="yes"), TypeError, "disable_ue8m0_cast must be a bool"),
    (dict(alpha=2.0), NotImplementedError, "alpha"),
])
def test_fp8_gemm_nt_bad_options(kwargs, error, match):
    a, b, d = _gemm_args()
    with pytest.raises(error, match=match):
        deep_gemm.fp8_gemm_nt(a, b, d, **kwargs)


def test_sm100_only_inputs_raise_not_implemented():
    (a, sa), (b, sb), d = _gemm_args()
    with pytest.raises(NotImplementedError, match="packed UE8M0"):
        deep_gemm.fp8_gemm_nt((a, sa.view(torch.int32)), (b, sb), d)
    with pytest.raises(NotImplementedError, match="FP4 operands"):
        deep_gemm.fp8_gemm_nt((a.view(torch.uint8), sa), (b, sb), d)
    with pytest.raises(TypeError, match=r"needs recipe=\(1, 1, 128\)"):
        deep_gemm.fp8_gemm_nt((a, sa), (b, sb), torch.empty(8, N))
    with pytest.raises(NotImplementedError, match="packed UE8M0"):
        deep_gemm.transform_sf_into_required_layout(sb.view(torch.int32), N, K, (1, 128, 128), is_sfa=False)
    with pytest.raises(NotImplementedError, match=r"\(128, 32\).*SM100"):
        deep_gemm.transform_sf_into_required_layout(sa, 8, K, (128, 32))
    # B's per-row scales of the 1D1D recipe take A's layout (M-major, TMA-aligned)
    per_row = deep_gemm.transform_sf_into_required_layout(torch.ones(N, 2), N, K, (1, 1, 128), is_sfa=False)
    assert per_row.stride(0) == 1


def test_layout_and_psum_errors():
    a, sa = _cast_activations(256, False, seed=19)
    w, ws = _cast_weights(3, False, seed=20)
    out = torch.empty(256, N, dtype=torch.bfloat16)
    call = deep_gemm.m_grouped_fp8_gemm_nt_contiguous
    with pytest.raises(ValueError, match=r"must have G=3 entries"):
        call((a, sa), (w, ws), out, torch.tensor([0, 128], dtype=torch.int32), use_psum_layout=True)
    with pytest.raises(ValueError, match="non-decreasing"):
        call((a, sa), (w, ws), out, torch.tensor([200, 100, 256], dtype=torch.int32), use_psum_layout=True)
    with pytest.raises(ValueError, match="exceeds the rows"):
        call((a, sa), (w, ws), out, torch.tensor([100, 200, 300], dtype=torch.int32), use_psum_layout=True)
    with pytest.raises(ValueError, match="only meaningful with use_psum_layout=True"):
        call((a, sa), (w, ws), out, torch.zeros(256, dtype=torch.int32), expected_m_for_psum_layout=64)
    for bad, error in ((0, ValueError), (-3, ValueError), (64.0, TypeError)):  # named as the caller named it
        with pytest.raises(error, match="expected_m_for_psum_layout must be"):
            call((a, sa), (w, ws), out, torch.tensor([0, 128], dtype=torch.int32), use_psum_layout=True,
                 expected_m_for_psum_layout=bad)
    with pytest.raises(TypeError, match="use_psum_layout must be a bool"):
        call((a, sa), (w, ws), out, torch.zeros(256, dtype=torch.int32), use_psum_layout=1)
    with pytest.raises(ValueError, match="is_sfa"):
        deep_gemm.transform_sf_into_required_layout(sa, 256, K, (1, 128, 128))
    with pytest.raises(ValueError, match="is_sfa=None"):
        deep_gemm.transform_sf_into_required_layout(sa, 256, K, (1, 128), is_sfa=True)
    with pytest.raises(ValueError, match="sf must have shape"):
        deep_gemm.transform_sf_into_required_layout(sa, 255, K, (1, 128, 128), is_sfa=True)


# ---------------------------------------------------------------------------------------------- GPU
@requires_sm90
@pytest.mark.gpu
def test_gpu_compat_names_with_ue8m0_and_psum():
    a, sa = deep_gemm.per_token_cast_to_fp8(torch.randn(640, 1024).cuda(), True)
    pairs = [deep_gemm.per_block_cast_to_fp8(torch.randn(512, 1024).cuda(), True) for _ in range(4)]
    w, ws = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    ends = [0, 300, 384, 512]  # groups: empty, rows [0, 300), empty ([384, 384)), rows [384, 512)
    out = torch.full((640, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, torch.tensor(ends, dtype=torch.int32).cuda(),
                                               disable_ue8m0_cast=False, use_psum_layout=True,
                                               expected_m_for_psum_layout=128)
    previous = 0
    for g, end in enumerate(ends):
        start = 0 if g == 0 else (previous + 127) // 128 * 128
        if end > start:
            expected = torch.from_numpy(gemm64(a[start:end].cpu(), sa[start:end].cpu().contiguous(), w[g].cpu(),
                                               ws[g].cpu()).value)
            assert deep_gemm.calc_diff(out[start:end].cpu(), expected) < 1e-3
        previous = end


# ---------------------------------------------------------------------------------------------- issue 23
# Each test below names the mismatch of issue 23 ("Loaded unchanged where DeepGEMM's users run") it pins; each
# fails on the code before that issue (fe941c0).
@pytest.fixture
def alignment(request):
    """The contiguous alignment for one test (``indirect`` param, default 128), restored to 128 afterwards."""
    value = getattr(request, "param", ALIGN)
    deep_gemm.set_mk_alignment_for_contiguous_layout(value)
    yield value
    deep_gemm.set_mk_alignment_for_contiguous_layout(ALIGN)


def _reference_generator_layout(sizes, align, psum, seed):
    """DeepGEMM 2.6's ``tests/generators.py::generate_m_grouped_contiguous`` on CPU tensors: expert segments
    padded to ``align``, A's padding rows zeroed in bf16 before the cast, the float64 model over every row
    (padding rows: 0)."""
    g = torch.Generator().manual_seed(seed)
    m = sum((s + align - 1) // align * align for s in sizes)
    x = torch.randn(m, K, generator=g).bfloat16()
    layout, ends, start = torch.full((m,), -1, dtype=torch.int32), [], 0
    for e, s in enumerate(sizes):
        layout[start:start + s] = e
        x[start + s:start + (s + align - 1) // align * align] = 0
        ends.append(start + s)
        start += (s + align - 1) // align * align
    a, sa = deep_gemm.per_token_cast_to_fp8(x, False)
    w, ws = _cast_weights(len(sizes), False, seed + 1)
    expected = torch.zeros(m, N, dtype=torch.float64)
    start = 0
    for e, s in enumerate(sizes):
        stop = start + (s + align - 1) // align * align
        if stop > start:
            expected[start:stop] = torch.from_numpy(gemm64(a[start:stop], sa[start:stop].contiguous(), w[e],
                                                           ws[e]).value)
        start = stop
    grouped = torch.tensor(ends, dtype=torch.int32) if psum else layout
    return (a, sa), (w, ws), grouped, expected


@pytest.mark.parametrize("alignment", [64, 128], indirect=True)
def test_mismatch1_padding_rows_are_computed_as_the_kernels_do(path, alignment):
    # DeepGEMM 2.6 tests/test_fp8_fp4.py::test_m_grouped_gemm_contiguous: zero A's padding rows, compare the whole
    # output. The kernels compute padding rows that share a BLOCK_M (= alignment) block with valid rows with the
    # block's expert, so they come out exactly 0; the CPU path used to leave them unwritten.
    lhs, rhs, m_indices, expected = _reference_generator_layout([90, 0, 130, 64], alignment, psum=False, seed=21)
    for ensure_zero_padding in (True, False):  # accepted, no effect on SM90 (the reference's too)
        out = _nan(*expected.shape)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, m_indices, ensure_zero_padding=ensure_zero_padding)
        assert not out.isnan().any(), "padding rows left unwritten"
        assert (out[m_indices < 0] == 0).all()
        assert deep_gemm.calc_diff(out, expected) < 1e-3


def test_mismatch1_padding_rows_of_the_psum_layout(path):
    lhs, rhs, ends, expected = _reference_generator_layout([90, 0, 130, 1], ALIGN, psum=True, seed=22)
    out = _nan(*expected.shape)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, ends, use_psum_layout=True)
    assert not out.isnan().any(), "padding rows left unwritten"
    assert deep_gemm.calc_diff(out, expected) < 1e-3


def test_mismatch1_padding_only_blocks_stay_untouched():
    # A block of padding only (the sync-free layout's tail, max_m_sum) is skipped by the kernels: left as it was.
    m_indices = torch.tensor([0] * 100 + [-1] * 28 + [-1] * 128, dtype=torch.int32)
    a, sa = _cast_activations(256, False, seed=23)
    w, ws = _cast_weights(1, False, seed=24)
    out = _nan(256, N)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, m_indices)
    assert not out[:128].isnan().any() and out[128:].isnan().all()
    _assert_close(out[:128], a[:128], sa[:128], w[0], ws[0])


def test_mismatch2_k_grouped_takes_use_psum_layout_and_the_reference_names():
    # DeepGEMM 2.6 tests/test_fp8_fp4.py::test_k_grouped_gemm_contiguous always passes use_psum_layout=False;
    # its arguments are named ks_cpu and grouped_layout.
    m, n, ks = 128, 128, [128, 0, 256]
    g = torch.Generator().manual_seed(25)
    xa = [torch.randn(k, m, generator=g) for k in ks]
    xb = [torch.randn(k, n, generator=g) for k in ks]
    a, sa = deep_gemm.transpose_cast_to_fp8_k_grouped(torch.cat(xa), ks)
    b, sb = deep_gemm.transpose_cast_to_fp8_k_grouped(torch.cat(xb), ks)
    d = torch.zeros(len(ks), m, n)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks_cpu=ks,
                                               grouped_layout=torch.tensor(ks, dtype=torch.int32), c=d,
                                               recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False)
    d2 = torch.zeros_like(d)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d2, ks, torch.tensor(ks, dtype=torch.int32), d2,
                                               (1, 1, 128), "mn", False)
    assert torch.equal(d, d2) and d.abs().sum() > 0 and (d[1] == 0).all()
    with pytest.raises(NotImplementedError, match="psum layout"):
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, torch.tensor(ks, dtype=torch.int32), d,
                                                   use_psum_layout=True)


def test_mismatch3_alignment_getters_setters_and_vllms_calls(alignment):
    # vllm/utils/deep_gemm.py: get_theoretical_mk_alignment_for_contiguous_layout(expected_m, num_groups), falling
    # back to the one-argument form on TypeError; mk_alignment_scope(value) = get, set, restore.
    impl = deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout
    assert impl() == impl(None) == impl(expected_m=16) == impl(4096) == 128  # the reference's SM90 value
    with pytest.raises(TypeError):
        impl(256, 8)  # DeepGEMM 2.6.1 takes expected_m only: vLLM then retries with per-group m
    assert impl(-(-256 // 8)) == 128

    @contextlib.contextmanager
    def mk_alignment_scope(value):
        prev = deep_gemm.get_mk_alignment_for_contiguous_layout()
        deep_gemm.set_mk_alignment_for_contiguous_layout(value)
        try:
            yield
        finally:
            deep_gemm.set_mk_alignment_for_contiguous_layout(prev)

    with mk_alignment_scope(64):
        assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 64
        assert deep_gemm.get_m_alignment_for_contiguous_layout() == deep_gemm.get_k_alignment_for_contiguous_layout() == 64
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 128
    for bad in (32, 96, 256, 0):
        with pytest.raises(ValueError, match="must be one of"):
            deep_gemm.set_mk_alignment_for_contiguous_layout(bad)
    for bad in ("64", 64.0, True):
        with pytest.raises(TypeError):
            deep_gemm.set_mk_alignment_for_contiguous_layout(bad)
    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 128


@pytest.mark.parametrize("alignment", [64, 128], indirect=True)
def test_mismatch3_the_alignment_is_the_contiguous_block_m_and_the_layouts(alignment):
    from deep_fp8_gemm import layout
    from deep_fp8_gemm.ops import contiguous, psum

    a = torch.empty(4 * alignment, K, dtype=torch.float8_e4m3fn)
    b = torch.empty(3, N, K, dtype=torch.float8_e4m3fn)
    for m_sum in (alignment, 4 * alignment, 64 * alignment):
        assert contiguous.FAMILIES["contiguous"].plan(torch.empty(m_sum, K), b, None, 132).block_m == alignment
    cfg = psum.FAMILIES["psum"].plan(a, b, None, 132)  # the group starts' alignment is compiled in (scheduler.cuh, psum_block_group)
    assert (cfg.block_m, cfg.psum_alignment) == (alignment, alignment)
    routed = layout.route_topk(torch.tensor([[0, 2], [2, -1], [0, 1]]), 3)
    assert routed.layout.alignment == alignment and routed.layout.m_sum == 3 * alignment
    assert layout.max_m_sum_bound(10, 4) == (10 + 4 * (alignment - 1) + alignment - 1) // alignment * alignment
    assert psum.psum_group_rows([10, 10, 80]) == [(0, 10), (alignment, alignment), (alignment, 80 if alignment == 64 else 128)]


def test_mismatch3_m_indices_check_and_plans_follow_the_alignment(alignment):
    from deep_fp8_gemm._core.plans import GEMM_ENTRIES

    m_indices = torch.tensor([0] * 50 + [-1] * 14 + [1] * 64 + [2] * 10 + [-1] * 54, dtype=torch.int32)  # 64-aligned
    a, sa = _cast_activations(192, False, seed=26)
    w, ws = _cast_weights(3, False, seed=27)
    out = _nan(192, N)
    with pytest.raises(ValueError, match=r"holds rows of 2 experts"):  # 128-row blocks: experts 0 and 1 share one
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, m_indices)
    prepared = deep_gemm.prepare_gemm("contiguous", (a[:128], sa[:128]), (w, ws), out[:128], m_indices[:128])
    plans = GEMM_ENTRIES["contiguous"].plans
    deep_gemm.set_mk_alignment_for_contiguous_layout(64)
    before = len(plans)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, m_indices)
    assert len(plans) == before + 1, "a new alignment is a new plan signature"
    for e in range(3):
        rows = (m_indices == e).nonzero().flatten()
        _assert_close(out[rows], a[rows], sa[rows], w[e], ws[e])
    assert not out[50:64].isnan().any(), "padding rows of expert 0's 64-row block are computed"
    with pytest.raises(RuntimeError, match="prepare it again"):
        prepared((a[:128], sa[:128]), (w, ws), out[:128], m_indices[:128])


def test_mismatch3_moe_layers_follow_the_alignment(alignment):
    # FP8MoE / fp8_moe_forward route with the alignment of the call; the output does not depend on it (padding
    # rows are never combined), nor do the training layer's gradients (its k-grouped weight gradient repads the
    # 64-row segments to whole 128-row K blocks with zero rows).
    from deep_fp8_gemm.autograd import fp8_moe
    from deep_fp8_gemm.moe import fp8_moe_forward

    g = torch.Generator().manual_seed(28)
    experts, hidden, inter, tokens = 4, 128, 128, 40
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.05
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.05
    x = torch.randn(tokens, hidden, generator=g).bfloat16()
    ids = torch.randint(0, experts, (tokens, 2), generator=g)
    weights = torch.rand(tokens, 2, generator=g)
    q13 = [deep_gemm.per_block_cast_to_fp8(w13[e]) for e in range(experts)]
    q2 = [deep_gemm.per_block_cast_to_fp8(w2[e]) for e in range(experts)]
    args = (torch.stack([q[0] for q in q13]), torch.stack([q[1] for q in q13]), torch.stack([q[0] for q in q2]),
            torch.stack([q[1] for q in q2]))
    results = {}
    for value in (128, 64):
        deep_gemm.set_mk_alignment_for_contiguous_layout(value)
        y = fp8_moe_forward(x, ids, weights, *args)
        xs = x.clone().requires_grad_()
        m13, m2 = w13.clone().requires_grad_(), w2.clone().requires_grad_()
        fp8_moe(xs, ids, weights, m13, m2).float().square().sum().backward()
        results[value] = (y, xs.grad, m13.grad, m2.grad)
    for got, want in zip(results[64], results[128]):
        assert torch.equal(got, want)


def test_mismatch5_one_x_weight_gradient_names():
    # DeepGEMM 1.x deep_gemm/jit_kernels/wgrad_gemm.py: out += lhs · rhsᵀ (accumulated), 1x128 scales as [mn, kb]
    # or K-block-major [kb, mn]; the k-grouped form takes flat operands, [sum kb, mn] scales and batch_sizes.
    m, n = 128, 64
    g = torch.Generator().manual_seed(29)
    for ks in ([128, 0, 256], [96, 160]):
        x = torch.randn(sum(ks), m, generator=g)
        y = torch.randn(sum(ks), n, generator=g)
        a_parts, b_parts, sa_parts, sb_parts, start = [], [], [], [], 0
        for k in ks:
            if k == 0:
                qa, qsa = torch.empty(m, 0, dtype=torch.float8_e4m3fn), torch.empty(m, 0)
                qb, qsb = torch.empty(n, 0, dtype=torch.float8_e4m3fn), torch.empty(n, 0)
            else:
                qa, qsa = deep_gemm.per_token_cast_to_fp8(x[start:start + k].t().contiguous())
                qb, qsb = deep_gemm.per_token_cast_to_fp8(y[start:start + k].t().contiguous())
            a_parts.append(qa.reshape(-1)), b_parts.append(qb.reshape(-1))
            sa_parts.append(qsa.t()), sb_parts.append(qsb.t())  # K-block-major [kb, mn]
            start += k
        out0 = torch.randn(len(ks), m, n, generator=g)
        out = out0.clone()
        deep_gemm.k_grouped_wgrad_gemm_fp8_fp8_fp32_nt((torch.cat(a_parts), torch.cat(sa_parts)),
                                                       (torch.cat(b_parts), torch.cat(sb_parts)), out, ks)
        for i, k in enumerate(ks):
            if k == 0:
                assert torch.equal(out[i], out0[i])
                continue
            qa, qb = a_parts[i].view(m, k), b_parts[i].view(n, k)
            product = dequant64(qa, sa_parts[i].t(), 1) @ dequant64(qb, sb_parts[i].t(), 1).T  # per-row B scales
            expected = torch.from_numpy(product).float() + out0[i]
            assert deep_gemm.calc_diff(out[i], expected) < 1e-6
            single = out0[i].clone()
            deep_gemm.wgrad_gemm_fp8_fp8_fp32_nt((qa, sa_parts[i].t().contiguous()), (qb, sb_parts[i]), single)
            assert torch.equal(single, out[i])


def test_mismatch7_contiguous_positional_order(path):
    # csrc/apis/gemm.hpp: (a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast,
    # use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout), every one positional.
    lhs, rhs, ends, expected = _reference_generator_layout([128, 70], ALIGN, psum=True, seed=30)
    out = _nan(*expected.shape)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, ends, None, None, None, "nk", False, True, True, 128)
    assert deep_gemm.calc_diff(out, expected) < 1e-3
    with pytest.raises(TypeError, match="ensure_zero_padding must be a bool"):
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, ends, None, None, None, "nk", False, True, 128)


def test_runtime_knobs():
    assert deep_gemm.get_pdl() is False
    deep_gemm.set_pdl(True)  # vllm/utils/deep_gemm.py _apply_pdl on SM90
    try:
        assert deep_gemm.get_pdl() is True
        from deep_fp8_gemm.utils import PROCESS_SETTINGS

        assert PROCESS_SETTINGS.key[-1] is True, "the PDL flag is part of the plans' signature"
    finally:
        deep_gemm.set_pdl(False)
    with pytest.raises(TypeError):
        deep_gemm.set_pdl(1)
    deep_gemm.set_tc_util(80)
    assert deep_gemm.get_tc_util() == 80
    deep_gemm.set_tc_util(0)
    with pytest.raises(ValueError):
        deep_gemm.set_tc_util(101)
    deep_gemm.set_ignore_compile_dims(False)
    deep_gemm.set_block_size_multiple_of(32)
    deep_gemm.set_block_size_multiple_of((64, 16))
    with pytest.raises(ValueError):
        deep_gemm.set_block_size_multiple_of(0)
    deep_gemm.set_block_size_multiple_of(1)
    from deep_fp8_gemm import compat

    device_count = compat.get_num_sms()
    compat.set_num_sms(7)
    assert compat.get_num_sms() == 7
    compat.set_num_sms(0)  # the reference's "device count again"
    assert compat.get_num_sms() == device_count
