"""``fp8_paged_mqa_logits``' per-call plans (``ops.mqa_plans.PagedMqaPlan``, issue 45): nothing the cached path skips
can let a bad call through or change a result, and on a GPU it launches exactly what the op's own path launches.

The GPU side runs on the CPU as in tests/ops/test_bf16_plans.py: FakeDriver (real binding types), tensor maps
"encoded" into bytes that name their arguments, ``runtime.target`` mapping CPU tensors to GPU 0; the plan's launch is
compared with that of the op without a plan (``attention._paged_impl``: the checks, the config, ``launch_paged``).
"""

from __future__ import annotations


import pytest
import torch

from deep_fp8_gemm import attention, utils
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.compat import attention as compat_attention
from deep_fp8_gemm.kernels import launching
from deep_fp8_gemm.runtime import driver as drv
from tests._fake_gpu import fake_gpu as fake_gpu_context

H, D, BLOCKS_PER_ROW = 64, 128, 4  # the V3.2 indexer's heads and head_dim; 256-token contexts
LOGITS = slice(512, 520)  # MqaLogitsParams.logits: the fresh buffer's address, new on every call


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _operands(batch: int = 2, next_n: int = 1, context: int = 200, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, next_n, H, D, generator=g) * 0.5).to(torch.float8_e4m3fn)
    num_blocks = batch * BLOCKS_PER_ROW
    cache = torch.zeros(num_blocks, 64, 1, D + 4, dtype=torch.uint8)
    values, scales = attention.paged_cache_views(cache)
    flat = cache.view(num_blocks, -1)
    flat[:, :64 * D] = (torch.randn(num_blocks, 64 * D, generator=g) * 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
    flat[:, 64 * D:] = (torch.rand(num_blocks, 64, generator=g) + 0.5).view(torch.uint8).view(num_blocks, -1)
    weights = torch.randn(batch * next_n, H, generator=g)
    lens = torch.full((batch, next_n), context, dtype=torch.int32)
    table = torch.randperm(num_blocks, generator=g).to(torch.int32).view(batch, BLOCKS_PER_ROW)
    meta = attention.get_paged_mqa_logits_metadata(lens, 64, utils.get_num_sms())
    return q, cache, weights, lens, table, meta


def _plans() -> int:
    return plans.stats()["attention.paged_mqa_logits"][0]


# ---------------------------------------------------------------------------------------------- CPU
def test_cpu_calls_through_a_plan_give_the_reference():
    args = _operands()
    expected = attention.fp8_paged_mqa_logits_reference(*args, 256)
    for _ in range(3):
        assert torch.equal(attention.fp8_paged_mqa_logits(*args, 256), expected)
    assert _plans() == 1
    other = _operands(seed=1)  # new data, same signature: computed, not cached
    assert torch.equal(attention.fp8_paged_mqa_logits(*other, 256),
                       attention.fp8_paged_mqa_logits_reference(*other, 256))
    assert _plans() == 1


def test_cpu_errors_after_a_cached_call_are_the_ops():
    q, cache, w, lens, table, meta = _operands()
    attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256)
    with pytest.raises(ValueError, match="clean_logits must be False"):
        attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256, True)
    with pytest.raises(TypeError, match="max_context_len must be an int"):
        attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, True)
    with pytest.raises(ValueError, match="max_context_len must be >= 0"):
        attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, -1)
    with pytest.raises(TypeError, match="weights must be float32 on SM90"):
        attention.fp8_paged_mqa_logits(q, cache, w.bfloat16(), lens, table, meta, 256)
    with pytest.raises(ValueError, match="block_table must have at least"):  # CPU: the values are checked per call
        attention.fp8_paged_mqa_logits(q, cache, w, lens, table[:, :2].contiguous(), meta, 256)
    with pytest.raises(ValueError, match="logits_dtype must be torch.float32 or torch.bfloat16"):
        attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256, False, torch.float16)


def test_subclasses_take_the_custom_op():
    class Sub(torch.Tensor):
        pass

    q, *rest = _operands()
    out = attention.fp8_paged_mqa_logits(q.as_subclass(Sub), *rest, 256)
    assert _plans() == 0 and torch.equal(out, attention.fp8_paged_mqa_logits_reference(q, *rest, 256))


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    with fake_gpu_context(monkeypatch, 640, caches=(launching.cuda_function.cache_clear,)) as fake:  # MqaLogitsParams
        yield fake


