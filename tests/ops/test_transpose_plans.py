"""The cast-transposes' per-call plans (``ops.transpose_plans``, issue 45): a cached call gives the op's bits and
errors, and on a GPU launches what the op's own path launches (tests/_fake_gpu.py: FakeDriver, CPU tensors mapped to
GPU 0), with outputs of their own each call."""

from __future__ import annotations

import struct
import threading

import pytest
import torch

import deep_fp8_gemm as dfg
from deep_fp8_gemm._core import plans
from deep_fp8_gemm.kernels import quant as kq
from deep_fp8_gemm.ops import transpose_plans
from tests._fake_gpu import fake_gpu as fake_gpu_context

# TransposeParams: input, output, scales, output_t, scales_t, group_prefix, input_row_stride (u64), six u32.
_FIELDS = struct.Struct("<7Q6I")
_OPS = {"cast_transpose": lambda x, ue8m0=False: dfg.per_token_cast_to_fp8_and_transpose(x, ue8m0),
        "k_grouped": lambda x, ue8m0=False: dfg.transpose_cast_to_fp8_k_grouped(x, [128, 0, 256], ue8m0)}
_OPS_UNCACHED = {
    "cast_transpose": lambda x, ue8m0=False: torch.ops.deep_fp8_gemm.per_token_cast_to_fp8_and_transpose.default(
        x, ue8m0),
    "k_grouped": lambda x, ue8m0=False: torch.ops.deep_fp8_gemm.transpose_cast_to_fp8_k_grouped.default(
        x, [128, 0, 256], ue8m0)}


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear()
    yield
    plans.clear()


def _plans() -> int:
    return plans.stats()["transpose.plans"][0]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _same(got: tuple, want: tuple) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
        assert torch.equal(_bits(a), _bits(b))


# ---------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("name", list(_OPS))
@pytest.mark.parametrize("ue8m0", [False, True])
def test_cpu_calls_through_a_plan_give_the_ops_bits(name, ue8m0):
    for seed in range(3):  # new data each call, one plan
        x = torch.randn(384, 256, generator=torch.Generator().manual_seed(seed)).bfloat16()
        _same(_OPS[name](x, ue8m0), _OPS_UNCACHED[name](x, ue8m0))
    assert _plans() == 1


@pytest.mark.parametrize("ks", [[128, False, 256], [128.0, 0, 256], (128, 0, 255), [128, 0], [], "abc"])
def test_k_grouped_errors_after_a_cached_call_are_the_ops(ks):
    """``ks`` that compare equal to a cached plan's (False == 0, 128.0 == 128) or differ: the op's own error, warm
    as cold (the op refuses bools, floats, non-multiples, a wrong sum, no groups, a string)."""
    x = torch.randn(384, 256).bfloat16()
    for _ in range(2):
        _OPS["k_grouped"](x)
    with pytest.raises((TypeError, ValueError)) as warm:
        dfg.transpose_cast_to_fp8_k_grouped(x, ks)
    plans.clear()
    with pytest.raises(type(warm.value)) as cold:
        dfg.transpose_cast_to_fp8_k_grouped(x, ks)
    assert str(warm.value) == str(cold.value)


def test_cast_transpose_errors_after_a_cached_call_are_the_ops():
    x = torch.randn(128, 256).bfloat16()
    dfg.per_token_cast_to_fp8_and_transpose(x)
    dfg.per_token_cast_to_fp8_and_transpose(x)
    for bad in (x[:0], x.to(torch.int32), x.view(2, 64, 256)):
        with pytest.raises((TypeError, ValueError)) as warm:
            dfg.per_token_cast_to_fp8_and_transpose(bad)
        plans.clear()
        with pytest.raises(type(warm.value)) as cold:
            dfg.per_token_cast_to_fp8_and_transpose(bad)
        assert str(warm.value) == str(cold.value)
    with pytest.raises(TypeError, match="use_ue8m0"):
        dfg.per_token_cast_to_fp8_and_transpose(x, 1)  # not a bool: the op's check, no plan


# ---------------------------------------------------------------------------------------------- GPU path, faked
@pytest.fixture
def fake_gpu(monkeypatch):
    with fake_gpu_context(monkeypatch, kq.TRANSPOSE_PARAMS_BYTES, caches=(kq._loaded.clear,)) as fake:
        yield fake


def _captured(name, x, ue8m0=False) -> dict:
    """The op's own launch (``kernels.quant.run_*``) of ``x``: config, parameter fields, grid."""
    captured = {}

    def capture(config, params, grid, device):
        captured.update(config=config, fields=_FIELDS.unpack(bytes(params)), grid=grid)

    if name == "cast_transpose":
        captured["outputs"] = kq.run_cast_transpose(x, capture, ue8m0)
    else:
        captured["outputs"] = kq.run_k_grouped_transpose(x, [128, 0, 256], capture, ue8m0)
    return captured


