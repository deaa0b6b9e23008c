"""The 1D1D weight-gradient GEMM's per-call plans (``ops.wgrad_plans.Wgrad1d1dPlan``, issue 45): nothing the cached
path skips can let a bad call through or change a result, and on a GPU it launches exactly what the op launches
without a plan.

The GPU side runs on the CPU as in tests/ops/test_prepared.py and test_bf16_plans.py: FakeDriver (real binding types),
tensor maps "encoded" into bytes that name their arguments, ``runtime.target`` mapping CPU tensors to GPU 0, so the
plan's parameter bytes and launch shape are compared with those of ``ops.wgrad_1d1d._unplanned`` (the op's own path:
its checks, its config, ``kernels.gemm.launch_1d1d``).
"""

from __future__ import annotations

import threading

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import utils
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.compat import api as compat_api
from deep_fp8_gemm.kernels import gemm
from deep_fp8_gemm.ops import wgrad_1d1d
from tests._operands import wgrad_operands
from tests._fake_gpu import fake_gpu as fake_gpu_context

M, N, K = 40, 64, 384
F32 = torch.float32


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _operands(seed: int = 0, m: int = M):
    """A, sA, B, sB with M-major TMA-aligned scales (the layout the plans read in place), and a C."""
    a, sa, b, sb, c = wgrad_operands(m, N, K, seed)
    return a, utils.get_col_major_tma_aligned_tensor(sa), b, utils.get_col_major_tma_aligned_tensor(sb), c


def _c_for(variant: str, d: torch.Tensor, c: torch.Tensor):
    return {"none": None, "separate": c, "in-place": d}[variant]


def _plans() -> int:
    return wgrad_1d1d.plan_stats()["1d1d"][0]


VARIANTS = ("none", "separate", "in-place")


# ---------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("variant", VARIANTS)
def test_cpu_calls_through_a_plan_give_the_reference_bits(variant):
    """A CPU plan never caches what reaches a result: the call that builds it and the hits equal the reference."""
    a, sa, b, sb, c = _operands()
    expected = torch.empty(M, N)
    wgrad_1d1d.reference((a, sa), (b, sb), expected, None if variant == "none" else c)
    for _ in range(3):
        d = c.clone() if variant == "in-place" else torch.full((M, N), 5.0)
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, _c_for(variant, d, c))
        assert torch.equal(d, expected)
    assert _plans() == 1
    a2, sa2, b2, sb2, _ = _operands(seed=5)  # new data, same signature: computed anew
    d = torch.empty(M, N)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a2, sa2), (b2, sb2), d)
    expected2 = torch.empty(M, N)
    wgrad_1d1d.reference((a2, sa2), (b2, sb2), expected2)
    assert torch.equal(d, expected2)


def _bad_calls(a, sa, b, sb, d, c):
    """Same signature as (a, sa, b, sb, d, c separate), other pointers: each call raises a pointer rule of the op."""
    flat = torch.zeros(2 * M * N + 64, dtype=F32)
    big = torch.zeros(M * N + 64, dtype=F32)
    sa_in_d = torch.as_strided(big, sa.shape, sa.stride(), 16)
    sa_in_d.copy_(sa)
    return [
        ("d over sA", (a, sa_in_d, b, sb, big[:M * N].view(M, N), c)),
        ("d over c", (a, sa, b, sb, flat[:M * N].view(M, N), flat[16:16 + M * N].view(M, N))),
        ("d misaligned", (a, sa, b, sb, flat[2:2 + M * N].view(M, N), c)),
        ("c misaligned", (a, sa, b, sb, d, flat[M * N + 2:2 * M * N + 2].view(M, N))),
        ("A misaligned", (torch.zeros(M * K + 16, dtype=a.dtype)[1:1 + M * K].view(M, K), sa, b, sb, d, c)),
    ]


