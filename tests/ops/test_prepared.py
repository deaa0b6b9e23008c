"""The eager ops' cached-signature path (deep_fp8_gemm._core.plans): nothing it skips can let a bad call through,
and on a GPU it launches exactly what the uncached path launches.

The GPU side runs on the CPU: the driver is tests/runtime/test_driver.py's FakeDriver (real binding types), tensor maps
are "encoded" into bytes that identify their arguments, and ``runtime.target`` maps CPU tensors to GPU 0, so
the plan's parameter bytes can be compared with those of the families' own launch (``kernels.gemm.launch_1d2d`` with
the family's config) / ``kernels.quant``.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm import ops, utils
from deep_fp8_gemm.compat import api as compat_api
from deep_fp8_gemm.ops import outputs
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.kernels import gemm, group_maps
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime import target
from tests.runtime.test_driver import FakeDriver
from tests._gemm_cases import BUILDERS as _VALIDATION_BUILDERS
from tests._gemm_cases import CASES as _VALIDATION_CASES
from tests._gemm_cases import COMMON, call_gemm as _validation_call, offset_view as _offset_view

_QUANT_FIELDS = struct.Struct("<7Q4I")
_PSUM_VALID_ROWS = 100


def _psum_args() -> dict:
    """tests/ops/test_validation.py's contiguous operands (m_sum = 128, G = 2) with group ends [0, 100]: group 0
    empty, group 1 rows [0, 100), rows 100.. padding (unspecified output)."""
    args = _VALIDATION_BUILDERS["contiguous"]()
    del args["m_indices"]
    return dict(args, grouped_layout=torch.tensor([0, _PSUM_VALID_ROWS], dtype=torch.int32), expected_m=None)


def _call(kind: str, args: dict) -> None:
    if kind != "psum":
        return _validation_call(kind, args)
    lhs = args.pop("lhs", (args["a"], args["sa"]))
    rhs = args.pop("rhs", (args["b"], args["sb"]))
    dfg.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous_psum(lhs, rhs, args["out"], args["grouped_layout"],
                                                      args["expected_m"])


def _valid(kind: str, args: dict, out: torch.Tensor) -> list[torch.Tensor]:
    """The specified part of a GEMM's output (masked / psum leave some rows unspecified)."""
    if kind == "masked":
        return [out[g, :rows] for g, rows in enumerate(args["masked_m"].tolist())]
    return [out[:_PSUM_VALID_ROWS] if kind == "psum" else out]


# The ops of tests/ops/test_validation.py plus the psum layout (its bad-input cases: the common ones and its own,
# the group-end values included: on a CPU they are checked on every call, cached plan or not).
BUILDERS = dict(_VALIDATION_BUILDERS, psum=_psum_args)
_PSUM_CASES = [
    ("B-2d", lambda a: dict(a, b=a["b"][0]), ValueError, "rhs[0]"),
    ("layout-int64", lambda a: dict(a, grouped_layout=a["grouped_layout"].long()), TypeError, "grouped_layout"),
    ("layout-length", lambda a: dict(a, grouped_layout=a["grouped_layout"][:1]), ValueError, "grouped_layout"),
    ("layout-missing", lambda a: dict(a, grouped_layout=None), TypeError, "grouped_layout"),
    ("layout-decreasing", lambda a: dict(a, grouped_layout=torch.tensor([100, 50], dtype=torch.int32)), ValueError,
     "grouped_layout"),
    ("layout-past-rows", lambda a: dict(a, grouped_layout=torch.tensor([0, 129], dtype=torch.int32)), ValueError,
     "grouped_layout"),
    ("expected_m-zero", lambda a: dict(a, expected_m=0), ValueError, "expected_m"),
    ("expected_m-bool", lambda a: dict(a, expected_m=True), TypeError, "expected_m"),
    ("expected_m-float", lambda a: dict(a, expected_m=1.5), TypeError, "expected_m"),
]
CASES = _VALIDATION_CASES + [("psum", *case) for case in COMMON + _PSUM_CASES]


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _canonical(args: dict) -> dict:
    """The builders' sA is row-major; the plans' no-copy case wants it M-major."""
    return dict(args, sa=utils.get_col_major_tma_aligned_tensor(args["sa"]))


# ---------------------------------------------------------------------------------------------- CPU: checks kept
@pytest.mark.parametrize("kind,case_id,mutate,exc,text", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_changed_argument_is_caught_after_a_cached_call(kind, case_id, mutate, exc, text):
    """Every bad-input case of tests/ops/test_validation.py, made right after a valid call cached the baseline's
    plan: same exception and the same message as with no plan cached."""
    baseline = BUILDERS[kind]()
    _call(kind, dict(baseline))  # caches the plan of the valid signature
    bad = mutate(dict(baseline))
    with pytest.raises(exc) as warm:
        _call(kind, dict(bad))
    plans.clear()
    with pytest.raises(exc) as cold:
        _call(kind, dict(bad))
    assert str(warm.value) == str(cold.value)
    assert text in str(warm.value)


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "device", "alignment", "overlap"])
def test_each_kind_of_change_is_caught_on_the_fast_path(kind, change):
    """One tensor changed at a time after a cached call, the issue's list: shape, stride, dtype, device,
    alignment (and overlap). Pointer-only changes hit the cached plan (no new plan) and still raise."""
    args = BUILDERS[kind]()
    _call(kind, dict(args))
    assert plans.stats()[kind][0] == 1
    out = args["out"]
    changed = {
        "shape": out[..., :8],  # [.., 8] instead of [.., N]
        "stride": out.transpose(-1, -2).contiguous().transpose(-1, -2),
        "dtype": out.float(),
        "device": out.to("meta"),
        "alignment": _offset_view(out, 8),
        "overlap": args["a"].view(-1)[: out.numel() * 2].view(out.dtype).view(out.shape),
    }[change]
    error = TypeError if change == "dtype" else ValueError
    with pytest.raises(error, match="out"):
        _call(kind, dict(args, out=changed))
    if change in ("alignment", "overlap"):
        assert plans.stats()[kind][0] == 1, "a pointer-only change must be checked on the cached plan"
    _call(kind, dict(args))  # and the cached plan still serves valid calls


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_cached_calls_compute_the_reference(kind):
    args = BUILDERS[kind]()
    expected = args["out"].clone()
    plans.clear()
    _call(kind, dict(args, out=expected))
    for _ in range(2):  # cached plan, fresh output buffer and fresh inputs of the same signature
        out = torch.full_like(args["out"], 7.0)
        _call(kind, dict(args, out=out, a=args["a"].clone(), sa=args["sa"].clone()))
        for got, want in zip(_valid(kind, args, out), _valid(kind, args, expected)):
            assert torch.equal(got, want)


