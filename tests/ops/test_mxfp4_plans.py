"""The masked MXFP4 GEMM's per-call plans (``ops.mxfp4_plans.Mxfp4MaskedPlan``, issue 45): nothing the cached path
skips can let a bad call through or change a result, and on a GPU it launches what the op's own path launches.

The GPU side runs on the CPU as in tests/ops/test_bf16_plans.py: FakeDriver (real binding types), tensor maps
"encoded" into bytes that name their arguments (after the real encoder's validation), ``runtime.target`` mapping CPU
tensors to GPU 0; the plan's launch is compared with that of the op without a plan (``ops.mxfp4._masked``). One
difference is by design: the op copies ``sa`` into a fresh column buffer per call, the plan into a buffer it keeps, so
the sA map (bytes 384-512) names another address; its other arguments and the buffer's values are compared instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import pytest
import torch

from deep_fp8_gemm import utils
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.compat.casts import per_token_cast_to_fp4, per_token_cast_to_fp8
from deep_fp8_gemm.kernels import launching, mxfp4_gemm
from deep_fp8_gemm.ops import mxfp4
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime import target
from deep_fp8_gemm.runtime.tensor_map import TmaDtype
from tests._fake_gpu import fake_gpu as fake_gpu_context

G, N, K = 2, 128, 256
SA_MAP = slice(384, 512)  # Mxfp4Params.tma_sa: the column buffer's map
op = mxfp4.m_grouped_gemm_fp8_fp4_bf16_nt_masked


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _weights(seed: int = 0) -> mxfp4.PreparedMxfp4:
    gen = torch.Generator().manual_seed(seed)
    codes, sf = per_token_cast_to_fp4(torch.randn(G * N, K, generator=gen), True, 32)
    return mxfp4.prepare_mxfp4_weights(codes.view(G, N, K // 2), sf.view(G, N, K // 32))


def _operands(m_max: int = 8, seed: int = 1, counts=(5, 2)):
    gen = torch.Generator().manual_seed(seed)
    x, sa = per_token_cast_to_fp8(torch.randn(G * m_max, K, generator=gen), True)
    d = torch.full((G, m_max, N), 7.0, dtype=torch.bfloat16)
    masked_m = torch.tensor([min(c, m_max) for c in counts], dtype=torch.int32)
    return (x.view(G, m_max, K), sa.view(G, m_max, K // 128)), d, masked_m


def _plans() -> int:
    return plans.stats()["mxfp4.masked"][0]


def _plan():
    (plan,) = mxfp4._masked_entry.plans.values()
    return plan


# ---------------------------------------------------------------------------------------------- CPU
def test_cpu_calls_through_a_plan_give_the_ops_bits():
    p = _weights()
    a, d, masked_m = _operands()
    want = d.clone()
    mxfp4._masked(a, p, want, masked_m, 4)
    for _ in range(3):
        d.fill_(7.0)
        op(a, p, d, masked_m, 4)
        assert torch.equal(d, want)
    assert _plans() == 1
    a2, d2, _ = _operands(seed=3)  # new data, same signature: computed, not cached
    want2 = d2.clone()
    mxfp4._masked(a2, p, want2, masked_m, 4)
    op(a2, p, d2, masked_m, 4)
    assert torch.equal(d2, want2) and _plans() == 1


def test_cpu_errors_after_a_cached_call_are_the_ops():
    p = _weights()
    a, d, masked_m = _operands()
    op(a, p, d, masked_m, 4)
    with pytest.raises(ValueError, match=r"masked_m\[1\]=9 must be in \[0, m_max=8\]"):  # values: every CPU call
        op(a, p, d, torch.tensor([1, 9], dtype=torch.int32), 4)
    with pytest.raises(TypeError, match="expected_m"):
        op(a, p, d, masked_m, 4.0)
    with pytest.raises(ValueError, match="expected_m"):
        op(a, p, d, masked_m, 0)
    with pytest.raises(ValueError, match="d must be bfloat16"):
        op(a, p, d.float(), masked_m, 4)
    with pytest.raises(TypeError, match="a must be a pair of tensors"):
        op(a[:1], p, d, masked_m, 4)
    assert _plans() == 1


def test_checkpoint_pairs_and_subclasses_take_the_ops_path():
    class Sub(torch.Tensor):
        pass

    gen = torch.Generator().manual_seed(0)
    codes, sf = per_token_cast_to_fp4(torch.randn(G * N, K, generator=gen), True, 32)
    a, d, masked_m = _operands()
    op(a, (codes.view(G, N, K // 2), sf.view(G, N, K // 32)), d, masked_m, 4)  # prepared on every call
    op((a[0].as_subclass(Sub), a[1]), _weights(), d, masked_m, 4)
    assert _plans() == 0


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    with fake_gpu_context(monkeypatch, 576, caches=(launching.cuda_function.cache_clear, mxfp4_gemm._loaded.clear), validate_maps=True) as fake:
        yield fake


_FIELDS = ("grid", "block", "smem", "stream", "attrs", "function")


def _sa_specs(fake, address: int) -> list:
    return [s for s in fake.specs if s.dtype == TmaDtype.FLOAT32 and s.global_address == address]


def _same_launch(fake, fast: dict, slow: dict, sa: torch.Tensor) -> None:
    """Everything but the sA map equal; the plan's sA map that of its own buffer (holding ``sa``'s columns now),
    with the op's dims, strides and box."""
    for field in _FIELDS:
        assert fast[field] == slow[field], field
    assert len(fast["params"]) == len(slow["params"]) == 576
    assert fast["params"][:SA_MAP.start] + fast["params"][SA_MAP.stop:] == \
        slow["params"][:SA_MAP.start] + slow["params"][SA_MAP.stop:]
    columns = next(iter(_plan().buffers.values()))[0]
    assert torch.equal(columns, mxfp4_gemm.column_scales(sa))
    (spec,) = _sa_specs(fake, columns.data_ptr())[:1]
    assert fast["params"][SA_MAP] == hashlib.sha512(repr(spec).encode()).digest() * 2
    op_spec = [s for s in fake.specs if s.dtype == TmaDtype.FLOAT32 and s.global_address != columns.data_ptr()][-1]
    assert dataclasses.replace(op_spec, global_address=spec.global_address) == spec


