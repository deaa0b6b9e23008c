"""Expert-parallel MoE and tensor-parallel FP8 linears on ``torch.distributed`` (NCCL on GPUs, gloo on CPUs).

* :func:`ep_moe_forward` — prefill / training: uneven all-to-all dispatch, contiguous grouped GEMMs.
* :func:`ep_moe_forward_decode` with :class:`EPDecodeBuffers` — decode under CUDA graphs: static buffers,
  masked layout, no host synchronisation.
* :class:`EPMoE` — a module owning one rank's experts.
* :class:`ColumnParallelFP8Linear`, :class:`RowParallelFP8Linear` — tensor parallelism, Megatron-LM style.
* :func:`reserve_sms` — leave SMs to communication kernels that overlap the GEMMs.

Expert sharding: rank ``r`` of the group owns global experts ``[r*E_local, (r+1)*E_local)``.
"""

from .ep_decode import EPDecodeBuffers, ep_moe_forward_decode
from .ep_moe import ep_moe_forward
from .module import EPMoE
from .sms import reserve_sms
from .tensor_parallel import ColumnParallelFP8Linear, RowParallelFP8Linear

__all__ = [
    "ColumnParallelFP8Linear",
    "EPDecodeBuffers",
    "EPMoE",
    "ep_moe_forward",
    "ep_moe_forward_decode",
    "reserve_sms",
    "RowParallelFP8Linear",
]