def test_set_num_sms_is_part_of_the_signature():
    args = BUILDERS["dense"]()
    _call("dense", dict(args))
    utils.set_num_sms(7)
    try:
        _call("dense", dict(args))
    finally:
        utils.reset_num_sms()
    assert plans.stats()["dense"][0] == 2


def test_guard_index_serves_several_signatures_per_weight():
    """One weight, two activation row counts, alternating: both plans stay indexed under id(B), both correct."""
    args = BUILDERS["dense"]()
    half = dict(args, a=args["a"][:64], sa=args["sa"][:64], out=torch.zeros(64, args["out"].shape[1],
                                                                             dtype=torch.bfloat16))
    full_ref, half_ref = args["out"].clone(), half["out"].clone()
    _call("dense", dict(args, out=full_ref))
    _call("dense", dict(half, out=half_ref))
    for _ in range(2):
        for base, ref in ((args, full_ref), (half, half_ref)):
            out = torch.full_like(ref, 3.0)
            _call("dense", dict(base, out=out))
            assert torch.equal(out, ref)
    assert plans.stats()["dense"][0] == 2 and len(plans.GEMM_ENTRIES["dense"].index[id(args["b"])]) == 2


def test_guard_entry_of_another_signature_is_never_used():
    """id(B) only narrows the search: an entry whose guard does not match these tensors (as after a freed
    weight's id is reused) is skipped and the call is checked and planned for what it is."""
    args = BUILDERS["dense"]()
    other = BUILDERS["contiguous"]()  # different B shape
    wrong = plans.GemmPlan(plans.GEMM_ENTRIES["dense"].spec, args["a"], args["sa"], args["b"], args["sb"], args["out"],
                           None, None)
    plans.inject_guard_for_tests("dense", args["b"],
                                 (other["a"], other["sa"], other["b"][0], other["sb"][0], other["out"]), wrong)
    bad = dict(args, out=args["out"].float())
    with pytest.raises(TypeError, match="out"):
        _call("dense", bad)
    out = torch.zeros_like(args["out"])
    _call("dense", dict(args, out=out))
    expected = torch.zeros_like(out)
    dfg.reference.gemm_fp8_fp8_bf16_nt((args["a"], args["sa"]), (args["b"], args["sb"]), expected)
    assert torch.equal(out, expected)


def test_without_torch_guards_the_signature_dict_serves(monkeypatch):
    monkeypatch.setattr(plans, "TENSOR_GUARDS", None)
    args = BUILDERS["masked"]()
    _call("masked", dict(args))
    _call("masked", dict(args))
    assert plans.stats()["masked"] == (1, 0)
    with pytest.raises(ValueError, match="out"):
        _call("masked", dict(args, out=args["out"][..., :8]))


def test_requires_grad_inputs_still_take_the_plans():
    x = torch.randn(8, 256, requires_grad=True)
    with torch.no_grad():
        first = dfg.per_token_cast_to_fp8(x)
        second = dfg.per_token_cast_to_fp8(x)
    assert torch.equal(first[0].float(), second[0].float()) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("kind", ["masked", "psum"])
def test_expected_m_bool_is_rejected_after_an_int_call(kind):
    args = BUILDERS[kind]()
    _call(kind, dict(args, expected_m=1))
    with pytest.raises(TypeError, match="expected_m"):
        _call(kind, dict(args, expected_m=True))  # True == 1 and hashes alike


@pytest.mark.parametrize("ends", [[100, 50], [0, 129], [-1, 100]])
def test_psum_plan_checks_the_group_ends_before_running_on_a_cpu(monkeypatch, ends):
    """A cached CPU plan checks the ends itself on every call, before the reference or the simulator (which
    must not see bad ones) runs: same message as the uncached op."""
    args = BUILDERS["psum"]()
    _call("psum", dict(args))
    bad = dict(args, grouped_layout=torch.tensor(ends, dtype=torch.int32))
    monkeypatch.setattr(ops.FAMILIES["psum"], "dispatch", lambda *a, **k: pytest.fail("bad group ends reached the kernel"))
    with pytest.raises(ValueError, match="grouped_layout") as warm:
        _call("psum", dict(bad))
    assert plans.stats()["psum"][0] == 1
    plans.clear()
    with pytest.raises(ValueError) as cold:
        _call("psum", dict(bad))
    assert str(warm.value) == str(cold.value)


def test_psum_expected_m_is_part_of_the_signature():
    args = BUILDERS["psum"]()
    for expected_m in (None, 64, None, 64):
        _call("psum", dict(args, expected_m=expected_m))
    assert plans.stats()["psum"][0] == 2


def test_quantiser_options_are_checked_and_keyed():
    x = torch.randn(8, 256)
    plain, pow2 = dfg.per_token_cast_to_fp8(x), dfg.per_token_cast_to_fp8(x, use_ue8m0=True)
    assert torch.equal(pow2[1], dfg.quant.ceil_to_ue8m0(plain[1]))  # not the cached plain plan
    with pytest.raises(TypeError, match="use_ue8m0"):
        dfg.per_token_cast_to_fp8(x, use_ue8m0=1)
    with pytest.raises(ValueError, match="gran_k"):
        dfg.per_token_cast_to_fp8(x, gran_k=64)
    one32 = dfg.per_token_cast_to_fp8(x, gran_k=32)  # its own plan (deep_fp8_gemm.quant: per_token_32)
    assert one32[1].shape == (8, 8) and not torch.equal(one32[0].view(torch.uint8), plain[0].view(torch.uint8))
    with pytest.raises(NotImplementedError, match="use_packed_ue8m0"):
        dfg.per_token_cast_to_fp8(x, use_packed_ue8m0=True)


def test_quantiser_signature_change_is_caught():
    x = torch.randn(8, 256)
    dfg.per_token_cast_to_fp8(x)
    with pytest.raises(TypeError, match=r"\bx\b"):
        dfg.per_token_cast_to_fp8(x.double())
    with pytest.raises(ValueError, match=r"\bx\b"):
        dfg.per_token_cast_to_fp8(x.view(2, 4, 256))
    a, sa = dfg.per_token_cast_to_fp8(x)
    ref_a, ref_sa = dfg.quant.per_token_cast_to_fp8_torch(x)
    assert torch.equal(a.float(), ref_a.float()) and torch.equal(sa, ref_sa)