@pytest.mark.parametrize("m_max,expected_m", [(8, 4), (6, 6), (32, 32)])
def test_plan_launches_what_the_op_launches(fake_gpu, m_max, expected_m):
    """The call that builds the plan (thread slot), the second (its block built) and the third (block hit) each
    launch the op's bytes (but the sA map's address), grid, block, shared memory, stream and PDL attribute."""
    p = _weights()
    a, d, masked_m = _operands(m_max)
    fake_gpu.on()
    kept = []
    for call in range(3):
        op(a, p, d, masked_m, expected_m)
        kept.append(mxfp4_gemm.column_scales(a[1]))  # hold the op's buffer address apart from the next one
        mxfp4._masked(a, p, d, masked_m, expected_m)
        _same_launch(fake_gpu, *fake_gpu.launches[-2:], a[1])
        assert len(fake_gpu.launches) == 2 * (call + 1) and fake_gpu.launches[-2]["stream"] == 0x77
    plan = _plan()
    assert plan.call == plan._launch and len(plan.blocks) == 1 and len(plan.heads) == 1
    block = next(iter(plan.blocks.values()))
    assert [launch["params_address"] == block.address for launch in fake_gpu.launches[::2]] == [False, True, True]


def test_new_scales_are_copied_on_every_call(fake_gpu):
    p = _weights()
    a, d, masked_m = _operands()
    fake_gpu.on()
    op(a, p, d, masked_m, 4)
    a[1].mul_(2.0)  # same pointers, new values
    op(a, p, d, masked_m, 4)
    mxfp4._masked(a, p, d, masked_m, 4)
    _same_launch(fake_gpu, *fake_gpu.launches[-2:], a[1])
    other = (a[0], a[1].clone().transpose(0, 1).contiguous().transpose(0, 1))  # another signature: its own plan
    op(other, p, d, masked_m, 4)
    columns = mxfp4._masked_entry.plans[list(mxfp4._masked_entry.plans)[-1]].buffers
    assert torch.equal(next(iter(columns.values()))[0], mxfp4_gemm.column_scales(a[1])) and _plans() == 2


