"""The BF16 names' per-call plans (``ops.bf16_plans.Bf16Plan``, issue 45): nothing the cached path skips can let
a bad call through or change a result, and on a GPU it launches exactly what the op's own path launches.

The GPU side runs on the CPU as in tests/ops/test_prepared.py: tests/runtime/test_driver.py's FakeDriver (real binding
types), tensor maps "encoded" into bytes that name their arguments, ``runtime.target`` mapping CPU tensors to GPU 0,
so the plan's parameter bytes and launch shape can be compared with those of the op without a plan
(``ops.bf16._dense``: the checks, ``pick_config``, ``kernels.bf16_gemm.launch``).
"""

from __future__ import annotations

import threading

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import utils
from deep_fp8_gemm._core import bf16_math
from deep_fp8_gemm.kernels import launching
from deep_fp8_gemm.ops import bf16
from tests._fake_gpu import fake_gpu as fake_gpu_context

BF16, F32 = torch.bfloat16, torch.float32
LAYOUTS = ("nt", "nn", "tn", "tt")
M, N, K = 40, 48, 96  # K-major rows of 192 bytes, MN-major rows of 80 / 96 bytes: every view TMA-readable


@pytest.fixture(autouse=True)
def _fresh_plans():
    bf16.clear_plans()
    yield
    bf16.clear_plans()


def _operands(layout: str, m: int = M, n: int = N, k: int = K, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*((m, k) if layout[0] == "n" else (k, m)), generator=g).to(BF16)
    b = torch.randn(*((n, k) if layout[1] == "t" else (k, n)), generator=g).to(BF16)
    return a, b


def _op(layout: str):
    return getattr(dfg, f"bf16_gemm_{layout}")


def _plans(layout: str) -> int:
    return bf16.plan_stats()[f"dense_{layout}"][0]


# ---------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("out,accumulate", [(BF16, False), (F32, False), (F32, True), (BF16, True)])
def test_cpu_calls_through_a_plan_give_the_reference_bits(layout, out, accumulate):
    """A CPU plan never caches what reaches a result: every call (the one that builds it, the hits) equals the
    reference's bits, for a new d, an accumulating c and c = d in place."""
    a, b = _operands(layout)
    c = torch.randn(M, N, generator=torch.Generator().manual_seed(9)).to(out) if accumulate else None
    expected = bf16_math.bf16_gemm_reference(layout, a, b, torch.empty(M, N, dtype=out), c)
    for _ in range(3):
        d = torch.full((M, N), 5.0, dtype=out)
        _op(layout)(a, b, d, c)
        assert torch.equal(d, expected)
    assert _plans(layout) == 1
    if accumulate:
        d = c.clone()
        _op(layout)(a, b, d, d)
        assert torch.equal(d, expected)
    a2, b2 = _operands(layout, seed=1)  # new data, same signature: still computed
    d = torch.empty(M, N, dtype=out)
    _op(layout)(a2, b2, d, c)
    assert torch.equal(d, bf16_math.bf16_gemm_reference(layout, a2, b2, torch.empty(M, N, dtype=out), c))


def test_cpu_errors_after_a_cached_call_are_the_ops():
    a, b = _operands("nt")
    d = torch.empty(M, N, dtype=BF16)
    dfg.bf16_gemm_nt(a, b, d)
    with pytest.raises(ValueError, match="d must not overlap a"):
        dfg.bf16_gemm_nt(a, b, a.view(-1)[:M * N].view(M, N))
    with pytest.raises(TypeError, match="bf16_gemm_nt: a must be torch.bfloat16"):
        dfg.bf16_gemm_nt(a.float(), b, d)
    with pytest.raises(ValueError, match="shapes do not agree"):
        dfg.bf16_gemm_nt(a, b[:, :64], d)
    assert torch.equal(d, bf16_math.bf16_gemm_reference("nt", a, b, torch.empty_like(d)))


