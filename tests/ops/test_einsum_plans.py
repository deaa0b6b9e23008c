"""``fp8_einsum``'s per-call plans (``ops.einsum_plans.Fp8EinsumPlan``, issue 45): nothing the cached path skips can
let a bad call through or change a result, and on a GPU it launches what the op's own path launches.

The GPU side runs on the CPU as in tests/ops/test_bf16_plans.py: tests/runtime/test_driver.py's FakeDriver, tensor
maps "encoded" into bytes that name their arguments, ``runtime.target`` mapping CPU tensors to GPU 0. The op's path
(``ops.einsum._fp8_einsum``) allocates sA's M-major copy and ``masked_m`` per call, the plan its own sA copy and a
``masked_m`` per stream, so those two addresses are the only bytes compared apart (sA's map is compared without its
address, ``masked_m``'s pointer by the counts it points at).
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
import torch

from deep_fp8_gemm import utils
from deep_fp8_gemm._core import plans as core_plans
from deep_fp8_gemm.kernels import gemm as gemm_host
from deep_fp8_gemm.kernels import launching
from deep_fp8_gemm.ops import einsum
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime import target
from deep_fp8_gemm.runtime.tensor_map import TmaDtype
from tests.runtime.test_driver import FakeDriver

FP8, F32, BF16, I32 = torch.float8_e4m3fn, torch.float32, torch.bfloat16, torch.int32
NB, H, R, DD = 6, 3, 256, 128
EXPR = "bhr,hdr->bhd"
_GL_PACK, _GL_START = gemm_host.params_packer(("grouped_layout",)).bound()


@pytest.fixture(autouse=True)
def _fresh_plans():
    core_plans.clear()
    yield
    core_plans.clear()


def _operands(seed: int = 0, nb: int = NB):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(nb, H, R, generator=g) * 4).to(FP8)
    sx = torch.rand(nb, H, R // 128, generator=g) + 0.5
    y = (torch.randn(H, DD, R, generator=g) * 4).to(FP8)
    sy = torch.rand(H, DD // 128, R // 128, generator=g) + 0.5
    return (x, sx), (y, sy)


def _stats() -> tuple[int, int]:
    return core_plans.stats()["einsum.fp8_einsum"]


def _plan():
    (plan,) = einsum._FP8_ENTRY.plans.values()
    return plan


# ---------------------------------------------------------------------------------------------- CPU
def test_cpu_calls_through_a_plan_give_the_ops_bits():
    a, b = _operands()
    expected = torch.empty(NB, H, DD, dtype=BF16)
    einsum._fp8_einsum(EXPR, a, b, expected)
    for _ in range(3):
        d = torch.full((NB, H, DD), 5.0, dtype=BF16)
        einsum.fp8_einsum(EXPR, a, b, d)
        assert torch.equal(d, expected)
    assert _stats() == (1, 1)
    a2, b2 = _operands(seed=1)  # new data, same signature: still computed
    d, ref = torch.empty(NB, H, DD, dtype=BF16), torch.empty(NB, H, DD, dtype=BF16)
    einsum.fp8_einsum(EXPR, a2, b2, d)
    einsum._fp8_einsum(EXPR, a2, b2, ref)
    assert torch.equal(d, ref) and _stats()[0] == 1


def test_cpu_errors_after_a_cached_call_are_the_ops():
    a, b = _operands()
    d = torch.empty(NB, H, DD, dtype=BF16)
    einsum.fp8_einsum(EXPR, a, b, d)
    with pytest.raises(ValueError, match="d must not overlap a\\[0\\]"):
        einsum.fp8_einsum(EXPR, a, b, a[0].view(-1)[:2 * NB * H * DD].view(BF16).view(NB, H, DD))
    with pytest.raises(TypeError, match="fp8_einsum: a\\[0\\] must be torch.float8_e4m3fn"):
        einsum.fp8_einsum(EXPR, (a[0].to(BF16), a[1]), b, d)
    with pytest.raises(ValueError, match="fp8_einsum: expr must be one of"):
        einsum.fp8_einsum("bhd,hdr->bhr", a, b, d)
    with pytest.raises(ValueError, match="fp8_einsum: recipe must be"):
        einsum.fp8_einsum(EXPR, a, b, d, recipe=(1, 1, 128))


def test_c_and_empty_take_the_ops_path():
    a, b = _operands()
    c = torch.randn(NB, H, DD).to(BF16)
    d, ref = torch.empty(NB, H, DD, dtype=BF16), torch.empty(NB, H, DD, dtype=BF16)
    einsum.fp8_einsum(EXPR, a, b, d, c)
    einsum._fp8_einsum(EXPR, a, b, ref, c)
    assert torch.equal(d, ref) and _stats() == (0, 0)
    a0, _ = _operands(nb=0)
    einsum.fp8_einsum(EXPR, a0, b, torch.empty(0, H, DD, dtype=BF16))
    assert _stats()[0] == 1


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors launch through the plans into FakeDriver; tensor maps encode to bytes naming their spec, sA's
    (the only float32 map) without its address (the op and the plan each convert sA into memory of their own)."""
    fake = FakeDriver()
    fake.param_sizes = [gemm_host.PARAMS_BYTES]
    monkeypatch.setattr(drv, "driver", fake)
    drv._reset_for_tests()
    launching.cuda_function.cache_clear()
    specs = []

    def encode(spec):
        specs.append(spec)
        if spec.dtype == TmaDtype.FLOAT32:
            spec = dataclasses.replace(spec, global_address=0)
        return hashlib.sha512(repr(spec).encode()).digest() * 2

    monkeypatch.setattr(drv, "encode_tensor_map", encode)
    streams = [0x77]

    def on(stream: int = 0x77):
        streams[0] = stream
        monkeypatch.setattr(target, "gpu_index", lambda device: None if device.type == "meta" else 0)
        monkeypatch.setattr(target, "capability", lambda index: (9, 0))
        monkeypatch.setattr(target, "current_stream", lambda index: streams[0])
        monkeypatch.setattr(target, "current_device", lambda: 0)
        monkeypatch.setattr(target, "is_capturing", lambda index: False)

    fake.on, fake.specs, fake.streams = on, specs, streams
    yield fake
    core_plans.clear()
    drv._reset_for_tests()
    launching.cuda_function.cache_clear()