def _m_major(sa: torch.Tensor, row_stride: int) -> torch.Tensor:
    """``sa``'s values in the M-major layout of K-block stride ``row_stride`` (DeepEP's / the TMA-aligned one)."""
    g, m, kb = sa.shape
    out = torch.empty_strided((g, m, kb), (kb * row_stride, 1, row_stride), dtype=torch.float32)
    out.copy_(sa)
    return out


@pytest.mark.parametrize("m_max,row_stride", [(8, 8), (6, 8), (6, 12)])
def test_m_major_scales_are_read_in_place(fake_gpu, monkeypatch, m_max, row_stride):
    """sa already in the kernel's layout: no buffer, no copy (``column_buffer`` refuses to run); the plan's launches
    are the op's, byte for byte (the op reads it in place too), and the sA map is sa's own: dims (m_max, K/128, G),
    strides (row_stride, K/128 x row_stride) x 4 bytes."""
    p = _weights()
    a, d, masked_m = _operands(m_max)
    a = (a[0], _m_major(a[1], row_stride))
    fake_gpu.on()

    def no_copy(*args):
        raise AssertionError("sa in the kernel's layout was copied")

    monkeypatch.setattr(mxfp4_gemm, "column_buffer", no_copy)
    for _ in range(3):
        op(a, p, d, masked_m, 4)
        mxfp4._masked(a, p, d, masked_m, 4)
        fast, slow = fake_gpu.launches[-2:]
        for field in _FIELDS + ("params",):
            assert fast[field] == slow[field], field
    plan = _plan()
    assert plan.in_place and plan.call == plan._launch_in_place and not plan.buffers and len(plan.blocks) == 1
    kb = K // 128
    (spec,) = set(_sa_specs(fake_gpu, a[1].data_ptr()))
    assert spec.global_dims[:3] == (m_max, kb, G) and spec.global_strides[:2] == (row_stride * 4, kb * row_stride * 4)
    assert fast["params"][SA_MAP] == hashlib.sha512(repr(spec).encode()).digest() * 2


