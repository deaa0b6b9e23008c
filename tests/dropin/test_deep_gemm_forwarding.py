"""The ``deep_gemm`` facade beside another DeepGEMM (issue 40): names forwarded so ``hasattr`` tells the truth,
``provider_of``, submodules and the provider's own absolute imports, knobs applied to both providers (also one
found later), a ``deep_gemm`` imported before the hook adopted, calls this library refuses handed over, and vLLM's
and SGLang's wrapper call conventions on CPU tensors with a provider present.

The providers are the stubs of :mod:`tests.dropin._stubs` (a site-packages ``deep_gemm`` laid out as sgl-deep-gemm,
vLLM's vendored copy), put on ``sys.path`` in a temporary directory: the real ones need CUDA to import.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from deep_fp8_gemm import calc_diff
from deep_fp8_gemm.compat import dropin, provider
from tests._operands import gemm64, quantised_activations, quantised_weights
from tests.dropin import _stubs
from tests.dropin.conftest import clean_imports

N, K = 128, 256


def test_without_a_provider_hasattr_tells_the_truth(no_provider):
    dg = no_provider
    assert dg.__name__ == "deep_fp8_gemm.compat.deep_gemm" and sys.modules["deep_gemm"] is dg
    for name in _stubs.FORWARDED:
        if name not in ("m_grouped_fp8_fp4_gemm_nn_contiguous", "transform_weights_for_mega_moe",
                        "get_symm_buffer_for_mega_moe", "fp8_fp4_mega_moe"):
            assert not hasattr(dg, name), name
            assert dg.provider_of(name) is None
    with pytest.raises(AttributeError, match="no other deep_gemm provider has it"):
        dg.cublaslt_gemm_nt
    assert dg.provider_of("transform_weights_for_mega_moe") == "deep_fp8_gemm (stub)"  # transformers' list
    with pytest.raises(NotImplementedError, match="does not provide it"):
        dg.transform_weights_for_mega_moe()
    assert dg.provider_of("m_grouped_bf16_gemm_nt_contiguous") == dg.provider_of("bf16_gemm_nt") == "deep_fp8_gemm"
    assert dg.provider_of("fp8_gemm_nt") == dg.provider_of("utils.layout.get_mn_major_tma_aligned_tensor") == \
        "deep_fp8_gemm"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("deep_gemm.mega")
    assert not hasattr(dg.utils, "init_dist") and not hasattr(dg.utils.layout, "pack_ue8m0_to_int")


def test_site_package_names_submodules_and_its_own_imports(site_stub):
    dg, stub = site_stub
    assert stub.PROVIDER == "site-packages stub" and stub.__name__ == provider.ALIAS
    assert dg.cublaslt_gemm_nt("x") == "cublaslt_gemm_nt" and stub.CALLS[-1][0] == "cublaslt_gemm_nt"
    assert dg.provider_of("cublaslt_gemm_nt").endswith("(site-packages)") and dg.provider_of("nope") is None
    assert dg.provider_of("bf16_gemm_nt") == dg.provider_of("tf32_hc_prenorm_gemm") == "deep_fp8_gemm"
    assert dg.provider_of("fp8_gemm_nt") == "deep_fp8_gemm"
    assert dg.fp8_gemm_nt is not stub.fp8_gemm_nt and dg.get_mn_major_tma_aligned_tensor.__module__.startswith(
        "deep_fp8_gemm")
    assert not hasattr(dg, "no_such_name")
    # Submodules: ours are ours, the provider's are its own module objects, under both of the facade's names.
    import deep_gemm.utils.layout

    assert deep_gemm.utils.layout is sys.modules["deep_fp8_gemm.compat.deep_gemm.utils.layout"]
    assert importlib.import_module("deep_gemm._C") is sys.modules[f"{provider.ALIAS}._C"]
    assert importlib.import_module("deep_gemm.mega") is sys.modules[f"{provider.ALIAS}.mega"]
    assert importlib.import_module(f"{dg.__name__}.mega") is stub.mega  # vLLM 0.33 step5: f"{dg.__name__}.mega"
    assert importlib.import_module("deep_gemm.utils.dist").init_dist() == "stub dist"
    assert dg._C.get_token_alignment_for_mega_moe() == 64  # dg._C (vLLM step5) forwarded as an attribute
    assert dg.utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor(1) == ("stub packed", 1)
    assert dg.utils.math.transform_ue4m3_sf_into_required_layout() == "stub ue4m3"
    assert dg.provider_of("utils.layout.get_mn_major_tma_aligned_packed_ue8m0_tensor").endswith("(site-packages)")
    assert stub.uses_absolute_import() == "stub dist"  # the provider's absolute `import deep_gemm.utils.dist`
    assert stub.utils.get_mn_major_tma_aligned_tensor(2) == ("stub layout", 2)  # its own utils, untouched
    assert "cublaslt_gemm_nt" in dir(dg) and "fp8_gemm_nt" in dir(dg)


def test_knobs_apply_to_both_and_read_back_from_the_provider(site_stub, monkeypatch):
    import deep_fp8_gemm as dfg

    dg, stub = site_stub
    dg.set_pdl(True)
    assert dfg.get_pdl() is True and stub.get_pdl() is True
    dg.set_num_sms(100)
    assert dfg.get_num_sms() == 100 and stub.get_num_sms() == 100
    dg.set_mk_alignment_for_contiguous_layout(64)
    assert dg.get_mk_alignment_for_contiguous_layout() == 64 == stub.get_mk_alignment_for_contiguous_layout()
    dg.set_tc_util(50)
    assert dg.get_tc_util() == 50 == stub.get_tc_util()
    dg.use_deterministic_algorithms(False)  # ours: no change (batch-invariant stays on); the provider's: off
    assert dfg.is_batch_invariant() and stub.get_deterministic_algorithms() is False
    dg.use_deterministic_algorithms(True)
    assert stub.get_deterministic_algorithms() is True
    dg.set_ignore_compile_dims(True), dg.set_block_size_multiple_of(2)
    assert stub._KNOBS["ignore_compile_dims"] is True and stub._KNOBS["block_size_multiple_of"] == 2
    with pytest.raises(ValueError):  # ours refuses first: the provider is not touched
        dg.set_mk_alignment_for_contiguous_layout(32)
    assert stub.get_mk_alignment_for_contiguous_layout() == 64
    monkeypatch.setattr(stub, "set_pdl", lambda v: (_ for _ in ()).throw(RuntimeError("stub refuses")))
    with pytest.raises(RuntimeError, match="stub refuses"):
        dg.set_pdl(False)
    assert dfg.get_pdl() is True, "ours is put back when the provider refuses"
    # SGLang's num_sms scope and vLLM's mk_alignment_scope, through the facade's names (entrypoint.py, deep_gemm.py)
    previous = dg.get_num_sms()
    dg.set_num_sms(64)
    dg.set_num_sms(previous)
    assert stub.get_num_sms() == previous == dfg.get_num_sms()


def test_knobs_replay_on_vllms_vendored_copy_found_later(vendored_stub):
    dg = vendored_stub
    dg.set_pdl(True)
    dg.set_num_sms(64)
    assert not hasattr(dg, "cublaslt_gemm_nt") and "vllm" not in sys.modules, "vLLM must never be imported by us"
    import vllm  # noqa: F401 - vLLM imports itself before _import_deep_gemm

    assert hasattr(dg, "cublaslt_gemm_nt")
    vendored = sys.modules["vllm.third_party.deep_gemm"]
    assert vendored.PROVIDER == "vllm vendored stub"
    assert vendored.get_pdl() is True and vendored.get_num_sms() == 64
    assert dg.provider_of("mega_mhc") == "vllm.third_party.deep_gemm 2.8.1"
    assert dg.provider_of("tf32_hc_prenorm_gemm") == "deep_fp8_gemm"
    dg.cublaslt_gemm_nt(1, 2, 3)
    assert vendored.CALLS[-1][0] == "cublaslt_gemm_nt"


def test_a_deep_gemm_imported_before_the_hook_is_adopted(tmp_path):
    with clean_imports():
        sys.path.insert(0, str(_stubs.write_site_package(tmp_path)))
        old = importlib.import_module("deep_gemm")  # SGLang imported it before anyone enabled the hook
        assert old.PROVIDER == "site-packages stub" and old.__name__ == "deep_gemm"
        dropin.enable()
        new = importlib.import_module("deep_gemm")
        assert new is not old and new.__name__ == "deep_fp8_gemm.compat.deep_gemm"
        assert "imported before the hook" in new.provider_of("cublaslt_gemm_nt")
        assert new.cublaslt_gemm_nt() == "cublaslt_gemm_nt" and old.CALLS[-1][0] == "cublaslt_gemm_nt"
        assert old.uses_absolute_import() == "stub dist" and old.fp8_gemm_nt() == "fp8_gemm_nt"
        new.set_pdl(True)
        assert old.get_pdl() is True
        dropin.disable()
        assert importlib.import_module("deep_gemm") is old


def test_a_forgotten_provider_leaves_no_submodule_behind(tmp_path):
    """Importing deep_gemm.mega binds `mega` on the facade package; disabling the hook (the provider forgotten)
    must unbind it, or the next facade without a provider would still answer deep_gemm.mega with the old one."""
    with clean_imports():
        sys.path.insert(0, str(_stubs.write_site_package(tmp_path)))
        dropin.enable()
        assert importlib.import_module("deep_gemm.mega").__name__ == f"{provider.ALIAS}.mega"
        facade = sys.modules["deep_gemm"]
        assert hasattr(facade, "mega")
    with clean_imports():  # no provider on sys.path now
        dropin.enable()
        assert importlib.import_module("deep_gemm") is facade and not hasattr(facade, "mega")
        assert facade.testing.__name__.startswith("deep_fp8_gemm.")  # the facade's own submodules stay


def test_calls_ours_refuses_are_handed_to_the_provider(site_stub):
    dg, stub = site_stub
    a, sa = quantised_activations((64, K), seed=1)
    b, sb = quantised_weights((N, K), seed=2)
    d = torch.empty(64, N, dtype=torch.bfloat16)
    # A recipe ours refuses with NotImplementedError (gran_k 32 with 128-row B blocks: MXFP8-style groups, the
    # reference's SM100 kernels) goes to the provider; (1, 32, 32), SGLang's DeepSeek-V4.1 recipe, is ours
    # (tests/ops/test_block32.py)
    assert dg.fp8_gemm_nt((a, sa), (b, sb), d, recipe=(1, 128, 32)) == "fp8_gemm_nt"
    assert stub.CALLS[-1][2] == {"recipe": (1, 128, 32)}
    # SGLang's single-batch-overlap keywords, which this library's signature lacks
    assert dg.fp8_m_grouped_gemm_nt_masked(1, 2, 3, 4, 5, enable_overlap=True, signal=None) == \
        "fp8_m_grouped_gemm_nt_masked"
    calls = len(stub.CALLS)
    with pytest.raises(TypeError, match="recipe=\\(1, 1, 128\\)"):  # our own argument check is not handed over
        dg.fp8_gemm_nt((a, sa), (b, sb), d.float())
    assert len(stub.CALLS) == calls
    dg.fp8_gemm_nt((a, sa), (b, sb), d)  # supported: ours
    assert len(stub.CALLS) == calls and calc_diff(d, torch.from_numpy(gemm64(a, sa, b, sb).value)) < 1e-3


def test_without_a_provider_refusals_stay_errors(no_provider):
    a, sa = quantised_activations((64, K), seed=1)
    b, sb = quantised_weights((N, K), seed=2)
    with pytest.raises(NotImplementedError, match="gran_k 32"):
        no_provider.fp8_gemm_nt((a, sa), (b, sb), torch.empty(64, N, dtype=torch.bfloat16), recipe=(1, 128, 32))
    with pytest.raises(TypeError, match="enable_overlap"):
        no_provider.fp8_m_grouped_gemm_nt_masked(1, 2, 3, 4, 5, enable_overlap=True)


# ---------------------------------------------------------------------------------------------- consumers' calls
def _grouped(m_indices, groups, seed):
    a, sa = quantised_activations((m_indices.numel(), K), seed=seed)
    w, ws = quantised_weights((groups, N, K), seed=seed + 1)
    return a, sa, w, ws


def _check_grouped(out, a, sa, w, ws, m_indices):
    for e in range(w.shape[0]):
        rows = (m_indices == e).nonzero().flatten()
        if rows.numel():
            expected = torch.from_numpy(gemm64(a[rows], sa[rows], w[e], ws[e]).value)
            assert calc_diff(out[rows], expected) < 1e-3


def _layout(sizes, alignment):
    rows = []
    for e, s in enumerate(sizes):
        rows += [e] * s + [-1] * (-s % alignment)
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("alignment", [128, 64])
def test_vllm_wrapper_conventions_with_its_vendored_copy_present(vendored_stub, alignment):
    """vllm/utils/deep_gemm.py (0.33.0): _import_deep_gemm imports deep_gemm (the facade), _apply_pdl, getattr of
    each name, every GEMM with disable_ue8m0_cast=, DeepGemmExperts' alignment scope and per-call alignment; the
    vendored copy (imported once vLLM is) serves the names this library lacks."""
    import vllm  # noqa: F401

    dg = importlib.import_module("deep_gemm")  # _import_deep_gemm: the site-packages name first
    getattr(dg, "set_pdl")(True)  # _apply_pdl
    vendored = sys.modules["vllm.third_party.deep_gemm"]
    assert vendored.get_pdl() is True
    masked = getattr(dg, "m_grouped_fp8_gemm_nt_masked", None) or getattr(dg, "fp8_m_grouped_gemm_nt_masked")
    try:  # get_theoretical_mk_alignment_for_contiguous_layout(expected_m, num_groups), TypeError fallback
        theoretical = dg.get_theoretical_mk_alignment_for_contiguous_layout(400, 3)
    except TypeError:
        theoretical = dg.get_theoretical_mk_alignment_for_contiguous_layout((400 + 2) // 3)
    assert theoretical == 128
    prev = dg.get_mk_alignment_for_contiguous_layout()  # mk_alignment_scope(align_used)
    dg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        assert vendored.get_mk_alignment_for_contiguous_layout() == alignment
        m_indices = _layout([70, 0, 130], alignment)
        a, sa, w, ws = _grouped(m_indices, 3, seed=3)
        out = torch.zeros(m_indices.numel(), N, dtype=torch.bfloat16)
        dg.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, m_indices, disable_ue8m0_cast=True)
        _check_grouped(out, a, sa, w, ws, m_indices)
        ends = torch.tensor([70, 70 + (-70 % alignment) + 0, 70 + (-70 % alignment) + 130], dtype=torch.int32)
        out = torch.zeros(m_indices.numel(), N, dtype=torch.bfloat16)
        dg.m_grouped_fp8_gemm_nt_contiguous((a, sa), (w, ws), out, ends, disable_ue8m0_cast=True,
                                            use_psum_layout=True, expected_m_for_psum_layout=70)
        _check_grouped(out, a, sa, w, ws, m_indices)
    finally:
        dg.set_mk_alignment_for_contiguous_layout(prev)
    a, sa = quantised_activations((2, 32, K), seed=5)
    w, ws = quantised_weights((2, N, K), seed=6)
    out = torch.zeros(2, 32, N, dtype=torch.bfloat16)
    masked(((a, sa)), (w, ws), out, torch.tensor([5, 32], dtype=torch.int32), 16, disable_ue8m0_cast=True)
    for g, rows in enumerate((5, 32)):
        assert calc_diff(out[g, :rows], torch.from_numpy(gemm64(a[g, :rows], sa[g, :rows], w[g], ws[g]).value)) < 1e-3
    a, sa = quantised_activations((40, K), seed=7)
    b, sb = quantised_weights((N, K), seed=8)
    d = torch.zeros(40, N, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((a, sa), (b, sb), d, disable_ue8m0_cast=True)
    assert calc_diff(d, torch.from_numpy(gemm64(a, sa, b, sb).value)) < 1e-3
    ours = ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")
    assert not [c for c in vendored.CALLS if c[0] in ours], "these ran on deep_fp8_gemm"
    # DeepSeek-V4 mHC (vllm/model_executor/layers/mhc.py): n = 24, num_splits = 16, summed by the caller; ours
    x, fn = torch.randn(40, 16 * 64).bfloat16(), torch.randn(24, 16 * 64)
    out, sqrsum = torch.empty(16, 40, 24), torch.empty(16, 40)
    dg.tf32_hc_prenorm_gemm(x, fn, out, sqrsum, 16)
    assert calc_diff(out.sum(0), x.double() @ fn.double().T) < 1e-4
    assert calc_diff(sqrsum.sum(0), x.double().square().sum(-1)) < 1e-4
    assert not [c for c in vendored.CALLS if c[0] == "tf32_hc_prenorm_gemm"], "served by deep_fp8_gemm"


@pytest.mark.parametrize("alignment", [128, 64])
def test_sglang_wrapper_conventions_with_sgl_deep_gemm_present(site_stub, alignment):
    """sglang/srt/layers/deep_gemm_wrapper/entrypoint.py (0.5.23): the import-time layout import, the contiguous
    alignment scope, the num_sms scope, the dense / contiguous / masked calls, and its BF16 MoE runner and
    batch-invariant names (ours since issue 41, though sgl-deep-gemm has them too)."""
    dg, stub = site_stub
    from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor  # entrypoint.py:20

    alignment_now = dg.get_mk_alignment_for_contiguous_layout()  # get_contiguous_layout_alignment
    theoretical = getattr(dg, "get_theoretical_mk_alignment_for_contiguous_layout", None)
    candidate = theoretical((300 + 2) // 3)
    assert 0 < candidate <= alignment_now
    previous = dg.get_mk_alignment_for_contiguous_layout()  # contiguous_layout_alignment_scope(alignment)
    dg.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        m_indices = _layout([3, 200, 0], alignment)
        a, sa, w, ws = _grouped(m_indices, 3, seed=9)
        original = dg.get_num_sms()  # configure_deep_gemm_num_sms(num_sms)
        dg.set_num_sms(100)
        try:
            out = torch.zeros(m_indices.numel(), N, dtype=torch.bfloat16)
            dg.m_grouped_fp8_gemm_nt_contiguous((a, get_mn_major_tma_aligned_tensor(sa)), (w, ws), out, m_indices)
            assert stub.get_num_sms() == 100
        finally:
            dg.set_num_sms(original)
        _check_grouped(out, a, sa, w, ws, m_indices)
    finally:
        dg.set_mk_alignment_for_contiguous_layout(previous)
    assert stub.get_mk_alignment_for_contiguous_layout() == previous
    a, sa = quantised_activations((3, 16, K), seed=11)
    w, ws = quantised_weights((3, N, K), seed=12)
    out = torch.zeros(3, 16, N, dtype=torch.bfloat16)
    dg.fp8_m_grouped_gemm_nt_masked((a, sa), (w, ws), out, torch.tensor([0, 16, 7], dtype=torch.int32), 8)
    assert calc_diff(out[1], torch.from_numpy(gemm64(a[1], sa[1], w[1], ws[1]).value)) < 1e-3
    a, sa = quantised_activations((24, K), seed=13)
    b, sb = quantised_weights((N, K), seed=14)
    d = torch.zeros(24, N, dtype=torch.bfloat16)
    dg.fp8_gemm_nt((a, sa), (b, sb), d)
    assert calc_diff(d, torch.from_numpy(gemm64(a, sa, b, sb).value)) < 1e-3
    assert not [c for c in stub.CALLS if c[0] in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous",
                                                  "fp8_m_grouped_gemm_nt_masked")]
    # The BF16 MoE runner and the batch-invariant mode (batch_invariant_ops.py): sgl-deep-gemm's
    # are ours since issue 41: run with real tensors, nothing recorded by the stub
    calls = len(stub.CALLS)
    x, w = torch.randn(3, 16, 128).bfloat16(), torch.randn(3, N, 128).bfloat16()
    out = torch.zeros(3, 16, N, dtype=torch.bfloat16)
    dg.m_grouped_bf16_gemm_nt_masked(x, w, out, torch.tensor([0, 16, 7], dtype=torch.int32), 8)
    assert calc_diff(out[1], x[1].double() @ w[1].double().T) < 1e-4 and not out[0].any() and not out[2, 7:].any()
    rows = torch.tensor([0] * 128 + [2] * 100 + [-1] * 28, dtype=torch.int32)  # 128-aligned: both alignments
    x2, out2 = torch.randn(256, 128).bfloat16(), torch.zeros(256, N, dtype=torch.bfloat16)
    dg.m_grouped_bf16_gemm_nt_contiguous(x2, w, out2, rows)
    assert calc_diff(out2[128:228], x2[128:228].double() @ w[2].double().T) < 1e-4
    deterministic = getattr(dg, "get_deterministic_algorithms", None)()
    dg.use_deterministic_algorithms(True)
    x3, y3, out3 = torch.randn(9, 64).bfloat16(), torch.randn(64, 40).bfloat16(), torch.empty(9, 40)
    dg.bf16_gemm_nn(x3, y3, out3)  # batch_invariant_ops.py: mm as bf16_gemm_nn into fp32
    assert calc_diff(out3, x3.double() @ y3.double()) < 1e-4
    if not deterministic:
        dg.use_deterministic_algorithms(False)
    assert len(stub.CALLS) == calls, "the BF16 names must not be forwarded"