@pytest.mark.parametrize("device", ["cpu", "fake-gpu"])
def test_changed_pointers_raise_the_ops_errors(device, request):
    """After a cached call, a call of the same signature whose pointers break a rule raises exactly what the op raises
    with no plan (warm == cold), and reuses the plan (no new one), launching nothing."""
    fake = request.getfixturevalue("fake_gpu") if device == "fake-gpu" else None
    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    if fake is not None:
        fake.on()
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
    for name, (xa, xsa, xb, xsb, xd, xc) in _bad_calls(a, sa, b, sb, d, c):
        with pytest.raises(ValueError) as warm:
            dfg.gemm_fp8_fp8_fp32_nt_1d1d((xa, xsa), (xb, xsb), xd, xc)
        with pytest.raises(ValueError) as cold:
            wgrad_1d1d._unplanned(xa, xsa, xb, xsb, xd, xc)
        assert str(warm.value) == str(cold.value), name
    assert _plans() == 1
    if fake is not None:
        assert len(fake.launches) == 1


def test_signature_errors_after_a_cached_call_are_the_ops():
    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
    for args in (((a.float(), sa), (b, sb), d, c), ((a, sa), (b, sb), d, c.double()), ((a, sa), (b, sb), d[:, :32], c),
                 ((a, sa), (b, sb), d.to(torch.bfloat16), c), ((a, sa), b, d, c), ((a, sa), (b, sb), d, 3)):
        with pytest.raises((TypeError, ValueError)) as warm:
            dfg.gemm_fp8_fp8_fp32_nt_1d1d(*args)
        plans.clear()
        with pytest.raises((TypeError, ValueError)) as cold:
            dfg.gemm_fp8_fp8_fp32_nt_1d1d(*args)
        assert type(warm.value) is type(cold.value) and str(warm.value) == str(cold.value)
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)


def test_subclasses_and_meta_take_the_ops_path():
    class Sub(torch.Tensor):
        pass

    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a.as_subclass(Sub), sa), (b, sb), d, c)
    assert _plans() == 0
    meta = [t.to("meta") for t in (a, sa, b, sb, d)]
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((meta[0], meta[1]), (meta[2], meta[3]), meta[4])  # shapes only
    (plan,) = wgrad_1d1d.plans_of()
    assert plan.call is plan.op


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors launch through the plans into FakeDriver; tensor maps encode to bytes naming their spec."""
    with fake_gpu_context(monkeypatch, 576, caches=(gemm.cuda_kernel.cache_clear,)) as fake:
        yield fake


_FIELDS = ("params", "grid", "block", "smem", "stream", "attrs", "function", "cluster")


def _same_launch(fast: dict, slow: dict) -> None:
    for field in _FIELDS:
        if field in fast or field in slow:
            assert fast[field] == slow[field], field


@pytest.mark.parametrize("variant", VARIANTS)
def test_plan_launches_what_the_op_launches(fake_gpu, variant):
    """The call that builds the plan (thread slot), the second (its block built) and the third (block hit) each launch
    the op's own bytes, grid, block, cluster, shared memory, stream and PDL attribute; c=None zeroes d first."""
    a, sa, b, sb, c = _operands()
    d = torch.full((M, N), 7.0)
    fake_gpu.on()
    for call in range(3):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, _c_for(variant, d, c))
        if variant == "none":
            assert not d.any()
            d.fill_(7.0)
        wgrad_1d1d._unplanned(a, sa, b, sb, d, _c_for(variant, d, c))
        fast, slow = fake_gpu.launches[-2:]
        _same_launch(fast, slow)
        assert len(fake_gpu.launches) == 2 * (call + 1) and fast["stream"] == 0x77 and len(fast["params"]) == 576
    (plan,) = wgrad_1d1d.plans_of()
    assert plan.call == plan._launch and len(plan.blocks) == 1 and len(plan.heads) == 1


def test_new_pointers_launch_what_the_op_launches(fake_gpu):
    """Every operand moved in turn (same signature): the plan packs the new pointers (maps re-encoded for A, sA, B,
    sB; d and c are plain pointers), as the op."""
    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    fake_gpu.on()
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
    args = [a, sa, b, sb, d, c]
    for i in range(6):
        args[i] = args[i].clone()
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((args[0], args[1]), (args[2], args[3]), args[4], args[5])
        wgrad_1d1d._unplanned(*args)
        _same_launch(*fake_gpu.launches[-2:])
    assert _plans() == 1


