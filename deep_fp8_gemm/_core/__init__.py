"""Internal machinery shared by the op families (not public API; names here may change between versions).

* :mod:`.checks` — argument-check primitives (``TypeError`` / ``ValueError`` naming the argument and values).
* :mod:`.reference_math` — the dequantise-and-multiply math every exact reference is built from.
* :mod:`.dispatch` — the eager-call test, operand unpacking and scale normalisation the op entry points share.
* :mod:`.family` — :class:`~.family.GemmFamily`, the record each GEMM family module fills in, and the one
  ``torch.library`` registration helper.
* :mod:`.plans` — the per-call fast path: plans cached per tensor signature, :class:`~.plans.PreparedGemm`.
"""
