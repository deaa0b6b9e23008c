"""The BF16 GEMM kernels (issue 41, ``kernels/bf16_gemm.py``) on an sm_90 device at model sizes (marked ``gpu``:
skipped, with the reason, anywhere else), and, on the CPU, the legality of every case they launch.

On the GPU: every form (dense in the four majors with bf16 D and fp32 D += C, m-grouped contiguous and masked,
batched einsum bhd,hdr->bhr and bhr,hdr->bhd on permuted views, the reduce form bmk,bnk->mn) against torch's float32
matmul of the same bf16 values (TF32 off): calc_diff <= 1e-5 with bf16 D, <= 1e-6 with fp32 D, and a second call
bitwise equal to the first.

The cases are a module-level table (``GPU_CASE_TABLES``); ``test_gpu_cases_are_legal_on_the_cpu`` runs each through
the config rules, every tensor map's encode rules (``TensorMapSpec.validate``) and the driver layer's launch-shape
rules, so an illegal GPU case fails here, not only on the rare GPU run.
"""

from __future__ import annotations

import pytest
import torch

from deep_fp8_gemm.kernels import bf16_gemm as bg
from deep_fp8_gemm.kernels.bf16_gemm import Bf16Form as F
from deep_fp8_gemm.runtime import driver as drv
from deep_fp8_gemm.runtime.target import Backend
from deep_fp8_gemm.runtime.tensor_map import TensorMapSpec
from deep_fp8_gemm.utils import calc_diff

NUM_SMS = 132
# (name, form, shape dict): DeepSeek-V3-sized dense GEMMs in the four layouts, fp32 D += C (wgrad-like), MoE grouped
# forms with 8 experts, MLA's per-head absorptions (h 128, d 128, r 512) and a 4-way reduce.
CASES = [
    ("nt", F.DENSE, dict(m=4096, n=7168, k=2048, major_a="k", major_b="k", out="bf16")),
    ("nn", F.DENSE, dict(m=4096, n=2112, k=7168, major_a="k", major_b="mn", out="bf16")),
    ("tn", F.DENSE, dict(m=2048, n=7168, k=4096, major_a="mn", major_b="mn", out="fp32", acc=True)),
    ("tt", F.DENSE, dict(m=1536, n=4096, k=7168, major_a="mn", major_b="k", out="fp32", acc=True)),
    ("contiguous", F.M_GROUPED_CONTIGUOUS, dict(groups=8, m=1000, n=4096, k=7168)),
    ("masked", F.M_GROUPED_MASKED, dict(groups=8, m=256, n=4096, k=7168)),
    ("bhd,hdr->bhr", F.BATCHED, dict(b=2048, h=128, d=128, r=512)),
    ("bhr,hdr->bhd", F.BATCHED, dict(b=2048, h=128, d=128, r=512)),
    ("bmk,bnk->mn", F.BATCHED_REDUCE, dict(s=4, m=2048, n=2048, k=4096)),
]
GPU_CASE_TABLES = (CASES,)


def _bf16(shape, device: str, fill: bool, seed: int) -> torch.Tensor:
    if not fill:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=g, device=device).to(torch.bfloat16)