def test_c_at_ds_address_is_in_place(fake_gpu):
    """c and d are separate tensors of one signature; c at d's address with d's strides is in place for the op (its
    accumulates_in_place), and for the plan; with other strides it is the op's error."""
    a, sa, b, sb, c = _operands()
    buf = torch.zeros(2, M, N + 8)
    d, c2 = buf[0, :, :N], buf[1, :, :N]
    fake_gpu.on()
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c2)
    alias = buf[0, :, :N].view(M, N)  # another tensor object on d's bytes
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, alias)
    wgrad_1d1d._unplanned(a, sa, b, sb, d, d)
    _same_launch(*fake_gpu.launches[-2:])
    assert _plans() == 1
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), torch.zeros(M, N), torch.zeros(M, N + 8)[:, :N])  # a 2nd plan
    flat = torch.zeros(M * (N + 8))
    with pytest.raises(ValueError, match="c starts where d does but has other strides"):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), flat[:M * N].view(M, N), flat.view(M, N + 8)[:, :N])
    assert _plans() == 2 and len(fake_gpu.launches) == 4


def test_scales_to_convert_take_the_ops_path(fake_gpu):
    """Row-major sA (the op converts it to M-major on every call) or an sA 4 bytes off alignment (copied): the op's
    path, whose maps read the converted copy."""
    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    fake_gpu.on()
    row_major = sa.contiguous()
    for _ in range(2):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, row_major), (b, sb), d, c)
    (plan,) = wgrad_1d1d.plans_of()
    assert plan.call is plan.op and len(fake_gpu.launches) == 2
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)  # the M-major signature: a fast plan
    storage = torch.zeros(sa.numel() + sa.stride(1) * 2 + 64)
    shifted = torch.as_strided(storage, sa.shape, sa.stride(), 1)
    shifted.copy_(sa)
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, shifted), (b, sb), d, c)
    sa_map = [s for s in fake_gpu.specs if s.global_dims[:2] == (M, K // 128)][-1]
    assert sa_map.global_address != shifted.data_ptr() and sa_map.global_address % 16 == 0
    wgrad_1d1d._unplanned(a, shifted, b, sb, d, c)
    assert len(fake_gpu.launches) == 5


@pytest.mark.parametrize("change", ["m", "c-stride", "c-given", "num_sms", "pdl", "num_sms+in-place", "pdl+none"])
def test_each_signature_change_misses(fake_gpu, change):
    """A changed shape, stride or c kind, or process setting (each c kind has its own index) is a new plan."""
    a, sa, b, sb, c = _operands()
    a2, sa2, _, _, _ = _operands(m=M - 8)
    d = torch.zeros(M, N)
    if change.endswith("+in-place"):
        c = d
    elif change.endswith("+none"):
        c = None
    change = change.split("+")[0]
    fake_gpu.on()
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, c)
    args = [a, sa, b, sb, d, c]
    if change == "m":
        args = [a2, sa2, b, sb, d[:M - 8], c[:M - 8]]
    elif change == "c-stride":
        args[5] = torch.zeros(M, N + 8)[:, :N]
    elif change == "c-given":
        args[5] = None
    pdl = utils.PROCESS_SETTINGS.pdl
    try:
        if change == "num_sms":
            utils.set_num_sms(3)
        elif change == "pdl":
            utils.set_pdl(not pdl)
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((args[0], args[1]), (args[2], args[3]), args[4], args[5])
        wgrad_1d1d._unplanned(*args)
    finally:
        utils.set_num_sms(0)
        utils.set_pdl(pdl)
    _same_launch(*fake_gpu.launches[-2:])
    assert _plans() == 2
    if change == "num_sms":
        assert fake_gpu.launches[-1]["grid"][0] <= 3


def test_null_stream_launches_in_the_kernels_context(fake_gpu):
    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    fake_gpu.on(stream=0)
    for _ in range(3):
        fake_gpu.current_ctx = 0
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, d)
        assert fake_gpu.launches[-1]["context"] != 0
    dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, d)
    assert fake_gpu.launches[-1]["context"] == fake_gpu.launches[-2]["context"] and len(fake_gpu.launches) == 4