# ---------------------------------------------------------------------------------------------- prepare_gemm
@pytest.mark.parametrize("kind", list(BUILDERS))
def test_prepare_gemm_runs_new_tensors_of_the_signature(kind):
    args = BUILDERS[kind]()
    grouped = _grouped(kind, args)
    expected_m = args.get("expected_m")
    call = dfg.prepare_gemm(kind, (args["a"], args["sa"]), (args["b"], args["sb"]), args["out"], grouped,
                            expected_m=expected_m)
    expected = args["out"].clone()
    _call(kind, dict(args, out=expected))
    out = torch.zeros_like(args["out"])
    assert call.matches((args["a"], args["sa"]), (args["b"], args["sb"]), out, grouped)
    assert not call.matches((args["a"], args["sa"]), (args["b"], args["sb"]), out.float(), grouped)
    call((args["a"].clone(), args["sa"]), (args["b"], args["sb"]), out, grouped)
    for got, want in zip(_valid(kind, args, out), _valid(kind, args, expected)):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="overlap"):  # pointers are still checked
        call((args["a"], args["sa"]), (args["b"], args["sb"]),
             args["a"].view(-1)[: out.numel() * 2].view(out.dtype).view(out.shape), grouped)


_WRONG_DTYPES = [  # (argument, replacement, the name the TypeError must give)
    ("a", lambda t: t.bfloat16(), "lhs[0] (A)"),  # the unquantised activation: same shape, same strides
    ("sa", lambda t: t.half(), "lhs[1] (sA)"),
    ("b", lambda t: t.bfloat16(), "rhs[0] (B)"),
    ("sb", lambda t: t.double(), "rhs[1] (sB)"),
    ("out", lambda t: t.half(), "out"),
]


@pytest.mark.parametrize("kind", list(BUILDERS))
@pytest.mark.parametrize("arg,change,name", _WRONG_DTYPES, ids=[c[0] for c in _WRONG_DTYPES])
def test_prepared_call_checks_dtypes(kind, arg, change, name):
    """A PreparedGemm trusts shapes and strides but not dtypes: a bf16 A used to give garbage on CPU (NaNs in the
    simulator); now the op's TypeError, nothing written."""
    args = BUILDERS[kind]()
    grouped = _grouped(kind, args)
    call = dfg.prepare_gemm(kind, (args["a"], args["sa"]), (args["b"], args["sb"]), args["out"], grouped,
                            expected_m=args.get("expected_m"))
    bad = dict(args, **{arg: change(args[arg])})
    before = bad["out"].clone()
    with pytest.raises(TypeError) as info:
        call((bad["a"], bad["sa"]), (bad["b"], bad["sb"]), bad["out"], grouped)
    assert name in str(info.value), str(info.value)
    assert torch.equal(bad["out"], before)
    if grouped is not None:
        with pytest.raises(TypeError, match=_grouped_name(kind)):
            call((args["a"], args["sa"]), (args["b"], args["sb"]), args["out"], grouped.long())
    with pytest.raises(TypeError, match="lhs"):
        call(args["a"], (args["b"], args["sb"]), args["out"], grouped)
    with pytest.raises(TypeError, match=r"lhs\[0\]"):
        call((np.zeros(3) if arg == "a" else None, args["sa"]), (args["b"], args["sb"]), args["out"], grouped)


def _grouped_name(kind: str) -> str:
    return {"contiguous": "m_indices", "masked": "masked_m", "psum": "grouped_layout"}[kind]


def test_prepare_gemm_rejects_bad_examples_and_kinds():
    args = BUILDERS["dense"]()
    lhs, rhs = (args["a"], args["sa"]), (args["b"], args["sb"])
    with pytest.raises(ValueError, match="kind"):
        dfg.prepare_gemm("sparse", lhs, rhs, args["out"])
    with pytest.raises(TypeError, match="out"):
        dfg.prepare_gemm("dense", lhs, rhs, args["out"].float())
    with pytest.raises(ValueError, match="grouped_layout"):
        dfg.prepare_gemm("contiguous", lhs, rhs, args["out"])
    with pytest.raises(ValueError, match="expected_m"):
        dfg.prepare_gemm("dense", lhs, rhs, args["out"], expected_m=4)
    margs = BUILDERS["masked"]()
    with pytest.raises(TypeError, match="expected_m"):
        dfg.prepare_gemm("masked", (margs["a"], margs["sa"]), (margs["b"], margs["sb"]), margs["out"],
                         margs["masked_m"], expected_m=None)


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors launch through the plans into FakeDriver; tensor maps encode to bytes naming their spec."""
    fake = FakeDriver()
    fake.param_sizes = [576]
    monkeypatch.setattr(drv, "driver", fake)
    drv._reset_for_tests()
    specs = []

    def encode(spec):
        specs.append(spec)
        return hashlib.sha512(repr(spec).encode()).digest() * 2  # 128 bytes, one per distinct spec

    monkeypatch.setattr(drv, "encode_tensor_map", encode)

    def on():  # after the test built its operands (the quantisers would otherwise take the fake GPU too)
        monkeypatch.setattr(target, "gpu_index", lambda device: 0)
        monkeypatch.setattr(target, "capability", lambda index: (9, 0))
        monkeypatch.setattr(target, "current_stream", lambda index: 0x77)
        monkeypatch.setattr(target, "current_device", lambda: 0)

    fake.on = on
    gemm.cuda_kernel.cache_clear()
    group_maps.cuda_kernel.cache_clear()
    kq._loaded.clear()
    fake.specs = specs
    yield fake
    drv._reset_for_tests()
    gemm.cuda_kernel.cache_clear()
    group_maps.cuda_kernel.cache_clear()
    kq._loaded.clear()


def _grouped(kind, args):
    return {"dense": None, "contiguous": args.get("m_indices"), "masked": args.get("masked_m"),
            "psum": args.get("grouped_layout")}[kind]


def _uncached_launch(kind, args, out) -> None:
    """What the general path launches for these tensors: the family's config, ``kernels.gemm.launch_1d2d``."""
    cfg = ops.FAMILIES[kind].plan(args["a"], args["b"], args.get("expected_m"), utils.get_num_sms())
    gemm.launch_1d2d(cfg, args["a"], args["sa"], args["b"], args["sb"], out, _grouped(kind, args), "cuda")


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_plan_launches_what_the_uncached_path_launches(fake_gpu, kind):
    args = _canonical(BUILDERS[kind]())
    fake_gpu.on()
    _call(kind, dict(args))
    fast = fake_gpu.launches[-1]
    _uncached_launch(kind, args, args["out"])
    slow = fake_gpu.launches[-1]
    assert len(fake_gpu.launches) == 2
    for field in ("params", "grid", "block", "smem", "stream", "attrs", "function"):
        assert fast[field] == slow[field], field
    assert fast["stream"] == 0x77 and len(fast["params"]) == 576


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_plan_reencodes_only_new_pointers(fake_gpu, kind):
    args = _canonical(BUILDERS[kind]())
    fake_gpu.on()
    _call(kind, dict(args))
    encoded = len(fake_gpu.specs)
    _call(kind, dict(args))  # same pointers: no encode at all
    assert len(fake_gpu.specs) == encoded
    out2 = torch.zeros_like(args["out"])
    _call(kind, dict(args, out=out2))  # only D's map is new (the others hit the driver's cache)
    assert len(fake_gpu.specs) == encoded + 1 and fake_gpu.specs[-1].global_address == out2.data_ptr()
    _uncached_launch(kind, args, out2)
    assert fake_gpu.launches[-1]["params"] == fake_gpu.launches[-2]["params"]
    assert sum(plans.stats()[k][0] for k in ("dense", "contiguous", "masked", "psum")) == 1


