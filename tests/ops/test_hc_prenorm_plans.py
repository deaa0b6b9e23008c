"""``tf32_hc_prenorm_gemm``'s per-call plans (``ops.hc_prenorm_plans.HcPrenormPlan``, issue 45): nothing the cached
path skips can let a bad call through or change a result, and on a GPU it launches exactly what the op's own path
launches.

The GPU side runs on the CPU as in tests/ops/test_bf16_plans.py: FakeDriver (real binding types), tensor maps
"encoded" into bytes that name their arguments, ``runtime.target`` mapping CPU tensors to GPU 0; the plan's launch is
compared with that of the op without a plan (``ops.hc_prenorm._hc_prenorm``: the checks, ``kernels.hc_prenorm.launch``).
"""

from __future__ import annotations

import threading

import pytest
import torch

from deep_fp8_gemm import utils
from deep_fp8_gemm._core import plans
from deep_fp8_gemm._core.hc_prenorm_math import hc_prenorm_reference
from deep_fp8_gemm.kernels import launching
from deep_fp8_gemm.ops import hc_prenorm
from deep_fp8_gemm.runtime import driver as drv
from tests._fake_gpu import fake_gpu as fake_gpu_context

M, N, K = 40, 24, 512
op = hc_prenorm.tf32_hc_prenorm_gemm


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _operands(m: int = M, splits: int | None = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, K, generator=g).bfloat16()
    b = torch.randn(N, K, generator=g)
    lead = () if splits is None else (splits,)
    return a, b, torch.full((*lead, m, N), 7.0), torch.full((*lead, m), 7.0), splits


def _plans() -> int:
    return plans.stats()["hc_prenorm.tf32"][0]


def _plan():
    (plan,) = hc_prenorm._entry.plans.values()
    return plan


# ---------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("splits", [None, 4])
def test_cpu_calls_through_a_plan_give_the_reference_bits(splits):
    a, b, d, s, _ = _operands(splits=splits)
    want_d, want_s = d.clone(), s.clone()
    hc_prenorm_reference(a, b, want_d, want_s, splits)
    for _ in range(3):
        d.fill_(5.0), s.fill_(5.0)
        op(a, b, d, s, splits)
        assert torch.equal(d, want_d) and torch.equal(s, want_s)
    assert _plans() == 1
    a2, b2, d2, s2, _ = _operands(splits=splits, seed=1)  # new data, same signature: still computed
    op(a2, b2, d2, s2, splits)
    hc_prenorm_reference(a2, b2, want_d, want_s, splits)
    assert torch.equal(d2, want_d) and torch.equal(s2, want_s) and _plans() == 1


def test_cpu_errors_after_a_cached_call_are_the_ops():
    a, b, d, s, splits = _operands()
    op(a, b, d, s, splits)
    with pytest.raises(ValueError, match="d must not overlap sqr_sum"):  # same signature, sqr_sum inside d
        op(a, b, d, d.view(-1)[:splits * M].view(splits, M), splits)
    with pytest.raises(TypeError, match="b must be torch.float32"):
        op(a, b.double(), d, s, splits)
    for bad in (0, True, 4.0):
        with pytest.raises(ValueError, match="num_splits must be None or an int >= 1"):
            op(a, b, d, s, bad)
    assert _plans() == 1


def test_subclasses_and_meta_take_the_ops_path():
    class Sub(torch.Tensor):
        pass

    a, b, d, s, splits = _operands()
    op(a.as_subclass(Sub), b, d, s, splits)
    assert _plans() == 0
    op(*(t.to("meta") for t in (a, b, d, s)), splits)  # shapes only
    assert _plans() == 1


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    with fake_gpu_context(monkeypatch, 320, caches=(launching.cuda_function.cache_clear,)) as fake:
        yield fake


_FIELDS = ("params", "grid", "block", "smem", "stream", "attrs", "function")


def _same_launch(fast: dict, slow: dict) -> None:
    for field in _FIELDS:
        assert fast[field] == slow[field], field


@pytest.mark.parametrize("m,splits", [(M, None), (M, 4), (130, 16), (1, 3)])
def test_plan_launches_what_the_op_launches(fake_gpu, m, splits):
    """The call that builds the plan (thread slot), the second (its block built) and the third (block hit) each
    launch the op's own bytes, grid, block, shared memory, stream and PDL attribute."""
    a, b, d, s, _ = _operands(m, splits)
    fake_gpu.on()
    for call in range(3):
        op(a, b, d, s, splits)
        hc_prenorm._hc_prenorm(a, b, d, s, splits)
        fast, slow = fake_gpu.launches[-2:]
        _same_launch(fast, slow)
        assert len(fake_gpu.launches) == 2 * (call + 1) and fast["stream"] == 0x77 and len(fast["params"]) == 320
    plan = _plan()
    assert plan.call == plan._launch and len(plan.blocks) == 1 and len(plan.heads) == 1
    block = next(iter(plan.blocks.values()))
    assert [launch["params_address"] == block.address for launch in fake_gpu.launches[::2]] == [False, True, True]


def test_pdl_is_the_ops(fake_gpu):
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    utils.set_pdl(True)
    try:
        op(a, b, d, s, splits)
        hc_prenorm._hc_prenorm(a, b, d, s, splits)
    finally:
        utils.set_pdl(False)
    _same_launch(*fake_gpu.launches[-2:])
    op(a, b, d, s, splits)  # the setting is in the signature: a second plan, without PDL
    hc_prenorm._hc_prenorm(a, b, d, s, splits)
    _same_launch(*fake_gpu.launches[-2:])
    assert fake_gpu.launches[-1]["attrs"] != fake_gpu.launches[0]["attrs"] and _plans() == 2