def test_another_thread_launches_the_same_bytes(fake_gpu):
    """A block is never written once built; a pointer tuple met first on another thread is packed in that thread's
    own slot."""
    a, sa, b, sb, c = _operands()
    d, d2 = torch.zeros(M, N), torch.zeros(M, N)
    fake_gpu.on()
    for _ in range(2):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, d)
    (plan,) = wgrad_1d1d.plans_of()
    block = next(iter(plan.blocks.values()))
    before = bytes(block.view)
    worker = threading.Thread(target=lambda: [dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), x, x) for x in (d, d2)])
    worker.start()
    worker.join()
    assert bytes(block.view) == before and len(fake_gpu.launches) == 4
    assert fake_gpu.launches[2]["params"] == fake_gpu.launches[0]["params"]
    wgrad_1d1d._unplanned(a, sa, b, sb, d2, d2)
    assert fake_gpu.launches[3]["params"] == fake_gpu.launches[4]["params"]


def test_empty_problem_launches_nothing(fake_gpu):
    a, sa, b, sb, c = _operands()
    fake_gpu.on()
    for _ in range(2):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a[:0], sa[:0]), (b, sb), torch.zeros(0, N))
    assert not fake_gpu.launches and _plans() == 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_warm_calls_make_no_tensor(fake_gpu, variant):
    """A CUDA graph captures a launch with the addresses it was given: a warm call points only at the caller's
    tensors. What it asks of torch is their data pointers (and, for c=None, d.zero_() as the op), nothing that
    allocates, copies or views."""
    from torch.overrides import TorchFunctionMode

    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    fake_gpu.on()
    for _ in range(2):
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, _c_for(variant, d, c))
    with Record():
        dfg.gemm_fp8_fp8_fp32_nt_1d1d((a, sa), (b, sb), d, _c_for(variant, d, c))
    assert set(seen) == ({"data_ptr", "zero_"} if variant == "none" else {"data_ptr"}) and len(fake_gpu.launches) == 3


def test_fp8_gemm_nt_1d1d_recipe_reaches_the_plan(fake_gpu, monkeypatch):
    """compat's fp8_gemm_nt(..., recipe=(1, 1, 128)) with a c: a known signature runs the plan before the 2.x checks
    (all functions of the signature); anything else runs them and their errors are unchanged."""
    a, sa, b, sb, c = _operands()
    d = torch.zeros(M, N)
    fake_gpu.on()
    compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128))
    calls = []
    monkeypatch.setattr(compat_api, "common_checks", lambda *args, **kw: calls.append(args))
    compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128))
    assert not calls and len(fake_gpu.launches) == 2 and _plans() == 1
    _same_launch(*fake_gpu.launches)
    monkeypatch.undo()
    fake_gpu.on()
    with pytest.raises(ValueError, match="c is required with recipe"):
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, recipe=(1, 1, 128))
    with pytest.raises(TypeError, match="recipe must be a tuple of 3 ints"):
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(True, 1, 128))
    with pytest.raises(NotImplementedError, match="alpha"):
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128), alpha=1.0)
    with pytest.raises(ValueError, match="compiled_dims"):
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128), compiled_dims="mm")
    with pytest.raises(TypeError, match="disable_ue8m0_cast"):
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128), disable_ue8m0_cast=1)
    with pytest.raises(TypeError, match="needs recipe=\\(1, 1, 128\\)"):  # the default recipe: no 1D1D plan
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d)
    with pytest.raises(ValueError, match="pass either recipe or the recipe_a / recipe_b pair"):
        compat_api.fp8_gemm_nt((a, sa), (b, sb), d, c=d, recipe=(1, 1, 128), recipe_a=(1, 128))
    assert len(fake_gpu.launches) == 2