def test_psum_plan_never_reads_the_group_ends_on_a_gpu(fake_gpu, monkeypatch):
    """On a GPU the ends stay on the device (graph-safe): a cached plan launches with any values, as the
    uncached op does; on a CPU the same values raise (test_a_changed_argument_is_caught_after_a_cached_call)."""
    args = _canonical(BUILDERS["psum"]())
    fake_gpu.on()
    _call("psum", dict(args))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("the group ends were read"))
    _call("psum", dict(args, grouped_layout=torch.tensor([100, 50], dtype=torch.int32)))
    assert len(fake_gpu.launches) == 2 and plans.stats()["psum"][0] == 1


_BAD_LAYOUTS = {  # per grouped kind: a layout the kernels compute wrongly (m_sum = 128, m_max = 32, G = 2)
    "contiguous": ("m_indices", torch.tensor([0] * 64 + [1] * 64, dtype=torch.int32), "holds rows of 2 experts"),
    "masked": ("masked_m", torch.tensor([33, 1], dtype=torch.int32), r"masked_m\[0\] must be in \[0, m_max=32\]"),
    "psum": ("grouped_layout", torch.tensor([100, 50], dtype=torch.int32), "non-decreasing"),
}


@pytest.mark.parametrize("kind", list(_BAD_LAYOUTS))
def test_check_layouts_debug_mode_reads_the_layout_on_a_gpu(fake_gpu, monkeypatch, kind):
    """DFG_CHECK_LAYOUTS=1: a GPU call checks the layout's values before its launch, on the cached plan's path
    too (a new plan reads the switch); without it the values are never read (graph-safe) and it launches."""
    name, bad, text = _BAD_LAYOUTS[kind]
    args = _canonical(BUILDERS[kind]())
    fake_gpu.on()
    _call(kind, dict(args, **{name: bad}))
    assert len(fake_gpu.launches) == 1
    plans.clear()
    monkeypatch.setenv("DFG_CHECK_LAYOUTS", "1")
    for _ in range(2):
        with pytest.raises(ValueError, match=text):
            _call(kind, dict(args, **{name: bad}))
    _call(kind, dict(args))
    assert len(fake_gpu.launches) == 2


def test_plan_normalises_row_major_scales_on_every_call(fake_gpu):
    args = BUILDERS["dense"]()  # row-major sA: not the kernels' layout
    fake_gpu.on()
    _call("dense", dict(args))
    sa_map = next(s for s in fake_gpu.specs if s.box_dims[0] != 128 and s.dtype == 7)  # FLOAT32 map
    assert sa_map.global_address != args["sa"].data_ptr()  # a canonical copy was passed
    m = args["sa"].shape[0]
    assert sa_map.global_strides[0] == utils.get_tma_aligned_size(m, 4) * 4


def test_plan_catches_changes_on_the_gpu_path(fake_gpu):
    args = _canonical(BUILDERS["dense"]())
    fake_gpu.on()
    _call("dense", dict(args))
    launches = len(fake_gpu.launches)
    with pytest.raises(ValueError, match=r"out.data_ptr\(\) must be 16-byte aligned"):
        _call("dense", dict(args, out=_offset_view(args["out"], 8)))
    with pytest.raises(ValueError, match="out must not overlap lhs"):
        _call("dense", dict(args, out=args["a"].view(-1)[: args["out"].numel() * 2].view(torch.bfloat16)
                            .view(args["out"].shape)))
    with pytest.raises(TypeError, match="out"):
        _call("dense", dict(args, out=args["out"].float()))
    assert len(fake_gpu.launches) == launches


def test_plan_keeps_blocks_only_for_pointers_that_passed_the_checks(fake_gpu):
    """A plan's parameter block per pointer tuple lets a repeated call skip the pointer checks (issue 45), so a
    block must exist only for pointers that passed them: a refused tuple raises on every call, builds nothing."""
    args = _canonical(BUILDERS["dense"]())
    fake_gpu.on()
    _call("dense", dict(args))
    (plan,) = plans.plans_of("dense")
    assert len(plan.blocks) == 0  # met once: packed into the thread's slot
    _call("dense", dict(args))
    assert len(plan.blocks) == 1  # the second call with these pointers: their own block
    overlapping = args["a"].view(-1)[: args["out"].numel() * 2].view(torch.bfloat16).view(args["out"].shape)
    for _ in range(2):
        with pytest.raises(ValueError, match="out must not overlap lhs"):
            _call("dense", dict(args, out=overlapping))
    assert len(plan.blocks) == 1 and len(fake_gpu.launches) == 2
    _call("dense", dict(args))  # the checked tuple: launched from its block
    assert len(plan.blocks) == 1 and fake_gpu.launches[-1]["params"] == fake_gpu.launches[0]["params"]


def test_plan_builds_no_block_for_a_layout_allocated_anew_each_call(fake_gpu):
    """A grouped layout made fresh every step has a new address each time: each call packs the thread's slot from
    the maps cached per (A, sA, B, D) and launches what the uncached path launches; no block piles up."""
    args = _canonical(BUILDERS["masked"]())
    fake_gpu.on()
    layouts = [args["masked_m"].clone() for _ in range(3)]  # all alive: three distinct addresses
    for layout in layouts:
        _call("masked", dict(args, masked_m=layout))
        fast = fake_gpu.launches[-1]["params"]
        _uncached_launch("masked", dict(args, masked_m=layout), args["out"])
        assert fake_gpu.launches[-1]["params"] == fast
    (plan,) = plans.plans_of("masked")
    assert len(plan.blocks) == 0 and len(plan.heads) == 1


@pytest.mark.parametrize("name,kind,offset,ue8m0", [("per_token", kq.QuantKind.PER_TOKEN, 0, False),
                                                     ("per_token", kq.QuantKind.PER_TOKEN, 2, False),
                                                     ("per_token", kq.QuantKind.PER_TOKEN, 0, True),
                                                     ("per_block", kq.QuantKind.PER_BLOCK, 0, False),
                                                     ("per_block", kq.QuantKind.PER_BLOCK, 0, True),
                                                     ("silu", kq.QuantKind.SILU_MUL_PER_TOKEN, 0, False)])
