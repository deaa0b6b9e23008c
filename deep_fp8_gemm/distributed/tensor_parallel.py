"""Tensor-parallel FP8 linears (Megatron-LM semantics) built on :class:`deep_fp8_gemm.nn.FP8Linear`.

A weight ``W [N, K]`` is split over the ``world`` ranks of ``group``:

* :class:`ColumnParallelFP8Linear` — by output features: rank ``r`` holds rows ``[r*N/world, (r+1)*N/world)``
  of ``W`` (and of the bias) and computes those output columns from the full input. ``gather_output=True``
  all-gathers the columns into ``[..., N]``; ``sequence_parallel=True`` first all-gathers the input's tokens
  (dim 0), each rank having passed its ``[T/world, ..., K]`` share.
* :class:`RowParallelFP8Linear` — by input features: rank ``r`` holds columns ``[r*K/world, (r+1)*K/world)``,
  computes a partial ``[..., N]`` from its share of the input (``input_is_parallel=False`` slices the full input
  itself) and the partials are summed by an all-reduce — or, with ``sequence_parallel=True``, a reduce-scatter
  over the tokens (dim 0, ``T`` divisible by ``world``). The bias is added once, after the sum.

The usual pairing (an MLP): column-parallel up-projection without gather -> activation -> row-parallel
down-projection with ``input_is_parallel=True``: one all-reduce per MLP.

Exactness against the single-process :class:`FP8Linear` on the full weight:

* column-parallel: each output column depends only on its weight row, so with ``N/world`` a multiple of 128
  (the weight's 128x128 scale blocks then do not straddle ranks) the result is **bit-identical** (tested);
  otherwise each shard gets its own block scales (a valid, slightly different quantisation).
* row-parallel: each rank's GEMM rounds its partial sum to bf16 (the GEMM contract), then the partials are
  summed in ``reduce_dtype`` (float32 by default: no extra rounding for the sum itself, but twice the bytes
  of Megatron's bf16 all-reduce; pass ``torch.bfloat16`` to match Megatron) and rounded to bf16 once, with
  the bias. So the result differs from the single-GEMM one by about ``world`` bf16 roundings of partials
  (tested: within 2 bf16 ulps of the exact sum of the bf16 partials, calc_diff < 1e-5 against the
  single-process layer). ``K/world`` a multiple of 128 keeps the per-token activation scales and the weight
  blocks identical to the single-process layer.

Bytes per token moved: column-parallel ``2N`` (bf16) when gathering the output, ``2K`` for a sequence-parallel
input gather; row-parallel ``4N`` (fp32) or ``2N`` (bf16) into the all-reduce / reduce-scatter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..nn import FP8Linear, FP8StateModule
from .comm import all_gather_dim0, group_rank, group_size, reduce_scatter_dim0
from .status import agree, collective_device

__all__ = ["ColumnParallelFP8Linear", "RowParallelFP8Linear"]


def _fp8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> FP8Linear:
    """An :class:`FP8Linear` quantised from ``weight [n, k]`` (+ optional bias), through ``from_linear``."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach(), requires_grad=False)
    return FP8Linear.from_linear(linear)


def _split(total: int, world: int, name: str, multiple: int, why: str) -> int:
    """``total / world``, which the local FP8Linear needs to be a multiple of ``multiple`` (``why``); errors quote
    the user's argument and the world size, not the per-rank shard (which the user never wrote)."""
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={total!r}")
    if total % world:
        raise ValueError(f"{name} must be divisible by the group size, got {name}={total} world={world}")
    per_rank = total // world
    if per_rank % multiple:
        raise ValueError(f"{name}={total} over world={world} ranks gives {per_rank} per rank, which must be a multiple "
                         f"of {multiple} ({why}): {name} must be a multiple of world * {multiple} = {world * multiple}")
    return per_rank


def _check_linear(linear: object) -> nn.Linear:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
    return linear


def _check_tokens(x: torch.Tensor, world: int, name: str) -> None:
    if x.dim() < 2 or x.shape[0] % world:
        raise ValueError(f"{name} needs x [T, ..., features] with T divisible by world={world} (sequence "
                         f"parallelism splits dim 0), got x.shape={tuple(x.shape)}")


_REDUCE_DTYPES = (torch.float32, torch.bfloat16)


def _linear_sizes(linear: object) -> dict[str, int]:
    """The sizes of an ``nn.Linear`` the ranks must agree on (zeros for anything else: its check has failed)."""
    if not isinstance(linear, nn.Linear):
        return {"in_features": 0, "out_features": 0, "bias": 0}
    return {"in_features": linear.in_features, "out_features": linear.out_features, "bias": linear.bias is not None}


def _agree(what: str, group, device, error: BaseException | None, **fields) -> None:
    """Every rank of ``group`` makes the layer together: agree on its sizes and flags (one fixed-size collective),
    so that a rank that disagrees or whose arguments are wrong makes every rank raise here, not hang or crash in
    the first forward's collective (:func:`.status.agree`)."""
    agree(what, fields, group, collective_device(group, device if error is None else None), error)