_FIELDS = ("grid", "block", "smem", "stream", "attrs", "function")


def _counts_at(pointer: int, plan) -> list[int]:
    (counts,) = [t for t in plan.counts.values() if t.data_ptr() == pointer]
    return counts.tolist()


def _same_launch(fast: dict, slow: dict) -> int:
    """Equal launches but for the masked_m pointer; returns the fast launch's masked_m pointer."""
    for field in _FIELDS:
        assert fast[field] == slow[field], field
    fp, sp = bytearray(fast["params"]), bytearray(slow["params"])
    pointer = int.from_bytes(fp[_GL_START:_GL_START + 8], "little")
    fp[_GL_START:_GL_START + 8] = sp[_GL_START:_GL_START + 8] = bytes(8)
    assert fp == sp
    return pointer


def _m_major(sx: torch.Tensor) -> torch.Tensor:
    """``sx`` with strides whose ``permute(1, 0, 2)`` is the M-major TMA-aligned layout (no conversion needed)."""
    nb, h, kb = sx.shape
    buf = torch.zeros(h, kb, utils.get_tma_aligned_size(nb, 4))
    out = buf.permute(2, 0, 1)[:nb]
    out.copy_(sx)
    return out


@pytest.mark.parametrize("scales", ["row-major", "m-major"])
def test_plan_launches_what_the_op_launches(fake_gpu, scales):
    """The call that builds the plan, the second and the third each launch the op's bytes (but for its own sA copy
    and masked_m), grid, block, shared memory, stream and attributes; sx read in place (its permuted view M-major
    already) is never copied, and its pointers get a block of their own from the second call."""
    a, b = _operands()
    if scales == "m-major":
        a = (a[0], _m_major(a[1]))
    d = torch.zeros(NB, H, DD, dtype=BF16)
    fake_gpu.on()
    for call in range(3):
        einsum.fp8_einsum(EXPR, a, b, d)
        einsum._fp8_einsum(EXPR, a, b, d)
        fast, slow = fake_gpu.launches[-2:]
        pointer = _same_launch(fast, slow)
        assert _counts_at(pointer, _plan()) == [NB] * H and fast["stream"] == 0x77
    plan = _plan()
    assert plan.call == plan._launch and len(plan.counts) == 1 and plan.convert == (scales == "row-major")
    if scales == "m-major":
        sa_maps = {s.global_address for s in fake_gpu.specs if s.dtype == TmaDtype.FLOAT32}
        assert a[1].data_ptr() in sa_maps and len(plan.gemm.blocks) == 1