def test_quant_plan_launches_what_the_uncached_path_launches(fake_gpu, name, kind, offset, ue8m0):
    fake_gpu.param_sizes = [72]
    base = torch.randn(96 * 512 + offset, dtype=torch.bfloat16)
    x = base[offset:].view(96, 512)  # offset 2 elements: 4-byte aligned, so the scalar kernel
    fake_gpu.on()
    public = {"per_token": dfg.per_token_cast_to_fp8, "per_block": dfg.per_block_cast_to_fp8,
              "silu": dfg.moe.silu_mul_quant}[name]
    out, scales = public(x, use_ue8m0=ue8m0) if ue8m0 else public(x)
    fast = fake_gpu.launches[-1]
    captured = {}

    def capture(config, params, grid, device):
        captured.update(config=config, params=bytes(params), grid=grid)

    if name == "per_block":
        ref_out, ref_scales = kq.run_per_block(x, launch=capture, ue8m0=ue8m0)
    else:
        ref_out, ref_scales = kq.run_per_token(x, kind, "x", launch=capture, ue8m0=ue8m0)
    got, want = _QUANT_FIELDS.unpack(fast["params"][:72]), _QUANT_FIELDS.unpack(captured["params"])
    assert got[0] == want[0] == x.data_ptr() and got[3:] == want[3:]
    assert got[1] == out.data_ptr() and got[2] == scales.data_ptr()
    assert fast["grid"][0] == captured["grid"]
    assert fast["function"] == int(kq.cuda_kernel(captured["config"], 0).kernel)
    assert captured["config"].vectorized == (offset == 0) and captured["config"].ue8m0 == ue8m0
    for t, ref in ((out, ref_out), (scales, ref_scales)):
        assert (t.shape, t.stride(), t.dtype) == (ref.shape, ref.stride(), ref.dtype)


# ---------------------------------------------------------------------------------------------- quantisers' plans
_QUANTISERS = {"per_token": (lambda x: dfg.per_token_cast_to_fp8(x), (8, 256)),
               "per_block": (lambda x: dfg.per_block_cast_to_fp8(x), (136, 256)),
               "silu": (lambda x: dfg.moe.silu_mul_quant(x), (8, 512))}