_FIELDS = ("grid", "block", "smem", "stream", "attrs", "function")


def _same_launch(fast: dict, slow: dict, fast_logits: torch.Tensor, slow_logits: torch.Tensor) -> None:
    for field in _FIELDS:
        assert fast[field] == slow[field], field
    assert fast["params"][LOGITS] == fast_logits.data_ptr().to_bytes(8, "little")
    assert slow["params"][LOGITS] == slow_logits.data_ptr().to_bytes(8, "little")
    assert fast["params"][:LOGITS.start] + fast["params"][LOGITS.stop:] == \
        slow["params"][:LOGITS.start] + slow["params"][LOGITS.stop:]
    for attr in ("shape", "dtype", "device"):
        assert getattr(fast_logits, attr) == getattr(slow_logits, attr), attr
    assert fast_logits.stride() == slow_logits.stride()
    assert fast_logits.untyped_storage().nbytes() == slow_logits.untyped_storage().nbytes()


@pytest.mark.parametrize("next_n,width,dtype", [(1, 256, torch.float32), (2, 1000, torch.float32),
                                                (1, 300, torch.bfloat16)])
def test_plan_launches_what_the_op_launches(fake_gpu, next_n, width, dtype):
    """The call that builds the plan (thread slot), the second (its block built) and the third (block hit) each
    launch the op's own bytes (but the fresh logits' address), grid, block, shared memory, stream and PDL attribute,
    and return logits of the op's shape, strides and storage size."""
    args = _operands(next_n=next_n)
    fake_gpu.on()
    kept = []  # keep the logits alive: a freed buffer's address would come back
    for call in range(3):
        fast = attention.fp8_paged_mqa_logits(*args, width, False, dtype)
        slow = attention._paged_impl(*args, width, False, dtype)
        kept += [fast, slow]
        _same_launch(*fake_gpu.launches[-2:], fast, slow)
        assert len(fake_gpu.launches) == 2 * (call + 1) and fake_gpu.launches[-1]["stream"] == 0x77
    (plan,) = attention._paged_entry.plans.values()
    assert plan.call == plan._launch


def test_block_is_reused_for_repeated_pointers(fake_gpu):
    args = _operands()
    fake_gpu.on()
    first = attention.fp8_paged_mqa_logits(*args, 256)  # alive: its freed address could be the buffer's below
    (plan,) = attention._paged_entry.plans.values()
    buffer = torch.empty(2, 256)  # what a caching allocator does: the freed logits' address again
    plan._empty = lambda sizes, strides, dtype: buffer
    for _ in range(3):  # met once (the thread's slot), twice (its block built), three times (launched from it)
        attention.fp8_paged_mqa_logits(*args, 256)
    (block,) = plan.blocks.values()
    assert [launch["params_address"] == block.address for launch in fake_gpu.launches[1:]] == [False, True, True]
    assert first.data_ptr() != buffer.data_ptr()
    assert all(launch["params"][:LOGITS.start] == fake_gpu.launches[0]["params"][:LOGITS.start]
               for launch in fake_gpu.launches)
    encoded = len(fake_gpu.specs)
    other_cache = args[1].clone()  # another layer's cache: its two maps only
    attention.fp8_paged_mqa_logits(args[0], other_cache, *args[2:], 256)
    assert len(fake_gpu.specs) == encoded + 2
    assert {s.global_address for s in fake_gpu.specs[-2:]} == {other_cache.data_ptr(),
                                                              other_cache.data_ptr() + 64 * D}