def test_masked_m_per_stream_and_per_capture(fake_gpu, monkeypatch):
    """Eager: one masked_m per stream, filled there; under capture a new one per call, never cached."""
    a, b = _operands()
    d = torch.zeros(NB, H, DD, dtype=BF16)
    fake_gpu.on()
    einsum.fp8_einsum(EXPR, a, b, d)
    fake_gpu.streams[0] = 0x99
    einsum.fp8_einsum(EXPR, a, b, d)
    plan = _plan()
    assert sorted(plan.counts) == [0x77, 0x99] and fake_gpu.launches[-1]["stream"] == 0x99
    monkeypatch.setattr(target, "is_capturing", lambda index: True)
    made = []
    full = torch.full
    monkeypatch.setattr(torch, "full", lambda *args, **kw: made.append(full(*args, **kw)) or made[-1])
    einsum.fp8_einsum(EXPR, a, b, d)
    pointer = int.from_bytes(fake_gpu.launches[-1]["params"][_GL_START:_GL_START + 8], "little")
    assert len(made) == 1 and pointer == made[0].data_ptr() and made[0].tolist() == [NB] * H
    assert sorted(plan.counts) == [0x77, 0x99]


def test_changed_pointers_are_checked_with_the_ops_messages(fake_gpu):
    a, b = _operands()
    a = (a[0], _m_major(a[1]))  # sx read in place: its pointers' block is deterministic
    d = torch.zeros(NB, H, DD, dtype=BF16)
    fake_gpu.on()
    for _ in range(2):
        einsum.fp8_einsum(EXPR, a, b, d)
    launches = len(fake_gpu.launches)
    plan = _plan()
    flat = a[0].view(-1)
    with pytest.raises(ValueError, match="d must not overlap a\\[0\\]"):
        einsum.fp8_einsum(EXPR, a, b, flat[:2 * NB * H * DD].view(BF16).view(NB, H, DD))
    wide = torch.zeros(H * DD * R, dtype=BF16)  # d at its start, an input's bytes copied over it
    view = wide[:NB * H * DD].view(NB, H, DD)
    for name, t in (("a[1]", a[1]), ("b[0]", b[0]), ("b[1]", b[1])):
        raw = wide.view(torch.uint8)[:t.untyped_storage().nbytes()]
        alias = raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())  # t's signature
        alias.copy_(t)
        aa = (a[0], alias) if name == "a[1]" else a
        bb = {"b[0]": (alias, b[1]), "b[1]": (b[0], alias)}.get(name, b)
        with pytest.raises(ValueError, match=f"d must not overlap {name[0]}\\[{name[2]}\\]"):
            einsum.fp8_einsum(EXPR, aa, bb, view)
    assert len(fake_gpu.launches) == launches and einsum._FP8_ENTRY.plans and _plan() is plan
    einsum.fp8_einsum(EXPR, a, b, d)  # the checked pointers: launched from the GEMM plan's block
    assert len(plan.gemm.blocks) == 1 and len(fake_gpu.launches) == launches + 1