_QUANT_CHANGES = {
    "shape": lambda x: x[:, : x.shape[1] // 2 + 1],  # a new shape (silu: an odd last dim, rejected)
    "rank": lambda x: x.reshape(2, x.shape[0] // 2, x.shape[1]),  # 3-D: silu takes it, the others reject it
    "stride": lambda x: x.t().contiguous().t(),  # same values, column-major
    "dtype": lambda x: x.double(),
    "int_dtype": lambda x: x.to(torch.int32),
    "device": lambda x: x.to("meta"),
    "offset": lambda x: torch.cat([x.new_zeros(1), x.reshape(-1)])[1:].view(x.shape),  # 2-byte misaligned
    "empty": lambda x: x[:0],
}


def _outcome(fn, x):
    try:
        out, scales = fn(x)
    except Exception as e:  # noqa: BLE001 - the exception itself is the outcome compared
        return type(e), str(e)
    if out.device.type == "meta":
        return out.shape, out.stride(), scales.shape, scales.stride()
    return out.float(), scales.shape, scales.stride(), scales


@pytest.mark.parametrize("name", list(_QUANTISERS))
@pytest.mark.parametrize("change", list(_QUANT_CHANGES))
def test_quantiser_change_after_a_cached_call_behaves_as_uncached(name, change):
    """A changed input right after a cached call gives exactly what it gives with no plan cached: the same
    exception and message, or the same outputs (values, shapes, strides)."""
    fn, shape = _QUANTISERS[name]
    x = torch.randn(shape, dtype=torch.bfloat16)
    fn(x)
    fn(x)  # the second call hits the plan
    changed = _QUANT_CHANGES[change](x)
    warm = _outcome(fn, changed)
    plans.clear()
    cold = _outcome(fn, changed)
    assert len(warm) == len(cold)
    for w, c in zip(warm, cold):
        assert torch.equal(w, c) if isinstance(w, torch.Tensor) else w == c


def _quant_reference(name, x, kind):
    captured = {}

    def capture(config, params, grid, device):
        captured.update(config=config, params=bytes(params), grid=grid)

    if name == "per_block":
        kq.run_per_block(x, launch=capture, ue8m0=False)
    else:
        kq.run_per_token(x, kind, "x", launch=capture, ue8m0=False)
    return _QUANT_FIELDS.unpack(captured["params"])


@pytest.mark.parametrize("name,kind", [("per_token", kq.QuantKind.PER_TOKEN), ("per_block", kq.QuantKind.PER_BLOCK),
                                       ("silu", kq.QuantKind.SILU_MUL_PER_TOKEN)])
def test_quant_plan_packs_each_calls_pointers_on_any_thread(fake_gpu, name, kind):
    """The plan's own parameter block keeps the constants and takes new pointers per call; a call from another
    thread packs everything into that thread's slot and leaves the plan's block intact."""
    import threading

    fake_gpu.param_sizes = [72]
    fn = _QUANTISERS[name][0]
    xs = [torch.randn(96, 512, dtype=torch.bfloat16) for _ in range(3)]
    fake_gpu.on()
    results = {}

    def call(i):
        results[i] = fn(xs[i])
        results[i, "launch"] = fake_gpu.launches[-1]

    call(0)
    call(1)  # a plan hit with new pointers
    other = threading.Thread(target=call, args=(2,))
    other.start()
    other.join()
    call(0)  # the main thread again, after the other thread's call
    results[3], results[3, "launch"] = results[0], fake_gpu.launches[-1]
    addresses = set()
    for i, x in ((1, xs[1]), (2, xs[2]), (3, xs[0])):
        out, scales = results[i]
        got = _QUANT_FIELDS.unpack(results[i, "launch"]["params"][:72])
        want = _quant_reference(name, x, kind)
        assert got[0] == x.data_ptr() and got[1] == out.data_ptr() and got[2] == scales.data_ptr()
        assert got[3:] == want[3:]
        addresses.add(results[i, "launch"]["params_address"])
    assert len(addresses) == 2  # the plan's block (main thread) and the other thread's slot
    assert plans.stats()["quant"][0] == 1


@pytest.mark.parametrize("name", list(_QUANTISERS))
@pytest.mark.parametrize("m", [8, 5])  # 5: per-token scales with a padded M-major stride
def test_quant_plan_outputs_own_their_storage(fake_gpu, name, m):
    """Each output of each call is a tensor of its own: its own storage of exactly its size, offset 0, the
    documented layout; resizing or writing one changes nothing else."""
    fake_gpu.param_sizes = [72]
    fn = _QUANTISERS[name][0]
    x = torch.randn(m * (17 if name == "per_block" else 1), 512, dtype=torch.bfloat16)
    fake_gpu.on()
    (a, sa), (b, sb) = fn(x), fn(x)
    assert len(fake_gpu.launches) == 2
    tensors = (a, sa, b, sb)
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(storages) == 4
    for t in tensors:
        assert t.storage_offset() == 0 and not t.requires_grad
        hi = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        assert t.untyped_storage().nbytes() == hi * t.element_size()
    assert a.is_contiguous() and a.dtype == torch.float8_e4m3fn and sa.dtype == torch.float32
    if name == "per_block":
        assert sa.is_contiguous()
    else:
        rows = x.shape[0]
        assert sa.stride() == (1, utils.get_tma_aligned_size(rows, 4))
    b.view(torch.uint8).fill_(0x38)
    sb.fill_(5.0)
    a.resize_(a.numel() * 4).view(torch.uint8).fill_(0x40)
    sa.resize_(sa.numel() * 4).fill_(7.0)
    assert torch.all(b.view(torch.uint8) == 0x38) and torch.all(sb == 5.0)


def test_quant_fast_path_checks_context_device_stream_alignment_and_errors(fake_gpu, monkeypatch):
    """The one-frame fast path of a quantiser plan (QuantPlan._fast_call) takes the common case only: a changed
    current context (null stream), current device, stream or input alignment, and a failing launch, each
    take the general path's rule, call after call on the same plan."""
    from tests.runtime.test_driver import INVALID_VALUE

    allocations = []
    fast_empty = plans.ALLOCATORS["cpu"]

    def counting(*args):
        allocations.append(args)
        return fast_empty(*args)

    monkeypatch.setitem(plans.ALLOCATORS, "cpu", counting)  # read when the plan is built
    fake_gpu.param_sizes = [72]
    base = torch.randn(96 * 512 + 2, dtype=torch.bfloat16)
    x, x_odd = base[:-2].view(96, 512), base[2:].view(96, 512)  # same signature; x_odd 4-byte aligned only
    fake_gpu.on()
    monkeypatch.setattr(target, "current_stream", lambda index: 0)
    primary = 0x1000  # FakeDriver's primary context of device 0

    def quant(t):
        out, scales = dfg.per_token_cast_to_fp8(t)
        got = _QUANT_FIELDS.unpack(fake_gpu.launches[-1]["params"][:72])
        assert got[:3] == (t.data_ptr(), out.data_ptr(), scales.data_ptr())
        assert got[3:] == _quant_reference("per_token", t, kq.QuantKind.PER_TOKEN)[3:]
        assert (out.shape, out.stride(), scales.shape, scales.stride()) == ((96, 512), (512, 1), (96, 4), (1, 96))
        return fake_gpu.launches[-1]

    quant(x)
    quant(x)  # the fast path from here on
    vectorized = fake_gpu.launches[-1]["function"]
    assert fake_gpu.launches[-1]["context"] == primary and len(allocations) == 4  # 2 calls x 2 outputs

    fake_gpu.current_ctx = 0x2000  # another context current: pushed for the launch, then restored
    assert quant(x)["context"] == primary and fake_gpu.current_ctx == 0x2000
    fake_gpu.current_ctx = 0  # none current: the primary context is made current
    assert quant(x)["context"] == primary and fake_gpu.current_ctx == primary

    monkeypatch.setattr(target, "current_device", lambda: 1)  # the fast allocator would use device 1
    before = len(allocations)
    quant(x)
    assert len(allocations) == before  # allocated on the plan's device by the general path
    monkeypatch.setattr(target, "current_device", lambda: 0)

    monkeypatch.setattr(target, "current_stream", lambda index: 0x55)  # a stream not seen yet, then again
    assert quant(x)["stream"] == 0x55 and quant(x)["stream"] == 0x55
    monkeypatch.setattr(target, "current_stream", lambda index: 0)

    scalar = quant(x_odd)["function"]  # misaligned input of the vectorised plan: the scalar kernel
    assert scalar != vectorized and quant(x)["function"] == vectorized
    assert plans.stats()["quant"][0] == 1

    fake_gpu.fail["cuLaunchKernelEx"] = INVALID_VALUE
    with pytest.raises(drv.CudaDriverError, match=r"cuLaunchKernelEx\("):
        dfg.per_token_cast_to_fp8(x)


@pytest.mark.usefixtures("fast_mode")
def test_split_k_plan_packs_the_workspace_of_its_stream(fake_gpu, monkeypatch):
    """A few-tile dense shape (split-K, deep_fp8_gemm/kernels/split_k.py): the plan launches the same params as the
    uncached path, the workspace's counter and partial addresses at offset 560, one workspace per stream."""
    from deep_fp8_gemm.kernels import split_k

    utils.set_num_sms(132)
    split_k.clear()
    m, n, k = 16, 576, 7168
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(m, k))
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(n, k))
    sa = utils.get_col_major_tma_aligned_tensor(sa)
    out = torch.zeros(m, n, dtype=torch.bfloat16)
    cfg = dfg.config.get_config(m, n, k, 1, "dense", 132, batch_invariant=False)
    assert cfg.split_k > 1
    fake_gpu.on()
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    fast = fake_gpu.launches[-1]
    gemm.launch_1d2d(cfg, a, sa, b, sb, out, None, "cuda")
    slow = fake_gpu.launches[-1]
    assert fast["params"] == slow["params"] and fast["grid"] == slow["grid"] == (cfg.grid_size, 1, 1)
    counters, partials = split_k.buffers(cfg, m, a.device, 0x77)
    assert fast["params"][560:576] == struct.pack("<QQ", counters.data_ptr(), partials.data_ptr())
    assert counters.numel() >= m // 64 + 1 and not counters.any()
    monkeypatch.setattr(target, "current_stream", lambda index: 0x88)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    other = split_k.buffers(cfg, m, a.device, 0x88)
    assert fake_gpu.launches[-1]["params"][560:576] == struct.pack("<QQ", other[0].data_ptr(), other[1].data_ptr())
    assert other[0].data_ptr() != counters.data_ptr()
    split_k.clear()
    utils.reset_num_sms()