@pytest.mark.parametrize("layout", ["copied", "in_place"])
@pytest.mark.parametrize("over", ["a[0]", "a[1]", "masked_m"])
def test_d_overlapping_an_input_after_cached_calls_raises_the_ops_message(fake_gpu, layout, over):
    """A d whose bytes meet x's, sa's or masked_m's, after cached calls with the same signature: the op's message,
    warm as cold, and no launch (the kernel would read what it writes). sa is not in the copy path's block key, so
    its check is per call; the others' when a pointer tuple's block is made."""
    p = _weights()
    a, d, masked_m = _operands(8)
    if layout == "in_place":
        a = (a[0], _m_major(a[1], 8))
    inputs = {"a[0]": a[0], "a[1]": a[1], "masked_m": masked_m}
    sizes = {name: -(-t.untyped_storage().nbytes() // 16) * 16 for name, t in inputs.items()}
    names = list(inputs)
    at = sum(sizes[name] for name in names[:names.index(over)])
    buf = torch.zeros(max(sum(sizes.values()), at + d.numel() * 2), dtype=torch.uint8)
    copies, start = {}, 0
    for name, t in inputs.items():
        storage = buf[start:start + t.untyped_storage().nbytes()].view(t.dtype)
        copies[name] = storage.as_strided(t.shape, t.stride())
        copies[name].copy_(t)
        start += sizes[name]
    d_over = buf[at:at + d.numel() * 2].view(torch.bfloat16).view(d.shape)
    fake_gpu.on()
    for _ in range(3):  # the plan, its block, a hit
        op((copies["a[0]"], copies["a[1]"]), p, d, masked_m, 4)
    launches = len(fake_gpu.launches)
    call = ((copies["a[0]"], copies["a[1]"]), p, d_over, copies["masked_m"], 4)
    with pytest.raises(ValueError) as warm:
        op(*call)
    assert _plans() == 1 and str(warm.value).startswith(f"d must not overlap {over}:")
    plans.clear()
    with pytest.raises(ValueError) as cold:
        op(*call)
    assert str(warm.value) == str(cold.value) and len(fake_gpu.launches) == launches


@pytest.mark.parametrize("case", ["x", "tiles"])
def test_misaligned_pointers_raise_the_ops_message(fake_gpu, case):
    p = _weights()
    a, d, masked_m = _operands()
    fake_gpu.on()
    for _ in range(2):
        op(a, p, d, masked_m, 4)
    if case == "x":
        x = torch.zeros(a[0].numel() + 16, dtype=torch.uint8)[1:a[0].numel() + 1]
        a = (x.view(torch.float8_e4m3fn).view(a[0].shape), a[1])
    else:
        t = torch.zeros(p.tiles.numel() + 16, dtype=torch.uint8)[8:p.tiles.numel() + 8].view(p.tiles.shape)
        p = mxfp4.PreparedMxfp4(t, p.meta, p.wave_per32)
    launches = len(fake_gpu.launches)
    with pytest.raises(ValueError) as warm:
        op(a, p, d, masked_m, 4)
    plans.clear()
    with pytest.raises(ValueError) as cold:
        op(a, p, d, masked_m, 4)
    assert str(warm.value) == str(cold.value) and "16-byte aligned" in str(warm.value)
    assert len(fake_gpu.launches) == launches


def test_strided_d_is_refused_on_every_call(fake_gpu):
    p = _weights()
    a, _, masked_m = _operands()
    d = torch.zeros(G, 8, N + 64, dtype=torch.bfloat16)[..., :N]
    fake_gpu.on()
    for _ in range(2):
        with pytest.raises(ValueError, match="the MXFP4 kernel needs contiguous a\\[0\\] and d"):
            op(a, p, d, masked_m, 4)
    assert _plan().call is _plan().op and not fake_gpu.launches


def test_capture_takes_the_ops_path(fake_gpu, monkeypatch):
    """Under CUDA-graph capture the launch must not point at the plan's buffer (the plan may drop it while the graph
    lives): the op's own column scales, exactly the op's launch."""
    p = _weights()
    a, d, masked_m = _operands()
    fake_gpu.on()
    op(a, p, d, masked_m, 4)
    monkeypatch.setattr(target, "is_capturing", lambda index: True)
    buffers = dict(_plan().buffers)
    op(a, p, d, masked_m, 4)
    (columns, *_), = buffers.values()
    assert fake_gpu.launches[-1]["params"][SA_MAP] != fake_gpu.launches[0]["params"][SA_MAP]
    assert _plan().buffers == buffers and not _sa_specs(fake_gpu, columns.data_ptr())[1:]


def test_layout_debug_mode_checks_the_counts_on_every_call(fake_gpu, monkeypatch):
    p = _weights()
    a, d, masked_m = _operands()
    fake_gpu.on()
    monkeypatch.setenv("DFG_CHECK_LAYOUTS", "1")
    op(a, p, d, masked_m, 4)
    assert _plan().call is _plan().op
    with pytest.raises(ValueError, match=r"masked_m\[0\]=9"):
        op(a, p, d, torch.tensor([9, 1], dtype=torch.int32), 4)


def test_gpu_counts_are_never_read(fake_gpu, monkeypatch):
    """On a GPU (runtime.target says so) the counts stay on the device, as the op leaves them: out-of-range values
    launch (the kernel clamps), planned or not."""
    p = _weights()
    a, d, _ = _operands()
    fake_gpu.on()
    bad = torch.tensor([9, 1], dtype=torch.int32)
    op(a, p, d, bad, 4)
    mxfp4._masked(a, p, d, bad, 4)
    assert len(fake_gpu.launches) == 2


@pytest.mark.parametrize("change", ["m_max", "expected_m", "pdl", "num_sms"])
def test_each_signature_change_misses(fake_gpu, change):
    p = _weights()
    a, d, masked_m = _operands()
    taller = _operands(m_max=16)  # before the fake GPU: the quantiser would launch there
    fake_gpu.on()
    op(a, p, d, masked_m, 4)
    expected_m = 4
    if change == "m_max":
        a, d, masked_m = taller
    elif change == "expected_m":
        expected_m = 32
    elif change == "pdl":
        utils.set_pdl(True)
    else:
        utils.set_num_sms(utils.get_num_sms() - 1)
    try:
        op(a, p, d, masked_m, expected_m)
        plan = list(mxfp4._masked_entry.plans.values())[-1]
        mxfp4._masked(a, p, d, masked_m, expected_m)
    finally:
        utils.set_pdl(False)
        utils.set_num_sms(0)
    fast, slow = fake_gpu.launches[-2:]
    for field in _FIELDS:
        assert fast[field] == slow[field], field
    assert fast["params"][SA_MAP.stop:] == slow["params"][SA_MAP.stop:] and _plans() == 2
    assert torch.equal(next(iter(plan.buffers.values()))[0], mxfp4_gemm.column_scales(a[1]))


def test_threads_get_their_own_buffer_and_the_same_bytes(fake_gpu):
    p = _weights()
    a, d, masked_m = _operands()
    fake_gpu.on()
    op(a, p, d, masked_m, 4)
    worker = threading.Thread(target=lambda: op(a, p, d, masked_m, 4))
    worker.start()
    worker.join()
    buffers = [b[0] for b in _plan().buffers.values()]
    assert len(buffers) == 2 and buffers[0].data_ptr() != buffers[1].data_ptr()
    assert all(torch.equal(b, mxfp4_gemm.column_scales(a[1])) for b in buffers)
    first, second = fake_gpu.launches
    assert first["params"][:SA_MAP.start] == second["params"][:SA_MAP.start]
    assert first["params"][SA_MAP.stop:] == second["params"][SA_MAP.stop:]


def test_slot_left_dirty_by_another_launch_is_fully_rewritten(fake_gpu):
    p = _weights()
    a, d, masked_m = _operands()
    fake_gpu.on()
    slot = drv.param_slot(576)
    slot.view[:576] = b"\xff" * 576
    op(a, p, d, masked_m, 4)
    assert fake_gpu.launches[-1]["params_address"] == slot.address
    slot.view[:576] = b"\xff" * 576
    mxfp4._masked(a, p, d, masked_m, 4)
    _same_launch(fake_gpu, *fake_gpu.launches[-2:], a[1])


def test_empty_problem_launches_nothing(fake_gpu):
    p = _weights()
    a = (torch.empty(G, 0, K, dtype=torch.float8_e4m3fn), torch.empty(G, 0, K // 128))
    d, masked_m = torch.empty(G, 0, N, dtype=torch.bfloat16), torch.zeros(G, dtype=torch.int32)
    fake_gpu.on()
    for _ in range(2):
        op(a, p, d, masked_m, 4)
    assert not fake_gpu.launches and _plans() == 1 and _plan().call is _plan().op


def test_scales_moved_into_d_after_a_cached_block_raise_the_ops_message(fake_gpu):
    """The copy path's block key holds the plan's buffer, not sa: an sa moved into d's bytes with every other pointer
    the same hits the cached block, and must still be refused (checked per call), warm as cold."""
    p = _weights()
    a, d, masked_m = _operands(8)
    fake_gpu.on()
    for _ in range(3):
        op(a, p, d, masked_m, 4)
    plan = _plan()
    assert not plan.in_place and len(plan.blocks) == 1
    sa_in_d = d.view(torch.uint8).view(-1)[:a[1].untyped_storage().nbytes()].view(torch.float32)
    sa_in_d = sa_in_d.as_strided(a[1].shape, a[1].stride())
    launches = len(fake_gpu.launches)
    with pytest.raises(ValueError) as warm:
        op((a[0], sa_in_d), p, d, masked_m, 4)
    plans.clear()
    with pytest.raises(ValueError) as cold:
        op((a[0], sa_in_d), p, d, masked_m, 4)
    assert str(warm.value) == str(cold.value) and str(warm.value).startswith("d must not overlap a[1]:")
    assert len(fake_gpu.launches) == launches