def test_misaligned_operand_is_copied_by_the_ops_path(fake_gpu):
    """Same signature, x 16 bytes + 8 off: the op's path copies x (its map reads the copy) and launches."""
    a, b = _operands()
    d = torch.zeros(NB, H, DD, dtype=BF16)
    fake_gpu.on()
    einsum.fp8_einsum(EXPR, a, b, d)
    shifted = torch.zeros(NB * H * R + 16, dtype=FP8)[8:NB * H * R + 8].view(NB, H, R)
    shifted.copy_(a[0])
    einsum.fp8_einsum(EXPR, (shifted, a[1]), b, d)
    a_map = [s for s in fake_gpu.specs if s.dtype == TmaDtype.UINT8 and s.global_dims[:2] == (R, NB)][-1]
    assert a_map.global_address != shifted.data_ptr() and a_map.global_address % 16 == 0
    assert len(fake_gpu.launches) == 2 and _stats()[0] == 1


@pytest.mark.parametrize("layout", ["sy-strided", "x-rows", "d-rows"])
def test_copy_needing_signatures_take_the_ops_path(fake_gpu, layout):
    """Strides the kernel's maps cannot read in place (the op copies on every call): never the fast path."""
    a, b = _operands()
    d = torch.zeros(NB, H, DD, dtype=BF16)
    if layout == "sy-strided":
        sy = torch.zeros(H, DD // 128, R // 128 + 2)[:, :, :R // 128]
        sy.copy_(b[1])
        b = (b[0], sy)
    elif layout == "x-rows":
        x = torch.zeros(NB, H, R + 8, dtype=FP8)[:, :, :R]
        x.copy_(a[0])
        a = (x, a[1])
    else:
        d = torch.zeros(NB, H, DD + 4, dtype=BF16)[:, :, :DD]
    fake_gpu.on()
    for _ in range(2):
        einsum.fp8_einsum(EXPR, a, b, d)
    plan = _plan()
    assert plan.call is plan.op and len(fake_gpu.launches) == 2


# ---------------------------------------------------------------------------------------------- sx read where it lies
HK = 4  # heads for the K- / G-major layouts: G-major needs h % 4 == 0, K-major kb % 4 == 0 (r = 512)
RK = 512


def _where_it_lies(major: str, nb: int = NB):
    """Operands with sx as the consumers pass it: "k" row-major ``[b, h, kb]``, "g" per_token_cast_to_fp8's M-major
    ``[b * h, kb]`` viewed back (strides ``(h, 1, align(b * h, 4))``)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(nb, HK, RK, generator=g) * 4).to(FP8)
    sx = torch.rand(nb, HK, RK // 128, generator=g) + 0.5
    if major == "g":
        flat = utils.get_col_major_tma_aligned_tensor(sx.reshape(nb * HK, -1))
        sx = flat.view(nb, HK, -1)
        assert sx.stride() == (HK, 1, utils.get_tma_aligned_size(nb * HK, 4))
    y = (torch.randn(HK, DD, RK, generator=g) * 4).to(FP8)
    sy = torch.rand(HK, DD // 128, RK // 128, generator=g) + 0.5
    assert gemm_host.sa_major_of(sx.permute(1, 0, 2)) == major
    return (x, sx), (y, sy), torch.zeros(nb, HK, DD, dtype=BF16)


def _refuse_sa_copies(monkeypatch) -> None:
    """From here on any conversion of sA raises: the M-major copy of the op (normalise_scales,
    get_col_major_tma_aligned_tensor) and of the plan (its copy_ into a tensor of its own)."""
    def refuse(*args, **kwargs):
        raise AssertionError("sA copied")

    from deep_fp8_gemm.ops import gemm_family

    monkeypatch.setattr(gemm_family, "normalise_scales", refuse)
    monkeypatch.setattr(core_plans, "normalise_scales", refuse)
    monkeypatch.setattr(utils, "get_col_major_tma_aligned_tensor", refuse)
    monkeypatch.setattr(torch.Tensor, "copy_", refuse)


@pytest.mark.parametrize("major", ["k", "g"])
def test_sx_where_it_lies_launches_the_ops_bytes_without_a_copy(fake_gpu, monkeypatch, major):
    """Row-major sx (kb % 4 == 0) and the library quantiser's sx viewed back (h % 4 == 0): the plan and the op both
    launch the kernel of that sA layout with sx's own address in the sA map, byte for byte the same parameters (but
    masked_m's pointer); nothing copies sA (the copies raise)."""
    a, b, d = _where_it_lies(major)
    fake_gpu.on()
    _refuse_sa_copies(monkeypatch)
    for call in range(3):
        einsum.fp8_einsum(EXPR, a, b, d)
        einsum._fp8_einsum(EXPR, a, b, d)
        _same_launch(*fake_gpu.launches[-2:])
    plan = _plan()
    assert plan.call == plan._launch and not plan.convert and plan.gemm.cfg.sa_major == major
    assert plan.gemm.fast and len(plan.gemm.blocks) == 1 and "_sa" + major in plan.gemm.cfg.kernel_name()
    sa_maps = [s for s in fake_gpu.specs if s.dtype == TmaDtype.FLOAT32]
    assert sa_maps and {s.global_address for s in sa_maps} == {a[1].data_ptr()}
    nb, kb = NB, RK // 128
    dims = (kb, nb, HK) if major == "k" else (HK, nb, kb)
    assert {(s.global_dims, s.box_dims) for s in sa_maps} == {(dims, (4, plan.gemm.cfg.block_m, 1))}


@pytest.mark.parametrize("major", ["k", "g"])
def test_a_plan_made_on_a_misaligned_sx_serves_aligned_calls(fake_gpu, major):
    """The signature's first call with sx 4 bytes off 16 (the op's path: copied) makes a plan that later aligned
    calls of the same signature go through, launching the op's bytes: the layout is the signature's, the address
    each call's (a plan that judged the first call's address would leave every later call on the op's path)."""
    a, b, d = _where_it_lies(major)
    sx = a[1]
    raw = torch.zeros(sx.untyped_storage().nbytes() // 4 + 1)
    shifted = raw.as_strided(sx.shape, sx.stride(), sx.storage_offset() + 1)  # 4 bytes on
    shifted.copy_(sx)
    fake_gpu.on()
    einsum.fp8_einsum(EXPR, (a[0], shifted), b, d)
    plan = _plan()
    assert plan.call == plan._launch and plan.gemm.fast and plan.gemm.cfg.sa_major == major
    for _ in range(2):
        einsum.fp8_einsum(EXPR, a, b, d)
        einsum._fp8_einsum(EXPR, a, b, d)
        _same_launch(*fake_gpu.launches[-2:])
    assert _plan() is plan and len(plan.gemm.blocks) == 1


@pytest.mark.parametrize("major", ["k", "g"])
def test_sx_where_it_lies_misaligned_or_overlapped_takes_the_ops_path(fake_gpu, major):
    """Same signature, sx 4 bytes off 16: the op's path copies it into the M-major layout for the M-major kernel; a d
    over sx raises the op's message and launches nothing."""
    a, b, d = _where_it_lies(major)
    fake_gpu.on()
    for _ in range(2):
        einsum.fp8_einsum(EXPR, a, b, d)
    plan, launches = _plan(), len(fake_gpu.launches)
    sx = a[1]
    raw = torch.zeros(sx.untyped_storage().nbytes() // 4 + 1)
    shifted = raw.as_strided(sx.shape, sx.stride(), sx.storage_offset() + 1)  # 4 bytes on
    shifted.copy_(sx)
    assert shifted.data_ptr() % 16 == 4
    einsum.fp8_einsum(EXPR, (a[0], shifted), b, d)
    assert len(fake_gpu.launches) == launches + 1 and fake_gpu.launches[-1]["smem"] < fake_gpu.launches[-2]["smem"]
    sa_map = [s for s in fake_gpu.specs if s.dtype == TmaDtype.FLOAT32][-1]  # the M-major copy's
    assert sa_map.global_address % 16 == 0 and sa_map.box_dims == (64, 1, 1) and _plan() is plan
    wide = torch.zeros(max(sx.untyped_storage().nbytes(), d.numel() * 2), dtype=torch.uint8)  # d and sx at its start
    alias = wide.view(torch.float32).as_strided(sx.shape, sx.stride(), sx.storage_offset())
    alias.copy_(sx)
    over = wide[:NB * HK * DD * 2].view(BF16).view(NB, HK, DD)
    with pytest.raises(ValueError, match="d must not overlap a\\[1\\]"):
        einsum.fp8_einsum(EXPR, (a[0], alias), b, over)
    assert len(fake_gpu.launches) == launches + 1


@pytest.mark.parametrize("change", ["b", "d-stride", "num_sms"])
def test_each_signature_change_misses(fake_gpu, change):
    a, b = _operands()
    d = torch.zeros(NB, H, DD, dtype=BF16)
    fake_gpu.on()
    einsum.fp8_einsum(EXPR, a, b, d)
    if change == "b":
        a, _ = _operands(nb=NB + 2)
        d = torch.zeros(NB + 2, H, DD, dtype=BF16)
    elif change == "d-stride":
        d = torch.zeros(NB, H, DD + 8, dtype=BF16)[:, :, :DD]
    try:
        if change == "num_sms":
            utils.set_num_sms(7)
        einsum.fp8_einsum(EXPR, a, b, d)
        einsum._fp8_einsum(EXPR, a, b, d)
        _same_launch(*fake_gpu.launches[-2:])
    finally:
        if change == "num_sms":
            utils.set_num_sms(0)
    assert _stats()[0] == 2


# ---------------------------------------------------------------------------------------------- BF16 head expressions
HEAD_EXPRS = ("bhr,hdr->bhd", "bhd,hdr->bhr")


def _heads(expr: str, seed: int = 0, nb: int = NB):
    """``(a, b, d)`` of a head expression (``d`` zeros)."""
    g = torch.Generator().manual_seed(seed)
    k, n = (R, DD) if expr == "bhr,hdr->bhd" else (DD, R)
    a = torch.randn(nb, H, k, generator=g).to(BF16)
    b = torch.randn(H, DD, R, generator=g).to(BF16)
    return a, b, torch.zeros(nb, H, n, dtype=BF16)


def _head_stats(expr: str) -> tuple[int, int]:
    return core_plans.stats()[f"einsum.einsum {expr}"]


@pytest.mark.parametrize("expr", HEAD_EXPRS)
def test_head_cpu_calls_through_a_plan_give_the_ops_bits(expr):
    a, b, expected = _heads(expr)
    einsum._einsum(expr, a, b, expected)
    for _ in range(3):
        d = torch.full_like(expected, 5.0)
        einsum.einsum(expr, a, b, d)
        assert torch.equal(d, expected)
    assert _head_stats(expr) == (1, 1)
    a2, b2, d = _heads(expr, seed=1)
    ref = d.clone()
    einsum.einsum(expr, a2, b2, d)
    einsum._einsum(expr, a2, b2, ref)
    assert torch.equal(d, ref) and _head_stats(expr)[0] == 1


def test_head_errors_after_a_cached_call_are_the_ops():
    expr = HEAD_EXPRS[0]
    a, b, d = _heads(expr)
    einsum.einsum(expr, a, b, d)
    with pytest.raises(ValueError, match="d must not overlap a"):
        einsum.einsum(expr, a, b, a.view(-1)[:d.numel()].view(d.shape))
    with pytest.raises(ValueError, match="c must be None"):
        einsum.einsum(expr, a, b, d, torch.zeros_like(d))
    with pytest.raises(TypeError, match="use_cublaslt must be a bool"):
        einsum.einsum(expr, a, b, d, use_cublaslt=1)
    with pytest.raises(TypeError, match="einsum: a must be torch.bfloat16"):
        einsum.einsum(expr, a.float(), b, d)
    assert _head_stats(expr)[0] == 1


@pytest.mark.parametrize("expr", HEAD_EXPRS)
def test_head_plan_launches_what_the_op_launches(fake_gpu, expr):
    """No temporaries: every launch's parameter bytes equal the op's, and from the second call a block serves."""
    from deep_fp8_gemm.kernels import bf16_gemm

    fake_gpu.param_sizes = [bf16_gemm.PARAMS_BYTES]
    a, b, d = _heads(expr)
    fake_gpu.on()
    for call in range(3):
        einsum.einsum(expr, a, b, d, use_cublaslt=call == 1)
        einsum._einsum(expr, a, b, d)
        fast, slow = fake_gpu.launches[-2:]
        for field in ("params",) + _FIELDS:
            assert fast[field] == slow[field], field
    (plan,) = einsum._HEAD_ENTRIES[expr].plans.values()
    assert plan.call == plan._launch and len(plan.blocks) == 1 and len(plan.heads) == 1


def test_head_pointer_changes_are_checked(fake_gpu):
    """Same signature: d over a or b raises the op's message; a misaligned a is copied by the op's path."""
    from deep_fp8_gemm.kernels import bf16_gemm

    fake_gpu.param_sizes = [bf16_gemm.PARAMS_BYTES]
    expr = HEAD_EXPRS[0]
    a, b, d = _heads(expr)
    fake_gpu.on()
    for _ in range(2):
        einsum.einsum(expr, a, b, d)
    launches = len(fake_gpu.launches)
    with pytest.raises(ValueError, match="d must not overlap a"):
        einsum.einsum(expr, a, b, a.view(-1)[:d.numel()].view(d.shape))
    with pytest.raises(ValueError, match="d must not overlap b"):
        einsum.einsum(expr, a, b, b.view(-1)[:d.numel()].view(d.shape))
    assert len(fake_gpu.launches) == launches
    shifted = torch.zeros(a.numel() + 8, dtype=BF16)[1:a.numel() + 1].view(a.shape)
    shifted.copy_(a)
    einsum.einsum(expr, shifted, b, d)
    a_map = [s for s in fake_gpu.specs if s.global_dims[0] == R and s.global_dims[1] == NB][-1]
    assert a_map.global_address != shifted.data_ptr() and a_map.global_address % 16 == 0
    assert _head_stats(expr)[0] == 1 and len(fake_gpu.launches) == launches + 1


@pytest.mark.parametrize("change", ["b", "a-stride", "num_sms"])
def test_head_signature_change_misses(fake_gpu, change):
    from deep_fp8_gemm.kernels import bf16_gemm

    fake_gpu.param_sizes = [bf16_gemm.PARAMS_BYTES]
    expr = HEAD_EXPRS[0]
    a, b, d = _heads(expr)
    fake_gpu.on()
    einsum.einsum(expr, a, b, d)
    if change == "b":
        a, b, d = _heads(expr, nb=NB + 2)
    elif change == "a-stride":
        wide = torch.zeros(NB, H, R + 8, dtype=BF16)[:, :, :R]
        wide.copy_(a)
        a = wide
    try:
        if change == "num_sms":
            utils.set_num_sms(7)
        einsum.einsum(expr, a, b, d)
        einsum._einsum(expr, a, b, d)
        fast, slow = fake_gpu.launches[-2:]
        for field in ("params",) + _FIELDS:
            assert fast[field] == slow[field], field
    finally:
        if change == "num_sms":
            utils.set_num_sms(0)
    assert _head_stats(expr)[0] == 2