def build(case, device: str, fill: bool):
    """``(config, a, b, d, c, kwargs, reference)`` of a case in the kernel's orientation; ``reference()`` is torch's
    float32 result of the same values (None when not ``fill``: the CPU legality check only needs shapes)."""
    name, form, s = case
    out_dtype = torch.float32 if s.get("out") == "fp32" or form is F.BATCHED_REDUCE else torch.bfloat16
    acc = s.get("acc", form is F.BATCHED_REDUCE)
    kw, batches = {}, 1
    if form is F.DENSE:
        m, n, k = s["m"], s["n"], s["k"]
        a = _bf16((m, k), device, fill, 1) if s["major_a"] == "k" else _bf16((k, m), device, fill, 1).T
        b = _bf16((n, k), device, fill, 2) if s["major_b"] == "k" else _bf16((k, n), device, fill, 2).T
        d = torch.zeros(m, n, dtype=out_dtype, device=device)
        ref = lambda c0: a.float() @ b.float().T + (c0.float() if c0 is not None else 0)  # noqa: E731
        major_a, major_b = s["major_a"], s["major_b"]
    elif form in (F.M_GROUPED_CONTIGUOUS, F.M_GROUPED_MASKED):
        g, m, n, k = s["groups"], s["m"], s["n"], s["k"]
        major_a = major_b = "k"
        b = _bf16((g, n, k), device, fill, 2)
        batches = g
        if form is F.M_GROUPED_CONTIGUOUS:
            rows = -(-m // 128) * 128
            layout = torch.full((g * rows,), -1, dtype=torch.int32)
            for e in range(g):
                layout[e * rows:e * rows + m - 37 * e] = e  # ragged groups, padded to 128 rows
            kw["grouped_layout"] = layout.to(device)
            a = _bf16((g * rows, k), device, fill, 1)
            d = torch.zeros(g * rows, n, dtype=out_dtype, device=device)
            m = g * rows

            def ref(_):
                out = torch.zeros_like(d, dtype=torch.float32)
                for e in range(g):
                    rows_e = kw["grouped_layout"] == e
                    out[rows_e] = a[rows_e].float() @ b[e].float().T
                return out, kw["grouped_layout"] >= 0
        else:
            kw["masked_m"] = torch.tensor([(m * (e + 1)) // g - 3 * e for e in range(g)], dtype=torch.int32,
                                          device=device)
            a = _bf16((g, m, k), device, fill, 1)
            d = torch.zeros(g, m, n, dtype=out_dtype, device=device)

            def ref(_):
                valid = torch.arange(m, device=device)[None, :] < kw["masked_m"][:, None]
                return torch.bmm(a.float(), b.float().transpose(1, 2)), valid
    elif form is F.BATCHED:
        bsz, h, dd, r = s["b"], s["h"], s["d"], s["r"]
        major_a = "k"
        if name == "bhd,hdr->bhr":
            x, w = _bf16((bsz, h, dd), device, fill, 1), _bf16((h, dd, r), device, fill, 2)
            a, b, major_b, out = x.permute(1, 0, 2), w.transpose(1, 2), "mn", torch.zeros(bsz, h, r, device=device)
        else:
            x, w = _bf16((bsz, h, r), device, fill, 1), _bf16((h, dd, r), device, fill, 2)
            a, b, major_b, out = x.permute(1, 0, 2), w, "k", torch.zeros(bsz, h, dd, device=device)
        out = out.to(out_dtype)
        d, batches, m, n, k = out.permute(1, 0, 2), h, a.shape[1], b.shape[1], a.shape[2]
        ref = lambda _: torch.einsum(name, x.float(), w.float())  # noqa: E731
    else:
        sb, m, n, k = s["s"], s["m"], s["n"], s["k"]
        major_a = major_b = "k"
        a, b = _bf16((sb, m, k), device, fill, 1), _bf16((sb, n, k), device, fill, 2)
        d, batches = torch.zeros(m, n, dtype=out_dtype, device=device), sb
        ref = lambda c0: c0.float() + torch.einsum("bmk,bnk->mn", a.float(), b.float())  # noqa: E731
    c = None
    if acc:
        c = (_bf16(tuple(d.shape), device, fill, 3).to(out_dtype))
    config = bg.pick_config(form, m, n, k, batches, major_a, major_b, out_dtype, acc, NUM_SMS)
    return config, a, b, d, c, kw, ref


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_gpu_bf16_forms(case):
    torch.backends.cuda.matmul.allow_tf32 = False
    config, a, b, d, c, kw, ref = build(case, "cuda", True)
    c0 = None if c is None else c.clone()
    bg.launch(config, a, b, d, c, backend=Backend.CUDA, **kw)
    expected = ref(c0)
    valid = None
    if isinstance(expected, tuple):
        expected, valid = expected
    out = d.permute(1, 0, 2) if case[1] is F.BATCHED else d
    got = out if valid is None else out[valid]
    assert calc_diff(got, expected if valid is None else expected[valid]) <= (1e-6 if d.dtype == torch.float32 else
                                                                              1e-5)
    again = torch.empty_like(d)
    bg.launch(config, a, b, again, c0, backend=Backend.CUDA, **kw)
    again = again.permute(1, 0, 2) if case[1] is F.BATCHED else again
    assert torch.equal(got, again if valid is None else again[valid])


# ---------------------------------------------------------------------------------------------- on the CPU
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_gpu_cases_are_legal_on_the_cpu(case):
    """Each GPU case's config, tensor maps and launch shape on uninitialised CPU stand-ins of its tensors."""
    config, a, b, d, c, kw, _ = build(case, "cpu", False)
    for spec in (bg.operand_map_args(a, "a", config.major_a, config.block_m),
                 bg.operand_map_args(b, "b", config.major_b, config.block_n)):
        TensorMapSpec(*spec).validate()
    assert config.smem_bytes() <= bg.SMEM_LIMIT
    drv._launch_config(NUM_SMS, config.num_threads, 1, config.smem_bytes(), 0)