def _check_launch(name, launch: dict, x: torch.Tensor, outputs: tuple, ue8m0=False) -> None:
    want = _captured(name, x, ue8m0)
    got = _FIELDS.unpack(launch["params"][:kq.TRANSPOSE_PARAMS_BYTES])
    pointers = {"cast_transpose": (1, 2, 3, 4), "k_grouped": (3, 4)}[name]
    assert got[0] == x.data_ptr() and [got[i] for i in pointers] == [t.data_ptr() for t in outputs]
    constants = [i for i in range(1, len(got)) if i not in pointers]
    assert [got[i] for i in constants] == [want["fields"][i] for i in constants]
    assert launch["grid"][0] == want["grid"] and launch["stream"] == 0x77
    assert launch["function"] == int(kq.cuda_kernel(want["config"], 0).kernel)
    for t, ref in zip(outputs, want["outputs"]):
        assert (t.shape, t.stride(), t.dtype) == (ref.shape, ref.stride(), ref.dtype)


@pytest.mark.parametrize("name", list(_OPS))
@pytest.mark.parametrize("offset,ue8m0", [(0, False), (0, True), (2, False)])
def test_plan_launches_what_the_op_launches(fake_gpu, name, offset, ue8m0):
    """Three calls (the plan built, then hits with new inputs) each launch the op's parameters, grid and kernel
    (the scalar one for an input off 16 bytes), with the call's own pointers."""
    base = torch.randn(384 * 256 + offset).bfloat16()
    x = base[offset:].view(384, 256)
    fake_gpu.on()
    for _ in range(3):
        outputs = _OPS[name](x, ue8m0)
        _check_launch(name, fake_gpu.launches[-1], x, outputs, ue8m0)
        x = x.clone() if offset == 0 else torch.cat([base[:offset], x.reshape(-1).clone()])[offset:].view(384, 256)
    assert _plans() == 1 and len(fake_gpu.launches) == 3


@pytest.mark.parametrize("name", list(_OPS))
def test_outputs_own_their_storage_and_another_thread_packs_its_own(fake_gpu, name):
    """Every call's outputs are new tensors of exactly their size; a call from another thread runs the op's path
    (its own slot) and leaves the plan's block to the thread that built it."""
    x = torch.randn(384, 256).bfloat16()
    fake_gpu.on()
    first, second = _OPS[name](x), _OPS[name](x)
    results = {}
    other = threading.Thread(target=lambda: results.update(out=_OPS[name](x), launch=fake_gpu.launches[-1]))
    other.start()
    other.join()
    _check_launch(name, results["launch"], x, results["out"])
    third = _OPS[name](x)
    _check_launch(name, fake_gpu.launches[-1], x, third)
    tensors = first + second + results["out"] + third
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == len(tensors)
    for t in tensors:
        hi = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
        assert t.storage_offset() == 0 and t.untyped_storage().nbytes() == hi * t.element_size()
    addresses = [launch["params_address"] for launch in fake_gpu.launches]
    assert addresses[1] == addresses[3] != addresses[2]


def test_k_grouped_plan_holds_its_group_prefix(fake_gpu):
    """The prefix sums the kernel reads are the plan's: dropping the op's cache of them frees nothing the plan's
    parameters point at."""
    x = torch.randn(384, 256).bfloat16()
    fake_gpu.on()
    _OPS["k_grouped"](x)
    kq._prefix_cache.clear()
    _OPS["k_grouped"](x)
    prefix = _FIELDS.unpack(fake_gpu.launches[-1]["params"][:kq.TRANSPOSE_PARAMS_BYTES])[5]
    (plan,) = transpose_plans._plans.values()
    assert plan.launch_plan.keep.data_ptr() == prefix and plan.launch_plan.keep.tolist() == [0, 128, 128, 384]


@pytest.mark.parametrize("change", ["shape", "stride", "dtype", "ks"])
def test_each_signature_change_misses(fake_gpu, change):
    x = torch.randn(384, 256).bfloat16()
    fake_gpu.on()
    _OPS["k_grouped"](x)
    ks = [128, 0, 256]
    if change == "shape":
        x = torch.randn(384, 128).bfloat16()
    elif change == "stride":
        x = torch.randn(384, 512).bfloat16()[:, :256]
    elif change == "dtype":
        x = x.float()
    else:
        ks = [256, 0, 128]
    outputs = dfg.transpose_cast_to_fp8_k_grouped(x, ks)
    captured = {}
    kq.run_k_grouped_transpose(x, ks, lambda config, params, grid, device: captured.update(
        fields=_FIELDS.unpack(bytes(params)), grid=grid))
    got = _FIELDS.unpack(fake_gpu.launches[-1]["params"][:kq.TRANSPOSE_PARAMS_BYTES])
    assert got[6:] == captured["fields"][6:] and got[3:5] == tuple(t.data_ptr() for t in outputs)
    assert _plans() == 2