def test_plan_reencodes_only_new_operands(fake_gpu):
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    op(a, b, d, s, splits)
    encoded = len(fake_gpu.specs)
    d2, s2 = torch.zeros_like(d), torch.zeros_like(s)
    op(a, b, d2, s2, splits)  # new outputs: plain pointers, no map
    hc_prenorm._hc_prenorm(a, b, d2, s2, splits)
    _same_launch(*fake_gpu.launches[-2:])
    assert len(fake_gpu.specs) == encoded == 2  # the op's own path hits the driver's map cache
    a2 = a.clone()
    op(a2, b, d, s, splits)  # a new a: its map only
    assert len(fake_gpu.specs) == 3 and fake_gpu.specs[-1].global_address == a2.data_ptr() and _plans() == 1


@pytest.mark.parametrize("case", ["d-over-a", "d-over-b", "d-over-sqr_sum", "sqr_sum-over-a", "sqr_sum-over-b"])
def test_changed_pointers_are_checked_with_the_ops_messages(fake_gpu, case):
    """Same signature, overlapping pointers: the op's own message, word for word (warm == cold), nothing launched."""
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    for _ in range(2):
        op(a, b, d, s, splits)
    launches = len(fake_gpu.launches)
    if case == "d-over-a":
        d = a.view(-1).view(torch.float32)[:d.numel()].view(d.shape)
    elif case == "d-over-b":
        d = b.view(-1)[:d.numel()].view(d.shape)
    elif case == "d-over-sqr_sum":
        s = d.view(-1)[d.numel() - s.numel():].view(s.shape)
    elif case == "sqr_sum-over-a":
        s = a.view(-1).view(torch.float32)[:s.numel()].view(s.shape)
    else:
        s = b.view(-1)[5:5 + s.numel()].view(s.shape)
    with pytest.raises(ValueError) as warm:
        op(a, b, d, s, splits)
    plans.clear()
    with pytest.raises(ValueError) as cold:
        op(a, b, d, s, splits)
    assert str(warm.value) == str(cold.value) and "must not overlap" in str(warm.value)
    assert len(fake_gpu.launches) == launches


def test_misaligned_operand_is_copied_by_the_ops_path(fake_gpu):
    """Same signature, ``a`` 2 bytes off: the op's path copies it (its map reads the copy) and launches."""
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    op(a, b, d, s, splits)
    shifted = torch.zeros(M * K + 8, dtype=torch.bfloat16)[1:M * K + 1].view(M, K)
    shifted.copy_(a)
    op(shifted, b, d, s, splits)
    a_map = [spec for spec in fake_gpu.specs if spec.global_dims[:2] == (K, M)][-1]
    assert a_map.global_address != shifted.data_ptr() and a_map.global_address % 16 == 0
    assert len(fake_gpu.launches) == 2 and _plans() == 1
    assert not any(key[0] == shifted.data_ptr() for key in _plan().seen)


def test_strided_d_takes_the_ops_buffer_on_every_call(fake_gpu):
    a, b, _, s, splits = _operands()
    d = torch.zeros(splits, M, N + 8)[:, :, :N]  # N-major, not contiguous: the op launches into a buffer
    fake_gpu.on()
    for _ in range(2):
        op(a, b, d, s, splits)
    plan = _plan()
    assert plan.call is plan.op and len(fake_gpu.launches) == 2


def test_empty_problem_launches_nothing(fake_gpu):
    a, b, d, s, splits = _operands(m=0)
    fake_gpu.on()
    op(a, b, d, s, splits)
    op(a, b, d, s, splits)
    assert not fake_gpu.launches and _plans() == 1


@pytest.mark.parametrize("change", ["m", "splits", "none", "b-stride", "pdl"])
def test_each_signature_change_misses(fake_gpu, change):
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    op(a, b, d, s, splits)
    if change == "m":
        a, b, d, s, splits = _operands(m=M + 64)
    elif change == "splits":
        a, b, d, s, splits = _operands(splits=8)
    elif change == "none":
        a, b, d, s, splits = _operands(splits=None)
    elif change == "b-stride":
        b = torch.cat([b, b], 1)[:, :K]
    else:
        utils.set_pdl(True)
    try:
        op(a, b, d, s, splits)
        hc_prenorm._hc_prenorm(a, b, d, s, splits)
    finally:
        utils.set_pdl(False)
    _same_launch(*fake_gpu.launches[-2:])
    assert _plans() == 2


def test_slot_left_dirty_by_another_launch_is_fully_rewritten(fake_gpu):
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    slot = drv.param_slot(320)
    slot.view[:320] = b"\xff" * 320
    op(a, b, d, s, splits)
    assert fake_gpu.launches[-1]["params_address"] == slot.address
    slot.view[:320] = b"\xff" * 320
    hc_prenorm._hc_prenorm(a, b, d, s, splits)
    _same_launch(*fake_gpu.launches[-2:])


def test_another_thread_launches_the_same_bytes(fake_gpu):
    a, b, d, s, splits = _operands()
    fake_gpu.on()
    op(a, b, d, s, splits)
    worker = threading.Thread(target=lambda: [op(a, b, d, s, splits) for _ in range(2)])
    worker.start()
    worker.join()
    hc_prenorm._hc_prenorm(a, b, d, s, splits)
    assert len({bytes(launch["params"]) for launch in fake_gpu.launches}) == 1 and len(fake_gpu.launches) == 4
