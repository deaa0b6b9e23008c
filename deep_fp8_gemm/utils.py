"""Layout and housekeeping helpers shared by the ops, the tests and user code.

Nothing here imports the JIT or the CUDA bindings; every helper works on CPU and CUDA tensors.
"""

from __future__ import annotations

import functools

import torch

from . import env
from .constants import CONTIGUOUS_ALIGNMENTS, DEFAULT_CONTIGUOUS_ALIGNMENT, DEFAULT_NUM_SMS


class ProcessSettings:
    """Process-wide settings that change which kernel a call runs or how its arguments are laid out: the
    :func:`set_num_sms` override, the contiguous layout's alignment (:func:`set_mk_alignment_for_contiguous_layout`),
    the PDL flag (:func:`set_pdl`) and the batch-invariant mode (:func:`set_batch_invariant`).

    ``key`` is a tuple of every field, rebuilt whenever one changes and interned (equal settings give the same
    tuple object): the per-call fast path reads it once per call as part of a plan's signature and compares it
    by identity, so a new setting is a new plan, never a stale one, and going back to an old setting finds its
    plans again. Shared by all threads (a setting is process state, as in the reference design): ``update``
    assigns the fields and then the key, each one attribute store, so a thread always reads a complete key; a
    call that runs while another thread changes a setting may use either value (do not change the alignment
    while another thread is inside a grouped GEMM or a MoE layer, as with the reference design's setter).
    """

    __slots__ = ("num_sms_override", "contiguous_alignment", "pdl", "batch_invariant", "key", "_interned")
    FIELDS = ("num_sms_override", "contiguous_alignment", "pdl", "batch_invariant")

    def __init__(self) -> None:
        self._interned: dict[tuple, tuple] = {}
        self.num_sms_override: int | None = None
        self.contiguous_alignment = DEFAULT_CONTIGUOUS_ALIGNMENT
        self.pdl = env.pdl()
        self.batch_invariant = True
        self.update()

    def update(self, **fields) -> None:
        """Set the named fields (:data:`FIELDS`) and rebuild ``key``."""
        for name, value in fields.items():
            if name not in self.FIELDS:
                raise TypeError(f"ProcessSettings has no field {name!r}")
            setattr(self, name, value)
        key = tuple(getattr(self, name) for name in self.FIELDS)
        self.key = self._interned.setdefault(key, key)


#: The one instance (read by ``_core.plans`` and ``distributed.sms``; written only through the setters here).
PROCESS_SETTINGS = ProcessSettings()

def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers ``a >= 0`` and ``b > 0``."""
    if b <= 0:
        raise ValueError(f"ceil_div needs a positive divisor, got {a=} {b=}")
    return (a + b - 1) // b


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` rounded up so that ``x * element_size`` is a multiple of 16 bytes (TMA's global-stride rule).

    ``x`` is a non-negative int (``ValueError`` / ``TypeError`` otherwise); ``element_size`` is in bytes and must
    divide 16 (1, 2, 4, 8 or 16).
    """
    if element_size <= 0 or 16 % element_size != 0:
        raise ValueError(f"element_size must divide 16 bytes, got {element_size=}")
    # ints (a SymInt too: a row count traced by torch.compile(dynamic=True), on which hasattr does not trace) are
    # tested first; numpy integers have __index__.
    if isinstance(x, (bool, float)) or not (isinstance(x, (int, torch.SymInt)) or hasattr(x, "__index__")):
        raise TypeError(f"x must be an int (a row count), got {type(x).__name__} ({x!r})")
    if x < 0:
        raise ValueError(f"x must be a non-negative row count, got {x=}")
    alignment = 16 // element_size
    return ceil_div(x, alignment) * alignment