def test_subclasses_and_meta_take_the_ops_path():
    class Sub(torch.Tensor):
        pass

    a, b = _operands("nt")
    d = torch.empty(M, N, dtype=BF16)
    dfg.bf16_gemm_nt(a.as_subclass(Sub), b, d)
    assert _plans("nt") == 0
    dfg.bf16_gemm_nt(a, torch.nn.Parameter(b, requires_grad=False), d)  # a weight: planned
    assert _plans("nt") == 1
    dfg.bf16_gemm_nt(a.to("meta"), b.to("meta"), d.to("meta"))  # shapes only
    assert _plans("nt") == 2


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors launch through the plans into FakeDriver; tensor maps encode to bytes naming their spec."""
    with fake_gpu_context(monkeypatch, caches=(launching.cuda_function.cache_clear,)) as fake:
        yield fake


def _a_maps(fake) -> list:
    """The encoded maps of a K-major ``[M, K]`` A (B's are ``[N, K]``), oldest first."""
    return [s for s in fake.specs if s.global_dims[:2] == (K, M)]


_FIELDS = ("params", "grid", "block", "smem", "stream", "attrs", "function")


def _same_launch(fast: dict, slow: dict) -> None:
    for field in _FIELDS:
        assert fast[field] == slow[field], field


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("variant", ["bf16", "fp32+c", "in-place"])
def test_plan_launches_what_the_op_launches(fake_gpu, layout, variant):
    """The call that builds the plan (thread slot), the second (its block built) and the third (block hit) each
    launch the op's own bytes, grid, block, shared memory, stream and PDL attribute."""
    a, b = _operands(layout)
    out = BF16 if variant == "bf16" else F32
    d = torch.zeros(M, N, dtype=out)
    c = None if variant == "bf16" else (d if variant == "in-place" else torch.zeros(M, N, dtype=out))
    fake_gpu.on()
    for call in range(3):
        _op(layout)(a, b, d, c)
        bf16._dense(layout, a, b, d, c)
        fast, slow = fake_gpu.launches[-2:]
        _same_launch(fast, slow)
        assert len(fake_gpu.launches) == 2 * (call + 1) and fast["stream"] == 0x77 and len(fast["params"]) == 384
    (plan,) = bf16.plans_of(f"dense_{layout}")
    assert plan.call == plan._launch and len(plan.blocks) == 1 and len(plan.heads) == 1


def test_plan_reencodes_only_new_pointers(fake_gpu):
    a, b = _operands("nt")
    d = torch.zeros(M, N, dtype=BF16)
    fake_gpu.on()
    dfg.bf16_gemm_nt(a, b, d)
    encoded = len(fake_gpu.specs)
    dfg.bf16_gemm_nt(a, b, d)
    d2 = torch.zeros_like(d)
    dfg.bf16_gemm_nt(a, b, d2)  # a new d: no map to encode (D is a plain pointer in the parameters)
    assert len(fake_gpu.specs) == encoded == 2
    bf16._dense("nt", a, b, d2, None)
    assert fake_gpu.launches[-1]["params"] == fake_gpu.launches[-2]["params"]
    a2 = a.clone()
    dfg.bf16_gemm_nt(a2, b, d)  # a new A: its map only (B's hits the driver's cache)
    assert len(fake_gpu.specs) == encoded + 1 and fake_gpu.specs[-1].global_address == a2.data_ptr()
    assert _plans("nt") == 1


def test_changed_pointers_are_checked_with_the_ops_messages(fake_gpu):
    a, b = _operands("nt")
    d = torch.zeros(M, N, dtype=F32)
    fake_gpu.on()
    for _ in range(2):
        dfg.bf16_gemm_nt(a, b, d, d)
    launches = len(fake_gpu.launches)
    (plan,) = bf16.plans_of("dense_nt")
    wide = torch.zeros(M + N * K, dtype=F32)
    with pytest.raises(ValueError, match="d must not overlap a"):  # same signature, d over a's bytes
        dfg.bf16_gemm_nt(a, b, a.view(-1)[:2 * M * N].view(F32).view(M, N), torch.zeros(M, N, dtype=F32))
    with pytest.raises(ValueError, match="d must not overlap b"):
        dfg.bf16_gemm_nt(a, b, b.view(-1)[:2 * M * N].view(F32).view(M, N), torch.zeros(M, N, dtype=F32))
    with pytest.raises(ValueError, match="d must not overlap c"):  # c partly over d
        dfg.bf16_gemm_nt(a, b, wide[:M * N].view(M, N), wide[N:N + M * N].view(M, N))
    assert len(fake_gpu.launches) == launches and bf16.plans_of("dense_nt") == [plan] and len(plan.blocks) == 1
    dfg.bf16_gemm_nt(a, b, d, d)  # the checked tuple: launched from its block
    assert fake_gpu.launches[-1]["params"] == fake_gpu.launches[0]["params"]


def test_c_aliasing_d_is_checked_per_call(fake_gpu):
    """c and d are separate tensors of a signature; whether c *is* d depends on the pointers. With d's strides, c at
    d's address is in place (launches what the op launches, one plan); with other strides it is refused, as by the
    op, on a plan cached for another c."""
    a, b = _operands("nt")
    buf = torch.zeros(2, M, N + 8, dtype=F32)
    d, c = buf[0, :, :N], buf[1, :, :N]
    fake_gpu.on()
    dfg.bf16_gemm_nt(a, b, d, c)
    dfg.bf16_gemm_nt(a, b, d, d)  # same signature (c's strides are d's): in place
    bf16._dense("nt", a, b, d, d)
    assert fake_gpu.launches[-1]["params"] == fake_gpu.launches[-2]["params"] and _plans("nt") == 1
    with pytest.raises(ValueError, match="d must not overlap c"):
        dfg.bf16_gemm_nt(a, b, d, buf[0, :, 1:N + 1])
    dfg.bf16_gemm_nt(a, b, torch.zeros(M, N, dtype=F32), torch.zeros(M, N + 8, dtype=F32)[:, :N])  # a 2nd plan
    flat = torch.zeros(M * (N + 8), dtype=F32)
    with pytest.raises(ValueError, match="c starts where d does but has other strides"):
        dfg.bf16_gemm_nt(a, b, flat[:M * N].view(M, N), flat.view(M, N + 8)[:, :N])
    assert _plans("nt") == 2 and len(fake_gpu.launches) == 4


def test_misaligned_operand_is_copied_by_the_ops_path(fake_gpu):
    """Same signature, A's address 2 bytes off: the op's path copies A (its map reads the copy) and launches."""
    a, b = _operands("nt")
    d = torch.zeros(M, N, dtype=BF16)
    fake_gpu.on()
    dfg.bf16_gemm_nt(a, b, d)
    shifted = torch.zeros(M * K + 8, dtype=BF16)[1:M * K + 1].view(M, K)
    shifted.copy_(a)
    dfg.bf16_gemm_nt(shifted, b, d)
    a_map = _a_maps(fake_gpu)[-1]
    assert a_map.global_address != shifted.data_ptr() and a_map.global_address % 16 == 0
    assert len(fake_gpu.launches) == 2 and _plans("nt") == 1
    (plan,) = bf16.plans_of("dense_nt")
    assert not plan.blocks and not any(key[0] == shifted.data_ptr() for key in plan.seen)


def test_copy_needing_signature_copies_on_every_call(fake_gpu):
    """Row stride 136 bytes (not a 16-byte multiple): a TMA map cannot read A, so the plan runs the op's path, which
    copies on every call (the copy's address changes), never the fast path."""
    wide = torch.zeros(M, K + 4, dtype=BF16)
    a = wide[:, :K]
    a.copy_(_operands("nt")[0])
    _, b = _operands("nt")
    d = torch.zeros(M, N, dtype=BF16)
    fake_gpu.on()
    for call in range(3):
        dfg.bf16_gemm_nt(a, b, d)
        a_map = _a_maps(fake_gpu)[-1]
        assert a_map.global_address != a.data_ptr()
    (plan,) = bf16.plans_of("dense_nt")
    assert plan.call is plan.op and len(fake_gpu.launches) == 3


@pytest.mark.parametrize("change", ["m", "d-stride", "d-dtype", "a-major", "c-given", "num_sms", "pdl"])
def test_each_signature_change_misses(fake_gpu, change):
    a, b = _operands("nt")
    d = torch.zeros(M, N, dtype=BF16)
    fake_gpu.on()
    dfg.bf16_gemm_nt(a, b, d)
    args = [a, b, d]
    if change == "m":
        args = [a[:M - 8], b, d[:M - 8]]
    elif change == "d-stride":
        args[2] = torch.zeros(M, N + 8, dtype=BF16)[:, :N]
    elif change == "d-dtype":
        args[2] = torch.zeros(M, N, dtype=F32)
    elif change == "a-major":
        args[0] = a.T.contiguous().T
    elif change == "c-given":
        args.append(torch.zeros(M, N, dtype=BF16))
    pdl = utils.PROCESS_SETTINGS.pdl
    try:
        if change == "num_sms":
            utils.set_num_sms(3)
        elif change == "pdl":
            utils.set_pdl(not pdl)
        dfg.bf16_gemm_nt(*args)
        bf16._dense("nt", *args, *([None] if len(args) == 3 else []))
    finally:
        utils.set_num_sms(0)
        utils.set_pdl(pdl)
    _same_launch(*fake_gpu.launches[-2:])
    assert _plans("nt") == 2
    if change == "num_sms":
        assert fake_gpu.launches[-1]["grid"][0] <= 3


def test_null_stream_launches_in_the_kernels_context(fake_gpu):
    """Stream 0 with no context current: the plan launches through PreparedLaunch.launch's rule (the primary context
    made current), as the op does; with it current, straight from the block."""
    a, b = _operands("nt")
    d = torch.zeros(M, N, dtype=BF16)
    fake_gpu.on(stream=0)
    for _ in range(3):
        fake_gpu.current_ctx = 0
        dfg.bf16_gemm_nt(a, b, d)
        assert fake_gpu.launches[-1]["context"] != 0
    dfg.bf16_gemm_nt(a, b, d)
    assert fake_gpu.launches[-1]["context"] == fake_gpu.launches[-2]["context"] and len(fake_gpu.launches) == 4


def test_another_thread_launches_the_same_bytes(fake_gpu):
    """A block is never written once built; a pointer tuple met first on another thread is packed in that thread's
    own slot, never in the block a concurrent launch reads."""
    a, b = _operands("nt")
    d, d2 = torch.zeros(M, N, dtype=BF16), torch.zeros(M, N, dtype=BF16)
    fake_gpu.on()
    for _ in range(2):
        dfg.bf16_gemm_nt(a, b, d)
    (plan,) = bf16.plans_of("dense_nt")
    block = next(iter(plan.blocks.values()))
    before = bytes(block.view)
    worker = threading.Thread(target=lambda: [dfg.bf16_gemm_nt(a, b, x) for x in (d, d2)])
    worker.start()
    worker.join()
    assert bytes(block.view) == before and len(fake_gpu.launches) == 4
    assert fake_gpu.launches[2]["params"] == fake_gpu.launches[0]["params"]
    bf16._dense("nt", a, b, d2, None)
    assert fake_gpu.launches[3]["params"] == fake_gpu.launches[4]["params"]


def test_empty_and_k_zero_take_the_ops_path(fake_gpu):
    a, b = _operands("nt", k=0)
    d = torch.full((M, N), 3.0, dtype=BF16)
    fake_gpu.on()
    for _ in range(2):
        dfg.bf16_gemm_nt(a, b, d)
    assert not d.any() and not fake_gpu.launches
    c = torch.ones(M, N, dtype=BF16)
    dfg.bf16_gemm_nt(a, b, d, c)
    assert torch.equal(d, c)
    dfg.bf16_gemm_nt(a[:0], b, d[:0])
    assert not fake_gpu.launches and _plans("nt") == 3


def test_compat_names_check_compiled_dims_as_before():
    """check_compiled_dims answers the strings it accepts with one set lookup (its cost was a fifth of a BF16 call):
    that set is exactly the rule's (distinct letters of "mnk"), so every other value still gets its error."""
    import itertools

    from deep_fp8_gemm.compat import bf16 as compat_bf16
    from deep_fp8_gemm.compat.arguments import COMPILED_DIMS, check_compiled_dims

    rule = set()
    for r in range(5):
        for letters in itertools.product("mnkx", repeat=r):
            value = "".join(letters)
            if set(value) <= set("mnk") and len(set(value)) == len(value):
                rule.add(value)
                check_compiled_dims(value)
            else:
                with pytest.raises(ValueError, match="compiled_dims"):
                    check_compiled_dims(value)
    assert COMPILED_DIMS == rule
    a, b = _operands("nt")
    d = torch.empty(M, N, dtype=BF16)
    for value, exc in (("mm", ValueError), ("nkx", ValueError), (["n", "k"], TypeError), (None, TypeError)):
        with pytest.raises(exc, match="compiled_dims"):
            compat_bf16.bf16_gemm_nt(a, b, d, compiled_dims=value)


# ---------------------------------------------------------------------------------------------- grouped names
G, M_MAX, K_G = 2, 32, 128


def _grouped(kind: str, seed: int = 0) -> dict:
    """Operands of ``masked`` / ``contiguous_nt`` / ``contiguous_nn`` (2 groups, k = 128)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "masked":
        a = torch.randn(G, M_MAX, K_G, generator=g).to(BF16)
        return dict(a=a, b=torch.randn(G, N, K_G, generator=g).to(BF16), d=torch.zeros(G, M_MAX, N, dtype=BF16),
                    x=torch.tensor([M_MAX, 7], dtype=torch.int32), expected_m=16)
    align = utils.get_m_alignment_for_contiguous_layout()
    layout = torch.tensor([1] * align + [0] * (align - 5) + [-1] * 5, dtype=torch.int32)
    b = torch.randn(G, N, K_G, generator=g).to(BF16)
    return dict(a=torch.randn(2 * align, K_G, generator=g).to(BF16),
                b=b.transpose(1, 2).contiguous() if kind == "contiguous_nn" else b,
                d=torch.zeros(2 * align, N, dtype=BF16), x=layout, expected_m=None)


def _call_grouped(kind: str, args: dict) -> None:
    a, b, d, x = args["a"], args["b"], args["d"], args["x"]
    if kind == "masked":
        dfg.m_grouped_bf16_gemm_nt_masked(a, b, d, x, args["expected_m"])
    else:
        getattr(dfg, f"m_grouped_bf16_gemm_{kind[-2:]}_contiguous")(a, b, d, x)


def _op_grouped(kind: str, args: dict) -> None:
    """The name without a plan."""
    a, b, d, x = args["a"], args["b"], args["d"], args["x"]
    if kind == "masked":
        bf16._masked(a, b, d, x, args["expected_m"])
    else:
        bf16._contiguous(f"m_grouped_bf16_gemm_{kind[-2:]}_contiguous", a, b, d, x, False, None, kind[-2:] == "nn")


GROUPED = ("masked", "contiguous_nt", "contiguous_nn")


def _bad_layout(kind: str) -> torch.Tensor:
    """Values the kernels compute wrongly: a masked count past m_max, a contiguous block holding two groups."""
    if kind == "masked":
        return torch.tensor([M_MAX + 1, 0], dtype=torch.int32)
    align = utils.get_m_alignment_for_contiguous_layout()
    return torch.tensor([0] * (align // 2) + [1] * (align + align // 2), dtype=torch.int32)


@pytest.mark.parametrize("kind", GROUPED)
def test_grouped_cpu_calls_through_a_plan_are_the_ops(kind):
    args = _grouped(kind)
    expected = torch.zeros_like(args["d"])
    _op_grouped(kind, dict(args, d=expected))
    for _ in range(2):
        args["d"].zero_()
        _call_grouped(kind, args)
        assert torch.equal(args["d"], expected)
    assert bf16.plan_stats()[kind][0] == 1
    with pytest.raises(ValueError, match="masked_m" if kind == "masked" else "grouped_layout"):
        _call_grouped(kind, dict(args, x=_bad_layout(kind)))  # the values: checked on every CPU call


@pytest.mark.parametrize("kind", GROUPED)
def test_grouped_plan_launches_what_the_op_launches(fake_gpu, kind):
    args = _grouped(kind)
    fake_gpu.on()
    for call in range(3):
        _call_grouped(kind, args)
        _op_grouped(kind, args)
        _same_launch(*fake_gpu.launches[-2:])
    x2 = args["x"].clone()  # a layout allocated anew: its pointer packed, no block
    _call_grouped(kind, dict(args, x=x2))
    _op_grouped(kind, dict(args, x=x2))
    _same_launch(*fake_gpu.launches[-2:])
    (plan,) = bf16.plans_of(kind)
    assert plan.call == plan._launch and len(plan.blocks) == 1 and len(fake_gpu.launches) == 8


@pytest.mark.parametrize("kind", GROUPED)
def test_grouped_plan_checks_pointers_and_arguments(fake_gpu, kind):
    args = _grouped(kind)
    fake_gpu.on()
    _call_grouped(kind, args)
    over_a = args["a"].view(-1)[:args["d"].numel()].view(args["d"].shape)
    with pytest.raises(ValueError, match="d must not overlap a"):
        _call_grouped(kind, dict(args, d=over_a))
    if kind == "masked":
        with pytest.raises(TypeError, match="expected_m must be an int"):
            _call_grouped(kind, dict(args, expected_m=True))
        with pytest.raises(ValueError, match="expected_m must be positive"):
            _call_grouped(kind, dict(args, expected_m=0))
        _call_grouped(kind, dict(args, expected_m=3))  # a hint the kernel does not read: the same plan
    else:
        name = getattr(dfg, f"m_grouped_bf16_gemm_{kind[-2:]}_contiguous")
        with pytest.raises(TypeError, match="use_psum_layout must be a bool"):
            name(args["a"], args["b"], args["d"], args["x"], use_psum_layout=0)
        if kind == "contiguous_nt":
            with pytest.raises(ValueError, match="expected_m_for_psum_layout is only for use_psum_layout=True"):
                name(args["a"], args["b"], args["d"], args["x"], expected_m_for_psum_layout=4)
    assert bf16.plan_stats()[kind][0] == 1 and len(fake_gpu.launches) == (2 if kind == "masked" else 1)


@pytest.mark.parametrize("kind", GROUPED)
def test_grouped_layout_values_are_never_read_on_a_gpu_unless_checked(fake_gpu, monkeypatch, kind):
    """As the op: on a GPU the values stay there (graph-safe), with DFG_CHECK_LAYOUTS=1 (read when the plan is made)
    they are checked on every call, through the op's path."""
    args = _grouped(kind)
    bad = dict(args, x=_bad_layout(kind))
    fake_gpu.on()
    _call_grouped(kind, args)
    _call_grouped(kind, bad)
    assert len(fake_gpu.launches) == 2
    bf16.clear_plans()
    monkeypatch.setenv("DFG_CHECK_LAYOUTS", "1")
    for _ in range(2):
        with pytest.raises(ValueError, match="masked_m" if kind == "masked" else "grouped_layout"):
            _call_grouped(kind, bad)
    _call_grouped(kind, args)
    (plan,) = bf16.plans_of(kind)
    assert plan.call is plan.op and len(fake_gpu.launches) == 3


def test_psum_layout_takes_the_general_path(fake_gpu):
    args = _grouped("contiguous_nt")
    ends = torch.tensor([100, 228], dtype=torch.int32)
    fake_gpu.on()
    dfg.m_grouped_bf16_gemm_nt_contiguous(args["a"], args["b"], args["d"], ends, use_psum_layout=True)
    assert len(fake_gpu.launches) == 1 and bf16.plan_stats()["contiguous_nt"] == (0, 0)


@pytest.mark.parametrize("kind", ("dense_nt", "dense_tn+c", *GROUPED))
def test_warm_calls_make_no_tensor(fake_gpu, kind):
    """A CUDA graph captures a launch with the addresses it was given: a warm call must point only at the caller's
    tensors. What it asks of torch is their data pointers (recorded by a TorchFunctionMode), nothing that allocates,
    copies or views."""
    from torch.overrides import TorchFunctionMode

    seen = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    if kind.startswith("dense"):
        layout = kind[6:8]
        a, b = _operands(layout)
        d = torch.zeros(M, N, dtype=F32)
        call = lambda: _op(layout)(a, b, d, d if kind.endswith("+c") else None)  # noqa: E731
    else:
        args = _grouped(kind)
        call = lambda: _call_grouped(kind, args)  # noqa: E731
    fake_gpu.on()
    call()
    call()
    with Record():
        call()
    assert set(seen) == {"data_ptr"} and len(fake_gpu.launches) == 3