@pytest.mark.usefixtures("fast_mode")
def test_split_k_launch_captured_into_a_graph_gets_its_own_workspace(fake_gpu, monkeypatch):
    """A split-K launch captured into a CUDA graph bakes its workspace's addresses into the graph, which may be
    replayed after later eager calls have grown (and freed) the per-stream cached pair, or on another stream
    next to another graph: so a captured launch, on the plan path and on the explicit-config path, gets a pair
    of its own and never the cached one, and leaves the cache as it was (deep_fp8_gemm/kernels/split_k.py)."""
    from deep_fp8_gemm.kernels import split_k

    utils.set_num_sms(132)
    split_k.clear()
    m, n, k = 16, 576, 7168
    a, sa = dfg.per_token_cast_to_fp8(torch.randn(m, k))
    b, sb = dfg.per_block_cast_to_fp8(torch.randn(n, k))
    sa = utils.get_col_major_tma_aligned_tensor(sa)
    out = torch.zeros(m, n, dtype=torch.bfloat16)
    cfg = dfg.config.get_config(m, n, k, 1, "dense", 132, batch_invariant=False)
    assert cfg.split_k > 1
    fake_gpu.on()
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)  # eager: the plan's pair is the stream's cached one
    counters, partials = split_k.buffers(cfg, m, a.device, 0x77)
    cached = struct.pack("<QQ", counters.data_ptr(), partials.data_ptr())
    assert fake_gpu.launches[-1]["params"][560:576] == cached
    sizes = (counters.numel(), partials.numel())

    allocated = []
    real_zeros = torch.zeros

    def zeros(*args, **kwargs):  # the captured pair's counters: zeroed when allocated (the graph records it)
        t = real_zeros(*args, **kwargs)
        allocated.append(t)
        return t

    monkeypatch.setattr(target, "is_capturing", lambda index: True)
    monkeypatch.setattr(split_k.torch, "zeros", zeros)
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    planned = fake_gpu.launches[-1]["params"][560:576]
    gemm.launch_1d2d(cfg, a, sa, b, sb, out, None, "cuda")
    explicit = fake_gpu.launches[-1]["params"][560:576]
    assert len(allocated) == 2 and all(t.dtype == torch.int32 and not t.any() for t in allocated)
    for captured in (planned, explicit):
        assert captured != cached and struct.unpack("<QQ", captured)[0] != 0
    assert split_k.buffers(cfg, m, a.device, 0x77)[0].data_ptr() == counters.data_ptr()  # the cache untouched
    assert (counters.numel(), partials.numel()) == sizes

    monkeypatch.setattr(target, "is_capturing", lambda index: False)  # eager again: back to the cached pair
    dfg.gemm_fp8_fp8_bf16_nt((a, sa), (b, sb), out)
    assert fake_gpu.launches[-1]["params"][560:576] == cached
    split_k.clear()
    utils.reset_num_sms()


# ---------------------------------------------------------------------------------------------- FP8 / SwiGLU outputs
_PAIR_KINDS = ("dense_fp8out", "contiguous_fp8out", "masked_fp8out", "psum_fp8out", "contiguous_swiglu",
               "masked_swiglu")


def _pair_case(kind: str):
    """``(call, args)`` of a small valid call of an FP8-output / SwiGLU kind: ``call(**args)`` with args ``lhs``,
    ``rhs``, ``out`` (the (D, sD) pair), ``layout`` (None for dense) and ``use_ue8m0``."""
    from tests._operands import gemm_operands

    swiglu, masked, dense = kind.endswith("swiglu"), kind.startswith("masked"), kind.startswith("dense")
    n, k = 256, 256
    a, sa, b, sb = gemm_operands((2, 32) if masked else ((64,) if dense else (128,)), n, k, None if dense else 2,
                                 seed=11)
    sa = utils.get_col_major_tma_aligned_tensor(sa)
    if swiglu:
        b, sb = dfg.interleave_swiglu_weights(b, sb)
    n_out = n // 2 if swiglu else n
    out = outputs.empty_out((2,) if masked else (), a.shape[-2], n_out, "cpu")
    layout = {"dense": None, "masked": torch.tensor([32, 7], dtype=torch.int32),
              "contiguous": torch.tensor([0] * 100 + [-1] * 28, dtype=torch.int32),
              "psum": torch.tensor([0, 100], dtype=torch.int32)}[kind.split("_")[0]]
    op = ops.FAMILIES[kind].public

    def call(lhs, rhs, out, layout, use_ue8m0):
        if dense:
            return op(lhs, rhs, out, use_ue8m0=use_ue8m0)
        return op(lhs, rhs, out, layout, *((16,) if masked else ()), use_ue8m0=use_ue8m0)

    return call, dict(lhs=(a, sa), rhs=(b, sb), out=out, layout=layout, use_ue8m0=False)


def _fresh_out(out):
    return tuple(torch.full_like(t, 3) if t.dtype == torch.float32 else torch.zeros_like(t) for t in out)


def _bits(out):
    return [t.view(torch.uint8) if t.dtype != torch.float32 else t for t in out]


@pytest.mark.parametrize("kind", _PAIR_KINDS)
def test_pair_output_plans_compute_the_uncached_bits_and_key_use_ue8m0(kind):
    """A cached plan computes what the uncached path does (fresh outputs and inputs of the signature); use_ue8m0 is
    part of the signature (a plan per value); a non-bool use_ue8m0 is the op's TypeError on a cached signature."""
    call, args = _pair_case(kind)
    expected = {}
    for ue8m0 in (False, True):
        plans.clear()
        expected[ue8m0] = _fresh_out(args["out"])
        call(**dict(args, out=expected[ue8m0], use_ue8m0=ue8m0))
    plans.clear()
    for ue8m0 in (False, True, False, True):
        out = _fresh_out(args["out"])
        (a, sa) = args["lhs"]
        call(**dict(args, lhs=(a.clone(), sa.clone()), out=out, use_ue8m0=ue8m0))
        rows = slice(None) if not kind.startswith(("contiguous", "psum")) else slice(0, 100)
        for got, want in zip(_bits(out), _bits(expected[ue8m0])):
            if kind.startswith("masked"):
                assert torch.equal(got[0], want[0]) and torch.equal(got[1, :7], want[1, :7])
            else:
                assert torch.equal(got[rows], want[rows])
    assert plans.stats()[kind][0] == 2
    with pytest.raises(TypeError, match="use_ue8m0 must be a bool"):
        call(**dict(args, use_ue8m0=1))


def _pair_changes(args):
    """Pointer-only changes of a cached signature that break a rule: (name, new out pair, error text)."""
    d, sd = args["out"]
    a = args["lhs"][0]
    sd_in_a = a.view(-1)[: sd.numel() * 4].view(torch.float32).as_strided(sd.shape, sd.stride())  # sD over A
    d_in_sd = torch.empty(d.numel() + 4 * sd.numel() + 64, dtype=torch.uint8)
    return [
        ("sD overlaps A", (d, sd_in_a), r"out\[1\] \(sD\)"),
        ("D overlaps sD", (d_in_sd[:d.numel()].view(d.dtype).view(d.shape),
                           d_in_sd[16:16 + 4 * sd.numel()].view(torch.float32).as_strided(sd.shape, sd.stride())),
         r"out\[0\] \(D\)"),
        ("D misaligned", (_offset_view(d, 8), sd), r"out\[0\] \(D\)"),
    ]


@pytest.mark.parametrize("kind", _PAIR_KINDS)
def test_pair_output_pointer_changes_are_caught_on_the_cached_plan(kind):
    """sD over an input, D over sD, D misaligned: after a cached call, on the same plan, the op's message."""
    call, args = _pair_case(kind)
    call(**args)
    for name, out, text in _pair_changes(args):
        with pytest.raises(ValueError, match=text) as warm:
            call(**dict(args, out=out))
        assert plans.stats()[kind][0] == 1, name
        plans.clear()
        with pytest.raises(ValueError) as cold:
            call(**dict(args, out=out))
        assert str(warm.value) == str(cold.value), name
        call(**args)


