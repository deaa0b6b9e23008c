"""The k-grouped GEMM without a host sync, capturable and replayable with new ``ks_tensor`` values (issue 25,
item 4): the per-group tensor maps are built on the device from ``ks_tensor`` by a small kernel launched just
before the GEMM (``include/deep_fp8_gemm/kernels/group_maps.cuh``, ``deep_fp8_gemm/kernels/group_maps.py``).

CPU tests (FakeDriver, tests/ops/test_prepared.py's ``fake_gpu``): the launch path after validation makes no
host<->device copy and reads no tensor's values on the host (a TorchFunctionMode records every call); the two
launches carry the builder's parameters and the GEMM's map pointer; ``ks_tensor=None`` under capture is refused.
GPU tests (skipped here with the reason): one capture replayed with two different ``ks``; an eager call without
``ks_tensor`` returning before the stream drains. In the simulator (here: a ``ks_tensor`` past the operand
buffers traps; tests/kernels/test_sim_k_grouped.py: the builder on every k-grouped launch, with planted builder bugs).
"""

from __future__ import annotations

import ctypes
import shutil
import struct

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import deep_fp8_gemm as deep_gemm
from deep_fp8_gemm.kernels import gemm, group_maps
from deep_fp8_gemm.ops import k_grouped
from deep_fp8_gemm.runtime import target
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec
from tests._gpu import requires_sm90
from tests.ops.test_k_grouped import k_grouped_operands, model64
from tests.ops.test_prepared import fake_gpu  # noqa: F401 (fixture)