def _from_linear(cls, linear, group, setup, load, **options):
    """``cls.from_linear``: a module of ``cls`` set up (``setup(module, linear)``) and loaded with this rank's share of
    a full ``nn.Linear`` (``load(module, linear)``, without autograd); every rank agrees on the sizes and ``options``
    (and raises together) before any returns."""
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    group_size(group)
    error = None
    try:
        linear = _check_linear(linear)
        setup(module, linear)
        with torch.no_grad():
            load(module, linear)
    except (TypeError, ValueError, RuntimeError) as exc:  # raised by every rank, after the agreement
        error = exc
    _agree(f"{cls.__name__}.from_linear", group, None, error, **_linear_sizes(linear), **options)
    return module


class ColumnParallelFP8Linear(nn.Module):
    """``y = x · Wᵀ + b`` with ``W``'s output features split over the ranks (module docstring).

    Args:
        in_features: ``K`` (multiple of 16). out_features: ``N``; ``N / world`` must be a multiple of 8.
        bias: hold this rank's ``[N/world]`` share of a bias.
        gather_output: all-gather the output features (``[..., N]``); else return this rank's ``[..., N/world]``.
        sequence_parallel: the input is this rank's share of the tokens (dim 0); all-gather it first.
        group: the tensor-parallel process group (``None``: the world). device: where the weights live.

    Submodule ``linear``: the local :class:`FP8Linear` ``[N/world, K]``. Every rank must call :meth:`forward`
    together when it communicates (``gather_output`` or ``sequence_parallel``). Inference only.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, gather_output: bool = False,
                 sequence_parallel: bool = False, group: dist.ProcessGroup | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        group_size(group)  # torch.distributed initialised (else RuntimeError on this rank: no one to agree with)
        error = None
        try:
            self._setup(in_features, out_features, gather_output, sequence_parallel, group)
            self.linear = FP8Linear(in_features, self.out_features_per_rank, bias, device=device)
        except (TypeError, ValueError, RuntimeError) as exc:  # raised by every rank, after the agreement
            error = exc
        _agree("ColumnParallelFP8Linear", group, device, error, in_features=in_features, out_features=out_features,
               bias=bias, gather_output=gather_output, sequence_parallel=sequence_parallel)

    def _setup(self, in_features, out_features, gather_output, sequence_parallel, group) -> None:
        self.group, self.world, self.rank = group, group_size(group), group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.out_features_per_rank = _split(out_features, self.world, "out_features", 8,
                                            "16-byte bf16 output rows of each rank's FP8Linear")
        self.gather_output, self.sequence_parallel = bool(gather_output), bool(sequence_parallel)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, gather_output: bool = False, sequence_parallel: bool = False,
                    group: dist.ProcessGroup | None = None) -> ColumnParallelFP8Linear:
        """Keeps (and quantises) this rank's rows of a full ``nn.Linear``'s weight and bias."""
        def load(module, linear) -> None:
            rows = slice(module.rank * module.out_features_per_rank, (module.rank + 1) * module.out_features_per_rank)
            module.linear = _fp8_linear(linear.weight[rows], None if linear.bias is None else linear.bias[rows])

        return _from_linear(cls, linear, group, lambda module, linear: module._setup(
            linear.in_features, linear.out_features, gather_output, sequence_parallel, group), load,
            gather_output=gather_output, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., K]`` bf16 (``[T/world, ..., K]`` with ``sequence_parallel``) -> ``[..., N]`` bf16
        (``gather_output``) or ``[..., N/world]``."""
        if self.sequence_parallel:  # every rank must pass the same number of tokens (not checkable locally)
            if x.dim() < 2:
                raise ValueError(f"sequence_parallel needs x [T_local, ..., K], got x.shape={tuple(x.shape)}")
            x = all_gather_dim0(x, self.group)
        y = self.linear(x)
        if not self.gather_output:
            return y
        # [world * rows, n_local] gathered by rank -> columns of rank r at [r*n_local, (r+1)*n_local).
        rows = y.reshape(-1, self.out_features_per_rank)
        gathered = all_gather_dim0(rows, self.group).view(self.world, rows.shape[0], self.out_features_per_rank)
        return gathered.permute(1, 0, 2).reshape(*y.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} ({self.out_features_per_rank} "
                f"on rank {self.rank} of {self.world}), gather_output={self.gather_output}, "
                f"sequence_parallel={self.sequence_parallel}")