def m_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of the M-major, TMA-aligned layout for a ``[m, g]`` or ``[G, m, g]`` shape."""
    m, g = shape[-2], shape[-1]
    aligned_m = get_tma_aligned_size(m, 4)
    if len(shape) == 2:
        return (1, aligned_m)
    return (aligned_m * g, 1, aligned_m)


def empty_m_major(shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """Uninitialised float32 tensor of ``shape`` (``[m, g]`` or ``[G, m, g]``) in the layout that
    :func:`get_col_major_tma_aligned_tensor` returns."""
    return torch.empty_strided(shape, m_major_strides(shape), dtype=torch.float32, device=device)


def get_col_major_tma_aligned_tensor(s: torch.Tensor) -> torch.Tensor:
    """Return the scales ``s`` in the M-major, TMA-aligned layout the kernels read.

    ``s``: float32, ``[m, g]`` or ``[G, m, g]`` (``g = ceil(k/128)`` scale columns), any strides, any device.

    Returns a tensor with the same shape and values whose strides are exactly
    ``(1, aligned_m)`` for 2-D and ``(aligned_m * g, 1, aligned_m)`` for 3-D, where
    ``aligned_m = get_tma_aligned_size(m, 4)`` (rows padded to 16 bytes; the padding is uninitialised and
    never read). ``s`` itself is returned, without a copy, when it already has exactly those strides;
    otherwise this allocates and copies (one strided copy on the tensor's device).
    """
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"s must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise TypeError(f"s must be float32, got s.dtype={s.dtype}")
    if s.dim() not in (2, 3):
        raise ValueError(f"s must be 2-D [m, g] or 3-D [G, m, g], got shape={tuple(s.shape)}")
    shape = tuple(s.shape)
    strides = m_major_strides(shape)
    if s.stride() == strides:
        return s
    out = torch.empty_strided(shape, strides, dtype=torch.float32, device=s.device)
    if s.numel() > 0:
        out.copy_(s)
    return out


def get_m_alignment_for_contiguous_layout() -> int:
    """Rows every expert segment of the contiguous grouped layout must be padded to: 128 unless
    :func:`set_mk_alignment_for_contiguous_layout` chose 64.

    It is the contiguous kernels' BLOCK_M (one M tile never straddles two experts):
    ``m_grouped_gemm_fp8_fp8_bf16_nt_contiguous`` requires ``m_sum`` to be a multiple of it and every expert's
    segment (including its -1 padding rows) to start at a multiple of it; the psum layout's groups start at the
    previous end rounded up to it; ``deep_fp8_gemm.layout`` and the MoE layers pad to it.
    """
    return PROCESS_SETTINGS.contiguous_alignment


def set_mk_alignment_for_contiguous_layout(alignment: int) -> None:
    """Set the contiguous layout's alignment (process-wide): 64 or 128 (the default).

    It is the BLOCK_M of the contiguous and psum kernels, so it decides the layout every producer of
    ``m_indices`` / group ends must build (``deep_fp8_gemm.layout``, the MoE layers and expert parallelism read it
    per call). 64 halves the worst-case padding per expert; 128 gives the larger tiles. Part of every plan's
    signature (a changed value makes new plans) and read when a layer is traced (``torch.compile``); a CUDA graph
    replays the kernels it captured, whatever the value is later. Same across threads (see
    :class:`ProcessSettings`).

    Raises:
        TypeError: not an int. ValueError: not 64 or 128.
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise TypeError(f"alignment must be an int, got {type(alignment).__name__} ({alignment!r})")
    if alignment not in CONTIGUOUS_ALIGNMENTS:
        raise ValueError(f"the contiguous layout's alignment must be one of {CONTIGUOUS_ALIGNMENTS} (the contiguous "
                         f"kernels' BLOCK_M), got {alignment}")
    PROCESS_SETTINGS.update(contiguous_alignment=alignment)


def set_pdl(enabled: bool) -> None:
    """Whether every kernel launches as a programmatic dependent launch (PDL; process-wide, default False or
    ``DFG_PDL=1``): the GPU may then start a kernel while the previous kernel of its stream is still finishing,
    so its launch and prologue (barrier initialisation, ``setmaxnreg``, tensor-map prefetch) overlap that tail.
    Every kernel executes ``griddepcontrol.wait`` before it reads or writes memory a previous kernel may touch,
    and ``griddepcontrol.launch_dependents`` once its own loads are issued, so results do not change; without
    the flag both are no-ops (one binary serves both). CUDA graphs capture PDL launches. Part of the plans'
    signature (the 2.x name, as vLLM calls it on Hopper).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__} ({enabled!r})")
    PROCESS_SETTINGS.update(pdl=enabled)


def get_pdl() -> bool:
    """The flag :func:`set_pdl` holds."""
    return PROCESS_SETTINGS.pdl


def set_batch_invariant(enabled: bool) -> None:
    """The batch-invariant mode (process-wide; on by default): every GEMM's output row depends only on its own row
    of A (and scales), on B (its group's B) — not on M, the other rows or groups, padding, the tile the heuristic
    picks, PDL, graph capture or the device's SM count (docs/batch-invariance.md). On, the heuristic never splits K
    and never swaps A and B on its own (the choices that change a row's arithmetic). False: the fast mode, where
    split-K and swap-AB are weighed for each problem (decode shapes of few rows run faster in the cost model, and a
    token's bits then depend on its batch)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__} ({enabled!r})")
    PROCESS_SETTINGS.update(batch_invariant=enabled)


def is_batch_invariant() -> bool:
    """Whether the batch-invariant mode is on (:func:`set_batch_invariant`; True by default)."""
    return PROCESS_SETTINGS.batch_invariant


def _device_num_sms() -> int | None:
    """SM count of the current CUDA device, or None when no CUDA device is visible."""
    if not torch.cuda.is_available():
        return None
    return _num_sms_of_index(torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _num_sms_of_index(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def set_num_sms(num_sms: int) -> None:
    """Limit the persistent kernels to ``num_sms`` SMs (process-wide), as the reference's ``set_num_sms``.

    ``num_sms`` must be an int in ``[0, device SM count]``; 0 means every SM of the device (the default). With no
    CUDA device visible the upper bound is 132 (H100 / H200). Useful to leave SMs to a concurrent communication
    kernel (DeepEP).

    Raises:
        TypeError: not an int. ValueError: outside ``[0, device SM count]``.
    """
    if isinstance(num_sms, bool) or not isinstance(num_sms, int):
        raise TypeError(f"num_sms must be an int, got {type(num_sms).__name__} ({num_sms!r})")
    device_sms = _device_num_sms()
    upper = DEFAULT_NUM_SMS if device_sms is None else device_sms
    if not 0 <= num_sms <= upper:
        where = "the device's" if device_sms is not None else "no CUDA device visible: an H100 / H200's"
        raise ValueError(f"num_sms must be in [0, {upper}] ({where} SM count; 0 = every SM), got {num_sms}")
    PROCESS_SETTINGS.update(num_sms_override=num_sms or None)


def get_num_sms() -> int:
    """SMs the kernels may use: the value given to :func:`set_num_sms`, else the current CUDA device's
    multiprocessor count, else 132 (no CUDA device visible)."""
    override = PROCESS_SETTINGS.num_sms_override
    if override is not None:
        return override
    device_sms = _device_num_sms()
    return device_sms if device_sms is not None else DEFAULT_NUM_SMS


def reset_num_sms() -> None:
    """Forget any :func:`set_num_sms` override: the device's SM count applies again."""
    PROCESS_SETTINGS.update(num_sms_override=None)


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """``1 - 2·Σ(x·y) / Σ(x² + y²)``, computed in float64: 0 for identical tensors, ~7e-4 is normal for
    an FP8 GEMM against a bf16 reference (the reference design's tests accept < 1e-3).

    ``x`` and ``y`` must have the same shape. Two all-zero tensors give 0.0 (not NaN).
    Returns a Python float (synchronises when the tensors are on a GPU).
    """
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise TypeError(f"x and y must be torch.Tensors, got {type(x).__name__} and {type(y).__name__}")
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got x.shape={tuple(x.shape)} y.shape={tuple(y.shape)}")
    x64, y64 = x.double(), y.double()
    denominator = (x64 * x64 + y64 * y64).sum().item()
    if denominator == 0.0:
        return 0.0
    return float(1.0 - 2.0 * (x64 * y64).sum().item() / denominator)