#: Calls that copy between host and device or read a tensor's values on the host (each a sync on a GPU, or a
#: copy a CUDA graph would replay out of memory it does not own).
SYNCING = {"tolist", "item", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__", "cuda"}


class HostTransfers(TorchFunctionMode):
    """Records calls in :data:`SYNCING`, ``copy_`` between devices, ``Tensor.to`` with a device (unless
    ``non_blocking`` from pinned memory) and ``torch.tensor`` / ``as_tensor`` onto a device. Device-local work (allocations, the scales' TMA-aligned copies) is
    not a transfer."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in SYNCING:
            self.seen.append(name)
        elif name == "to" and not (kwargs.get("non_blocking") and args and args[0].is_pinned()):
            if any(isinstance(x, (torch.device, str)) for x in args[1:]) or "device" in kwargs:
                self.seen.append("to(device)")
        elif name == "copy_" and args[0].device != args[1].device:
            self.seen.append("copy_ between devices")
        elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
            self.seen.append(f"{name}(device=...)")
        return func(*args, **kwargs)


M, N, KS = 64, 48, [256, 0, 384, 128]


def _operands():
    a, sa, b, sb, c = k_grouped_operands(M, N, KS, seed=4)
    return a, sa, b, sb, c, torch.tensor(KS, dtype=torch.int32)


def test_launch_path_makes_no_host_transfer_and_builds_the_maps_on_the_device(fake_gpu):  # noqa: F811
    fake_gpu.param_sizes = [gemm.PARAMS_BYTES]
    fake_gpu.param_sizes_by_name[group_maps.kernel_name()] = [ctypes.sizeof(group_maps.GroupMapParams)]
    a, sa, b, sb, c, ks_tensor = _operands()
    d = torch.empty_like(c)
    fake_gpu.on()
    assert target.backend_of(d.device, "gemm") is target.Backend.CUDA
    k_grouped.check(a, sa, b, sb, d, KS, ks_tensor, c)
    with HostTransfers() as mode:
        k_grouped.FAMILY.dispatch(a, sa, b, sb, d, KS, ks_tensor, c)
    assert mode.seen == [], f"the k-grouped launch path copies or reads host data: {mode.seen}"

    builder, gemm_launch = fake_gpu.launches[-2:]
    assert builder["name"] == group_maps.kernel_name() and gemm_launch["name"].startswith("dfg_fp8_gemm_k_grouped")
    assert builder["grid"] == (-(-2 * len(KS) // group_maps.WARPS), 1, 1)
    assert builder["block"] == (group_maps.NUM_THREADS, 1, 1) and builder["smem"] == group_maps.SMEM_BYTES
    p = group_maps.GroupMapParams.from_buffer_copy(builder["params"])
    assert (p.a, p.b, p.ks) == (a.data_ptr(), b.data_ptr(), ks_tensor.data_ptr())
    assert (p.num_groups, p.rows, p.n, p.capacity_k) == (len(KS), M, N, sum(KS))
    assert p.maps % group_maps.MAP_ALIGNMENT == 0
    # the GEMM reads the maps the builder writes, and ks_tensor itself
    assert struct.unpack_from("<Q", gemm_launch["params"], 560)[0] == p.maps
    assert struct.unpack_from("<Q", gemm_launch["params"], 520)[0] == ks_tensor.data_ptr()
    cfg = k_grouped.plan(M, N, len(KS), 132)
    specs = [s for s in fake_gpu.specs if s.global_address in (a.data_ptr(), b.data_ptr())]
    want = group_maps.template_map_args(cfg, a, b, M, N)
    assert specs[-2:] == [TensorMapSpec(*w) for w in want]


def test_old_host_built_maps_would_be_flagged():
    """The recorder sees what the host-built path did per call (maps copied host-to-device, ks_tensor built from
    the list): the test above cannot pass by recording nothing."""
    with HostTransfers() as mode:
        blob = torch.frombuffer(bytearray(256), dtype=torch.uint8).to(torch.device("cpu"))
        torch.tensor([128, 256], dtype=torch.int32, device=torch.device("cpu"))
        blob.tolist()
    assert mode.seen == ["to(device)", "tensor(device=...)", "tolist"]


def test_ks_tensor_none_is_refused_while_capturing(monkeypatch):
    monkeypatch.setattr(target, "is_capturing", lambda index: True)
    monkeypatch.setattr(target, "gpu_index", lambda device: 0)
    with pytest.raises(ValueError, match="ks_tensor=None while capturing a CUDA graph"):
        k_grouped.device_ks(KS, torch.device("cuda", 0))
    assert torch.equal(k_grouped.device_ks(KS, torch.device("cpu")), torch.tensor(KS, dtype=torch.int32))


@pytest.mark.skipif(shutil.which("g++") is None, reason="the simulator builds kernels with g++")
@pytest.mark.parametrize("bad,message", [([256, 0, 512, 128], "sums to more K than ks"),
                                         ([256, 0, 384, 100], "negative or not a multiple of 128")])
def test_builder_refuses_a_ks_tensor_the_buffers_cannot_serve(bad, message):
    """ks_tensor values are read only on the device (a replay may bring new ones; the op checks a CPU ks_tensor
    against ks, so this goes in below the op): a sum past the buffers' K or a K breaking the 128 rule traps in
    the builder instead of reading other memory."""
    from deep_fp8_gemm import get_col_major_tma_aligned_tensor
    from deep_fp8_gemm.simulator import SimulationError

    a, sa, b, sb, c, _ = _operands()
    cfg = k_grouped.plan(M, N, len(KS), 2)
    d = c.clone()
    with pytest.raises(SimulationError, match=message):
        gemm.launch_k_grouped(cfg, a, get_col_major_tma_aligned_tensor(sa), b, get_col_major_tma_aligned_tensor(sb),
                              d, d, torch.tensor(bad, dtype=torch.int32), sum(KS), "sim")


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@requires_sm90
def test_gpu_capture_once_replay_with_two_ks():
    """One graph captured with ks_a; the same buffers refilled for ks_b (same sum, other sizes, another empty
    group) and ks_tensor rewritten before the replay: both agree with float64."""
    m, n = 256, 512
    ks_a, ks_b = [256, 0, 512, 128], [128, 384, 0, 384]
    assert sum(ks_a) == sum(ks_b)
    first = k_grouped_operands(m, n, ks_a, seed=1)
    bufs = [t.cuda() for t in first]
    a, sa, b, sb, c = bufs
    ks_tensor = torch.tensor(ks_a, dtype=torch.int32, device="cuda")
    d = torch.full(c.shape, float("nan"), device="cuda")
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks_a, ks_tensor, c)  # warm-up: JIT, maps
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks_a, ks_tensor, c)
    for ks, seed in ((ks_a, 1), (ks_b, 2), (ks_a, 3)):
        host = k_grouped_operands(m, n, ks, seed=seed)
        for dst, src in zip(bufs, host):
            dst.copy_(src)
        ks_tensor.copy_(torch.tensor(ks, dtype=torch.int32))
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected = model64(*host, ks, m, n)
        got = d.cpu().double().numpy()
        assert np.isfinite(got).all(), ks
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max(), err_msg=str(ks))


@pytest.mark.gpu
@requires_sm90
def test_gpu_eager_call_without_ks_tensor_does_not_synchronise():
    """ks_tensor=None: the sizes go up through pinned memory, non-blocking; the call returns before a long
    kernel queued ahead of it on the stream has finished."""
    m, n, ks = 128, 256, [128, 256]
    a, sa, b, sb, c = (t.cuda() for t in k_grouped_operands(m, n, ks, seed=5))
    d = torch.empty_like(c)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, None, c)  # warm-up
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time queued ahead
    start = torch.cuda.Event(enable_timing=False)
    start.record()
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((a, sa), (b, sb), d, ks, None, c)
    assert not start.query(), "the call waited for the stream to drain"
    torch.cuda.synchronize()
    np.testing.assert_allclose(d.cpu().double().numpy(), model64(*(t.cpu() for t in (a, sa, b, sb, c)), ks, m, n),
                               rtol=1e-4, atol=1e-3)