def test_changed_pointers_are_checked_with_the_ops_messages(fake_gpu):
    q, cache, w, lens, table, meta = _operands()
    fake_gpu.on()
    attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256)
    shifted = torch.zeros(cache.numel() + 16, dtype=torch.uint8)[1:cache.numel() + 1].view(cache.shape)
    with pytest.raises(ValueError, match="kv_cache must start 16-byte aligned"):  # same signature, 1 byte off
        attention.fp8_paged_mqa_logits(q, shifted, w, lens, table, meta, 256)
    q_off = torch.zeros(q.numel() + 16, dtype=torch.uint8)[8:q.numel() + 8].view(torch.float8_e4m3fn).view(q.shape)
    q_off.copy_(q)
    attention.fp8_paged_mqa_logits(q_off, cache, w, lens, table, meta, 256)  # the op's path copies q
    q_map = [s for s in fake_gpu.specs if s.global_dims[0] == D and s.box_dims[1] == H][-1]
    assert q_map.global_address != q_off.data_ptr() and q_map.global_address % 16 == 0
    assert len(fake_gpu.launches) == 2 and _plans() == 1
    (plan,) = attention._paged_entry.plans.values()
    assert not any(key[0] == q_off.data_ptr() for key in plan.seen)


@pytest.mark.parametrize("change", ["batch", "next_n", "table-stride", "dtype", "pdl", "num_sms"])
def test_each_signature_change_misses(fake_gpu, change):
    q, cache, w, lens, table, meta = _operands()
    fake_gpu.on()
    attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256)
    dtype = torch.float32
    if change == "batch":
        q, cache, w, lens, table, meta = _operands(batch=3)
    elif change == "next_n":
        q, cache, w, lens, table, meta = _operands(next_n=2)
    elif change == "table-stride":
        table = torch.cat([table, table], 1)[:, :BLOCKS_PER_ROW]
    elif change == "dtype":
        dtype = torch.bfloat16
    elif change == "pdl":
        utils.set_pdl(True)
    else:
        utils.set_num_sms(utils.get_num_sms() - 1)
    try:
        if change == "num_sms":  # the cached schedule no longer fits: the op's message
            with pytest.raises(ValueError, match=r"schedule_meta must be \[get_num_sms\(\) \+ 1, 2\]"):
                attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256)
            assert _plans() == 1
            return
        fast = attention.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, 256, False, dtype)
        slow = attention._paged_impl(q, cache, w, lens, table, meta, 256, False, dtype)
        _same_launch(*fake_gpu.launches[-2:], fast, slow)
        assert _plans() == 2
    finally:
        utils.set_pdl(False)
        utils.set_num_sms(0)


def test_compat_spellings_take_the_plan(fake_gpu):
    args = _operands()
    fake_gpu.on()
    compat_attention.fp8_fp4_paged_mqa_logits((args[0], None), *args[1:], 256)
    compat_attention.fp8_paged_mqa_logits(*args, 256)
    assert _plans() == 1 and len(fake_gpu.launches) == 2
    assert fake_gpu.launches[0]["params"][LOGITS.stop:] == fake_gpu.launches[1]["params"][LOGITS.stop:]


def test_deterministic_fill_takes_the_ops_allocation(fake_gpu):
    """torch's deterministic mode NaN-fills new memory; the kernel leaves entries unwritten, so the plan's allocator
    (which does not fill) must not serve then."""
    args = _operands()
    fake_gpu.on()
    attention.fp8_paged_mqa_logits(*args, 256)
    torch.use_deterministic_algorithms(True)
    try:
        out = attention.fp8_paged_mqa_logits(*args, 256)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.isnan(out).all()


def test_slot_left_dirty_by_another_launch_is_fully_rewritten(fake_gpu):
    """The thread's slot is shared by every launch of the thread: the plan writes all 640 bytes (the reserved tail
    zero), whatever another launch left there."""
    args = _operands()
    fake_gpu.on()
    slot = drv.param_slot(640)
    slot.view[:640] = b"\xff" * 640
    fast = attention.fp8_paged_mqa_logits(*args, 256)
    assert fake_gpu.launches[-1]["params_address"] == slot.address
    slot.view[:640] = b"\xff" * 640
    slow = attention._paged_impl(*args, 256, False, torch.float32)
    _same_launch(*fake_gpu.launches[-2:], fast, slow)