class RowParallelFP8Linear(FP8StateModule):
    """``y = x · Wᵀ + b`` with ``W``'s input features split over the ranks (module docstring).

    Args:
        in_features: ``K``; ``K / world`` must be a multiple of 16. out_features: ``N`` (multiple of 8).
        bias: hold a full ``[N]`` bias, added once after the reduction (identical on every rank).
        input_is_parallel: the input is already this rank's ``[..., K/world]`` share (e.g. the output of a
            column-parallel layer); else the full ``[..., K]`` input is sliced here.
        sequence_parallel: reduce-scatter the result over the tokens (dim 0) instead of all-reducing it.
        reduce_dtype: dtype of the summed partials, ``torch.float32`` (default) or ``torch.bfloat16``.
        group: the tensor-parallel process group (``None``: the world). device: where the weights live.

    Submodule ``linear``: the local bias-free :class:`FP8Linear` ``[N, K/world]``; buffer-like parameter
    ``bias`` ``[N]`` bf16 or None (kept bf16 under dtype casts, like the FP8 state of ``linear``:
    :class:`deep_fp8_gemm.nn.FP8StateModule`). Every rank must call :meth:`forward` together. Inference only.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, input_is_parallel: bool = True,
                 sequence_parallel: bool = False, reduce_dtype: torch.dtype = torch.float32,
                 group: dist.ProcessGroup | None = None, device: torch.device | str | None = None):
        super().__init__()
        group_size(group)
        error = None
        try:
            self._setup(in_features, out_features, input_is_parallel, sequence_parallel, reduce_dtype, group)
            self.linear = FP8Linear(self.in_features_per_rank, out_features, bias=False, device=device)
        except (TypeError, ValueError, RuntimeError) as exc:  # raised by every rank, after the agreement
            error = exc
        _agree("RowParallelFP8Linear", group, device, error, in_features=in_features, out_features=out_features,
               bias=bias, input_is_parallel=input_is_parallel, sequence_parallel=sequence_parallel,
               reduce_dtype=_REDUCE_DTYPES.index(reduce_dtype) if reduce_dtype in _REDUCE_DTYPES else -1)
        if bias:
            bound = 1.0 / in_features ** 0.5
            b = torch.empty(out_features, dtype=torch.bfloat16, device=device).uniform_(-bound, bound)
            dist.broadcast(b, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
            self.bias = nn.Parameter(b, requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def _setup(self, in_features, out_features, input_is_parallel, sequence_parallel, reduce_dtype, group) -> None:
        if reduce_dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"reduce_dtype must be torch.float32 or torch.bfloat16, got {reduce_dtype=}")
        self.group, self.world, self.rank = group, group_size(group), group_rank(group)
        self.in_features, self.out_features = in_features, out_features
        self.in_features_per_rank = _split(in_features, self.world, "in_features", 16,
                                           "16-byte fp8 rows of each rank's FP8Linear")
        self.input_is_parallel, self.sequence_parallel = bool(input_is_parallel), bool(sequence_parallel)
        self.reduce_dtype = reduce_dtype

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, input_is_parallel: bool = True, sequence_parallel: bool = False,
                    reduce_dtype: torch.dtype = torch.float32,
                    group: dist.ProcessGroup | None = None) -> RowParallelFP8Linear:
        """Keeps (and quantises) this rank's columns of a full ``nn.Linear``'s weight; the bias is kept whole."""
        def load(module, linear) -> None:
            cols = slice(module.rank * module.in_features_per_rank, (module.rank + 1) * module.in_features_per_rank)
            module.linear = _fp8_linear(linear.weight[:, cols], None)
            if linear.bias is None:
                module.register_parameter("bias", None)
            else:
                module.bias = nn.Parameter(linear.bias.detach().to(torch.bfloat16).clone(), requires_grad=False)

        return _from_linear(cls, linear, group, lambda module, linear: module._setup(
            linear.in_features, linear.out_features, input_is_parallel, sequence_parallel, reduce_dtype, group), load,
            input_is_parallel=input_is_parallel, sequence_parallel=sequence_parallel,
            reduce_dtype=_REDUCE_DTYPES.index(reduce_dtype) if reduce_dtype in _REDUCE_DTYPES else -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., K/world]`` (``input_is_parallel``) or ``[..., K]`` bf16 -> ``[..., N]`` bf16, or this rank's
        ``[T/world, ..., N]`` with ``sequence_parallel``."""
        if not self.input_is_parallel:
            if x.dim() < 1 or x.shape[-1] != self.in_features:
                raise ValueError(f"x must be [..., in_features={self.in_features}] (input_is_parallel=False), "
                                 f"got x.shape={tuple(x.shape)}")
            lo = self.rank * self.in_features_per_rank
            x = x[..., lo:lo + self.in_features_per_rank]
        if self.sequence_parallel:
            _check_tokens(x, self.world, "sequence_parallel")
        partial = self.linear(x).to(self.reduce_dtype)
        if self.sequence_parallel:
            total = reduce_scatter_dim0(partial, self.group)
        else:
            total = partial.contiguous()
            dist.all_reduce(total, group=self.group)
        if self.bias is not None:
            return (total.float() + self.bias.float()).to(torch.bfloat16)
        return total.to(torch.bfloat16)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} ({self.in_features_per_rank} on rank {self.rank} of {self.world}), "
                f"out_features={self.out_features}, bias={self.bias is not None}, "
                f"input_is_parallel={self.input_is_parallel}, sequence_parallel={self.sequence_parallel}, "
                f"reduce_dtype={self.reduce_dtype}")
