"""One launch of a rendered kernel on its backend: the single backend branch the sibling kernel families share (the
indexer's MQA logits, the BF16 GEMM, the TF32 hc-prenorm GEMM).

A family gives its ``render_source(config, simulator=False) -> (name, source)`` (the sm_90a build and the simulator
build of the same source, one name) and its packed parameter block; :func:`launch_rendered` then

* ``Backend.CUDA``: compiles the source (NVRTC, the disk cache), loads it once per (kernel, device) and launches on
  torch's current stream with PDL per :func:`~deep_fp8_gemm.set_pdl`;
* ``Backend.SIM``: runs the simulator build with the register count ptxas reports for the sm_90a build (the
  simulator checks ``setmaxnreg`` against it).

The FP8 GEMM template (``kernels.gemm``) and the quantisers (``kernels.quant``) keep launchers of their own: their
per-call fast path (``_core.plans``) holds prepared launches.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ..runtime.target import Backend
from ..utils import PROCESS_SETTINGS

#: ``render_source`` of a family bound to one config: ``simulator`` -> ``(kernel name, source)``.
Renderer = Callable[[bool], tuple[str, str]]


def num_ctas(backend: Backend) -> int:
    """The persistent kernels' grid bound: the GPU's SMs (or :func:`~deep_fp8_gemm.set_num_sms`), the simulator's
    ``DFG_SIM_NUM_SMS``."""
    if backend is Backend.SIM:
        from .. import env

        return env.sim_num_sms()
    from ..utils import get_num_sms

    return get_num_sms()


@functools.lru_cache(maxsize=None)
def cuda_function(name: str, source: str, device: int):
    """Kernel ``name`` of ``source`` compiled (cached on disk) and loaded on GPU ``device``, once per process (the
    sources are the families' cached renders, so the key's hash is computed once)."""
    from ..runtime import driver
    from ..runtime.compiler import compile_kernel

    compiled = compile_kernel(name, source)
    return driver.load_kernel(compiled.cubin, compiled.name, device, key=compiled.key)


def launch_rendered(render: Renderer, params: bytes, *, grid: int, block: int, smem_bytes: int, backend: Backend,
                    device: torch.device, what: str) -> None:
    """Launch the kernel ``render`` gives on ``grid`` CTAs of ``block`` threads with ``smem_bytes`` of dynamic
    shared memory (module docstring). ``what`` names the family in the error for any other backend."""
    if backend is Backend.SIM:
        from ..simulator import launch as sim_launch, ptxas_registers

        name, source = render(False)
        registers = ptxas_registers(name, source)
        _, sim_source = render(True)
        sim_launch(name, sim_source, params, grid=grid, block=block, cluster=1, smem_bytes=smem_bytes,
                   registers=registers)
    elif backend is Backend.CUDA:
        from ..runtime import driver, target

        index = target.gpu_index(device)
        driver.launch(cuda_function(*render(False), index), params, grid=grid, block=block, smem_bytes=smem_bytes,
                      stream=target.current_stream(index), pdl=PROCESS_SETTINGS.pdl)
    else:
        raise ValueError(f"{what} launches on Backend.CUDA or Backend.SIM, got {backend}")