# ---------------------------------------------------------------------------------------------- dense (prefill)
def _dense_operands(seq_len: int = 6, seq_len_kv: int = 300, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(seq_len, H, D, generator=g) * 0.5).to(torch.float8_e4m3fn)
    kv = (torch.randn(seq_len_kv, D, generator=g) * 0.5).to(torch.float8_e4m3fn)
    scales = torch.rand(seq_len_kv, generator=g) + 0.5
    w = torch.randn(seq_len, H, generator=g)
    ks = torch.randint(0, seq_len_kv // 2, (seq_len,), generator=g, dtype=torch.int32)
    ke = ks + torch.randint(1, seq_len_kv // 2, (seq_len,), generator=g, dtype=torch.int32)
    return q, (kv, scales), w, ks, ke


def _dense_plans() -> int:
    return plans.stats()["attention.dense.mqa_logits"][0]


@pytest.mark.parametrize("clean,max_k", [(True, 0), (False, 0), (False, 64)])
def test_dense_cpu_calls_through_a_plan_give_the_reference(clean, max_k):
    args = _dense_operands()
    expected = attention.fp8_mqa_logits_reference(*args, clean, max_k)
    for _ in range(3):
        out = attention.fp8_mqa_logits(*args, clean, max_k)
        assert torch.equal(out, expected) and out.stride() == expected.stride()
    assert _dense_plans() == 1
    other = _dense_operands(seed=1)
    assert torch.equal(attention.fp8_mqa_logits(*other, clean, max_k),
                       attention.fp8_mqa_logits_reference(*other, clean, max_k))
    assert _dense_plans() == 1


def test_dense_cpu_errors_after_a_cached_call_are_the_ops():
    q, kv, w, ks, ke = _dense_operands()
    attention.fp8_mqa_logits(q, kv, w, ks, ke)
    with pytest.raises(ValueError, match="clean_logits must be False with compressed logits"):
        attention.fp8_mqa_logits(q, kv, w, ks, ke, True, 64)
    with pytest.raises(TypeError, match="max_seqlen_k must be an int"):
        attention.fp8_mqa_logits(q, kv, w, ks, ke, False, True)
    with pytest.raises(TypeError, match="kv must be a \\(values, scales\\) pair"):
        attention.fp8_mqa_logits(q, kv[0], w, ks, ke)
    with pytest.raises(TypeError, match="weights must be float32 on SM90"):
        attention.fp8_mqa_logits(q, kv, w.bfloat16(), ks, ke)
    with pytest.raises(ValueError, match="logits_dtype must be torch.float32 or torch.bfloat16"):
        attention.fp8_mqa_logits(q, kv, w, ks, ke, True, 0, torch.float16)
    assert _dense_plans() == 1


def test_dense_subclasses_take_the_custom_op():
    class Sub(torch.Tensor):
        pass

    q, *rest = _dense_operands()
    out = attention.fp8_mqa_logits(q.as_subclass(Sub), *rest)
    assert _dense_plans() == 0 and torch.equal(out, attention.fp8_mqa_logits_reference(q, *rest))


@pytest.mark.parametrize("seq_len,clean,max_k,dtype", [(6, True, 0, torch.float32), (64, False, 0, torch.float32),
                                                       (5, False, 100, torch.bfloat16), (4, True, 0, torch.float32)])
def test_dense_plan_launches_what_the_op_launches(fake_gpu, seq_len, clean, max_k, dtype):
    """Each call launches the op's bytes (but the fresh logits' address), grid, block, shared memory, stream and PDL
    attribute, and returns logits of the op's shape, strides and storage size (a buffer with more rows than seq_len,
    its columns only, or the whole buffer)."""
    q, (kv, s), w, ks, ke = _dense_operands(seq_len=seq_len, seq_len_kv=768 if seq_len == 4 else 300)
    fake_gpu.on()
    kept = []
    for call in range(3):
        fast = attention.fp8_mqa_logits(q, (kv, s), w, ks, ke, clean, max_k, dtype)
        slow = attention._dense_impl(q, kv, s, w, ks, ke, clean, max_k, dtype)
        kept += [fast, slow]
        _same_launch(*fake_gpu.launches[-2:], fast, slow)
        assert len(fake_gpu.launches) == 2 * (call + 1) and fake_gpu.launches[-1]["stream"] == 0x77
    (plan,) = attention._dense_entry.plans.values()
    assert plan.call == plan._launch


def test_dense_block_is_reused_for_repeated_pointers(fake_gpu):
    args = _dense_operands()
    fake_gpu.on()
    first = attention.fp8_mqa_logits(*args)  # alive: its address is not the buffer's below
    (plan,) = attention._dense_entry.plans.values()
    buffer = torch.empty(plan.buffer)  # what a caching allocator does: the freed logits' address again
    plan._empty = lambda sizes, strides, dtype: buffer
    for _ in range(3):
        attention.fp8_mqa_logits(*args)
    (block,) = plan.blocks.values()
    assert [launch["params_address"] == block.address for launch in fake_gpu.launches[1:]] == [False, True, True]
    assert len(fake_gpu.specs) == 4 and first.data_ptr() != buffer.data_ptr()  # the four maps, encoded once


def test_dense_changed_pointers_take_the_ops_path(fake_gpu):
    """Same signature, q / kv scales 8 bytes off 16: the op's path copies them (its maps read the copies)."""
    q, (kv, s), w, ks, ke = _dense_operands()
    fake_gpu.on()
    attention.fp8_mqa_logits(q, (kv, s), w, ks, ke)
    q_off = torch.zeros(q.numel() + 16, dtype=torch.uint8)[8:q.numel() + 8].view(torch.float8_e4m3fn).view(q.shape)
    q_off.copy_(q)
    attention.fp8_mqa_logits(q_off, (kv, s), w, ks, ke)
    s_off = torch.zeros(s.numel() + 4)[2:s.numel() + 2]
    s_off.copy_(s)
    attention.fp8_mqa_logits(q, (kv, s_off), w, ks, ke)
    addresses = {spec.global_address for spec in fake_gpu.specs}
    assert q_off.data_ptr() not in addresses and s_off.data_ptr() not in addresses
    assert len(fake_gpu.launches) == 3 and _dense_plans() == 1


@pytest.mark.parametrize("change", ["seq_len", "clean", "max_k", "dtype", "w-stride", "num_sms"])
def test_dense_each_signature_change_misses(fake_gpu, change):
    q, (kv, s), w, ks, ke = _dense_operands()
    fake_gpu.on()
    attention.fp8_mqa_logits(q, (kv, s), w, ks, ke)
    clean, max_k, dtype = True, 0, torch.float32
    if change == "seq_len":
        q, (kv, s), w, ks, ke = _dense_operands(seq_len=9)
    elif change == "clean":
        clean = False
    elif change == "max_k":
        clean, max_k = False, 64
    elif change == "dtype":
        dtype = torch.bfloat16
    elif change == "w-stride":
        w = torch.cat([w, w], 1)[:, :H]
    else:
        utils.set_num_sms(7)
    try:
        fast = attention.fp8_mqa_logits(q, (kv, s), w, ks, ke, clean, max_k, dtype)
        slow = attention._dense_impl(q, kv, s, w, ks, ke, clean, max_k, dtype)
        _same_launch(*fake_gpu.launches[-2:], fast, slow)
    finally:
        utils.set_num_sms(0)
    assert _dense_plans() == 2


def test_dense_deterministic_fill_takes_the_ops_allocation(fake_gpu):
    args = _dense_operands()
    fake_gpu.on()
    attention.fp8_mqa_logits(*args)
    torch.use_deterministic_algorithms(True)
    try:
        out = attention.fp8_mqa_logits(*args)
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.isnan(out).all()


@pytest.mark.parametrize("which", ["q", "kv", "kv_scales", "weights"])
def test_dense_new_operand_address_gets_its_maps(fake_gpu, which):
    """Same signature, one operand moved: the launch reads the moved one (the op's bytes), maps re-encoded."""
    q, (kv, s), w, ks, ke = _dense_operands()
    fake_gpu.on()
    attention.fp8_mqa_logits(q, (kv, s), w, ks, ke)
    args = dict(q=q, kv=kv, kv_scales=s, weights=w)
    args[which] = args[which].clone()
    q, kv, s, w = args.values()
    fast = attention.fp8_mqa_logits(q, (kv, s), w, ks, ke)
    slow = attention._dense_impl(q, kv, s, w, ks, ke, True, 0, torch.float32)
    _same_launch(*fake_gpu.launches[-2:], fast, slow)
    assert args[which].data_ptr() in {spec.global_address for spec in fake_gpu.specs} and _dense_plans() == 1