def _uncached_pair_launch(kind, args, out) -> None:
    a, sa = args["lhs"]
    b, sb = args["rhs"]
    cfg = ops.FAMILIES[kind].plan(a, b, 16 if kind.startswith("masked") else None, utils.get_num_sms(),
                                  args["use_ue8m0"])
    gemm.launch_fp8_output(cfg, a, sa, b, sb, *out, args["layout"], "cuda")


@pytest.mark.parametrize("kind", _PAIR_KINDS)
def test_pair_output_plan_launches_what_the_uncached_path_launches(fake_gpu, kind):
    """The plan's parameter block (maps, sB, layout, rows, sD and its stride), grid and launch: the uncached
    launch's, bit for bit; the same pointers again encode nothing; a new (D, sD) encodes D's map only."""
    call, args = _pair_case(kind)
    args["use_ue8m0"] = kind.startswith("masked")  # both option values across the kinds
    fake_gpu.on()
    call(**args)
    encoded = len(fake_gpu.specs)
    call(**args)
    assert len(fake_gpu.specs) == encoded
    fast = fake_gpu.launches[-1]
    _uncached_pair_launch(kind, args, args["out"])
    slow = fake_gpu.launches[-1]
    for field in ("params", "grid", "block", "smem", "stream", "attrs", "function"):
        assert fast[field] == slow[field], field
    out2 = _fresh_out(args["out"])
    call(**dict(args, out=out2))
    assert fake_gpu.specs[-1].global_address == out2[0].data_ptr()
    fast = fake_gpu.launches[-1]
    _uncached_pair_launch(kind, args, out2)
    assert fast["params"] == fake_gpu.launches[-1]["params"]
    assert struct.unpack_from("<QI", fast["params"], 536 + 0)[0] == out2[1].data_ptr()  # sd
    assert struct.unpack_from("<I", fast["params"], 552)[0] == out2[1].stride(-1)  # ld_sd
    assert plans.stats()[kind][0] == 1


# ---------------------------------------------------------------------------------------------- the 2.x names
_COMPAT = {
    "dense": lambda args, **kw: compat_api.fp8_gemm_nt(args["lhs"], args["rhs"], args["out"], **kw),
    "masked": lambda args, **kw: compat_api.m_grouped_fp8_gemm_nt_masked(
        args["lhs"], args["rhs"], args["out"], args["masked_m"], args["expected_m"], **kw),
    "contiguous": lambda args, **kw: compat_api.m_grouped_fp8_gemm_nt_contiguous(
        args["lhs"], args["rhs"], args["out"], args["m_indices"], **kw),
    "psum": lambda args, **kw: compat_api.m_grouped_fp8_gemm_nt_contiguous(
        args["lhs"], args["rhs"], args["out"], args["grouped_layout"], use_psum_layout=True,
        expected_m_for_psum_layout=args["expected_m"], **kw),
    "block32": lambda args, **kw: compat_api.fp8_gemm_nt(args["lhs"], args["rhs"], args["out"],
                                                         **dict(dict(recipe=(1, 32, 32)), **kw)),
}
_COMPAT_BAD = [
    ("recipe", dict(recipe=(1, 128, 64)), ValueError, "recipe"),
    ("recipe-bool", dict(recipe=(True, 128, 128)), TypeError, "recipe"),
    ("recipe-bool-32", dict(recipe=(True, 32, 32)), TypeError, "recipe"),  # == (1, 32, 32) in Python
    ("compiled_dims", dict(compiled_dims="mx"), ValueError, "compiled_dims"),
    ("compiled_dims-list", dict(compiled_dims=["m"]), TypeError, "compiled_dims"),
    ("disable_ue8m0_cast", dict(disable_ue8m0_cast=1), TypeError, "disable_ue8m0_cast"),
]


def _compat_args(kind):
    if kind == "block32":  # SGLang's DeepSeek-V4.1 call: 1x32 activations, 32x32 weights
        from tests._operands import quantised_activations, quantised_weights

        (a, sa), (b, sb) = quantised_activations((64, 256), 0, gran_k=32), quantised_weights((256, 256), 1, gran_k=32)
        return dict(lhs=(a, utils.get_col_major_tma_aligned_tensor(sa)), rhs=(b, sb),
                    out=torch.empty(64, 256, dtype=torch.bfloat16))
    args = _canonical(BUILDERS[kind]())
    return dict(args, lhs=(args["a"], args["sa"]), rhs=(args["b"], args["sb"]),
                expected_m=args.get("expected_m", 16 if kind == "masked" else None))


@pytest.mark.parametrize("kind", list(_COMPAT))
@pytest.mark.parametrize("case,kwargs,exc,text", _COMPAT_BAD, ids=[c[0] for c in _COMPAT_BAD])
def test_compat_names_check_their_own_arguments_on_a_cached_signature(kind, case, kwargs, exc, text):
    """The 2.x names call the cached plan first (``_core.plans.cached_call``) only with their defaults' argument
    kinds: a bad 2.x argument on a known signature raises what it raises with no plan cached."""
    args = _compat_args(kind)
    _COMPAT[kind](args)
    _COMPAT[kind](args)  # served by the cached plan
    with pytest.raises(exc, match=text) as warm:
        _COMPAT[kind](args, **kwargs)
    plans.clear()
    with pytest.raises(exc) as cold:
        _COMPAT[kind](args, **kwargs)
    assert str(warm.value) == str(cold.value)


def test_compat_cached_call_serves_only_its_signature():
    """fp8_gemm_nt on a known signature: the cached plan's bits; an SM100 scale dtype, an fp32 d or a C still take
    the 2.x checks (NotImplementedError / TypeError / ValueError as without a plan)."""
    args = _compat_args("dense")
    expected = torch.empty_like(args["out"])
    dfg.gemm_fp8_fp8_bf16_nt(args["lhs"], args["rhs"], expected)
    for _ in range(2):
        out = torch.zeros_like(args["out"])
        compat_api.fp8_gemm_nt(args["lhs"], args["rhs"], out, disable_ue8m0_cast=True)
        assert torch.equal(out, expected)
    a, sa = args["lhs"]
    with pytest.raises(NotImplementedError, match="packed UE8M0"):
        compat_api.fp8_gemm_nt((a, sa.view(torch.int32)), args["rhs"], args["out"])
    with pytest.raises(TypeError, match="recipe=\\(1, 1, 128\\)"):
        compat_api.fp8_gemm_nt(args["lhs"], args["rhs"], args["out"].float())
    with pytest.raises(ValueError, match="not supported"):
        compat_api.fp8_gemm_nt(args["lhs"], args["rhs"], args["out"], c=args["out"])
