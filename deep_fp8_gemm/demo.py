"""``python -m deep_fp8_gemm demo``: one DeepSeek-V3 layer's FP8 GEMMs, end to end.

On an sm_90 GPU: runs the layer's six dense projections at M=128 (``--m``), one MoE contiguous grouped call
(8 experts x 512 tokens, N=4096, K=7168) and one masked call (8 groups, ~64 of 128 rows each, N=7168,
K=2048); checks each against :mod:`deep_fp8_gemm.reference` (``calc_diff < 1e-3``) and prints a table
against block-scaled cuBLAS (``torch._scaled_mm``; grouped: a loop of it over experts).

Without one: compiles and audits (registers, spills, SASS) the kernels those calls would use, runs the same
math through the CPU reference at reduced sizes against a float64 einsum, and says what it could not run.
Quick timing only (median of 30 CUDA-event timings, L2 flushed); ``bench/`` has the full method.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from . import env, ops, reference
from .quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from .utils import calc_diff, get_col_major_tma_aligned_tensor

# DeepSeek-V3's dense projections (N, K): fused q_a+kv_a, q_b, kv_b, o_proj, shared-expert gate+up and down.
LAYER_DENSE = ((2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048))
MOE_CONTIGUOUS = {"num_groups": 8, "m_per_group": 512, "n": 4096, "k": 7168}   # routed experts' gate+up, prefill
MOE_MASKED = {"num_groups": 8, "m_max": 128, "expected_m": 64, "n": 7168, "k": 2048}  # experts' down, decode
THRESHOLD = 1e-3
NUM_SMS = 132
NOT_RUN = "no sm_90 GPU: kernels compiled and audited, not executed on a GPU"


def _print_env() -> tuple[bool, str]:
    """Prints versions; returns (sm_90 GPU present, description)."""
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    sm90, gpu = False, "no GPU (torch sees no CUDA device)"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        gpu = f"{torch.cuda.get_device_name()} (sm_{major}{minor})"
        sm90 = (major, minor) == (9, 0)
        if not sm90:
            gpu += ": not sm_90, the kernels need a Hopper GPU"
    print(f"GPU: {gpu}")
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        print(f"NVRTC {major}.{minor}")
    except Exception as exc:  # noqa: BLE001 - informational
        print(f"NVRTC: not importable ({type(exc).__name__}: {str(exc)[:100]})")
    print(f"JIT cache: {env.jit_cache_dir()}")
    return sm90, gpu


# --- inputs -----------------------------------------------------------------------------------------------

def _quant_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block quantisation of ``[n, k]`` or ``[G, n, k]`` weights."""
    if w.dim() == 2:
        return per_block_cast_to_fp8(w)
    pairs = [per_block_cast_to_fp8(wg) for wg in w]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _quant_acts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, sa = per_token_cast_to_fp8(x.reshape(-1, x.size(-1)))
    return a.view(x.shape), sa.view(*x.shape[:-1], sa.size(-1))


def _contiguous_layout(counts: Sequence[int], device) -> torch.Tensor:
    """m_indices for experts with ``counts`` rows, each segment padded to 128 rows with -1."""
    parts = []
    for g, c in enumerate(counts):
        seg = max(128, -(-c // 128) * 128)
        parts += [torch.full((c,), g, dtype=torch.int32), torch.full((seg - c,), -1, dtype=torch.int32)]
    return torch.cat(parts).to(device)


def make_calls(m: int, device, scale: int = 1, m_moe: int | None = None) -> list[dict]:
    """The layer's GEMM calls. ``scale`` > 1 divides N and K down to multiples of 128 (CPU sizes), keeping
    any partial 128-block (2112 -> 320 for scale 8)."""

    def red(x: int) -> int:
        return x if scale == 1 else max(128, (x // scale) // 128 * 128) + x % 128

    gen = torch.Generator(device=device).manual_seed(0)
    calls = []
    for n, k in LAYER_DENSE:
        n, k = red(n), red(k)
        x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
        w = torch.randn(n, k, device=device, generator=gen).to(torch.bfloat16)
        a, sa = _quant_acts(x)
        b, sb = _quant_weights(w)
        calls.append({"kind": "dense", "label": f"dense m={m} n={n} k={k}", "a": a, "sa": sa, "b": b, "sb": sb,
                      "valid_m": m, "n": n, "k": k})
    # MoE contiguous: expert sizes vary around m_per_group (some not multiples of 128: padding rows).
    c = MOE_CONTIGUOUS
    n, k, g = red(c["n"]), red(c["k"]), c["num_groups"]
    base = m_moe or c["m_per_group"]
    counts = [max(0, int(base * f)) for f in (1.0, 0.75, 1.25, 0.5, 1.1, 0.9, 0.0, 1.5)][:g]
    m_indices = _contiguous_layout(counts, device)
    x = torch.randn(m_indices.numel(), k, device=device, generator=gen).to(torch.bfloat16)
    a, sa = _quant_acts(x)
    b, sb = _quant_weights(torch.randn(g, n, k, device=device, generator=gen).to(torch.bfloat16))
    calls.append({"kind": "contiguous", "label": f"MoE contiguous G={g} m~{base} n={n} k={k}", "a": a, "sa": sa,
                  "b": b, "sb": sb, "m_indices": m_indices, "counts": counts, "valid_m": sum(counts), "n": n, "k": k})
    # MoE masked: each group has a different number of valid rows around expected_m.
    c = MOE_MASKED
    n, k, g = red(c["n"]), red(c["k"]), c["num_groups"]
    m_max = c["m_max"] if scale == 1 else max(16, c["m_max"] // scale)
    expected = max(1, m_max // 2)
    counts = [min(m_max, max(0, int(expected * f))) for f in (1.0, 0.5, 1.5, 0.0, 2.0, 0.8, 1.2, 0.9)][:g]
    a, sa = _quant_acts(torch.randn(g, m_max, k, device=device, generator=gen).to(torch.bfloat16))
    b, sb = _quant_weights(torch.randn(g, n, k, device=device, generator=gen).to(torch.bfloat16))
    calls.append({"kind": "masked", "label": f"MoE masked G={g} m~{expected} (max {m_max}) n={n} k={k}", "a": a,
                  "sa": sa, "b": b, "sb": sb, "masked_m": torch.tensor(counts, dtype=torch.int32, device=device),
                  "counts": counts, "expected_m": expected, "valid_m": sum(counts), "n": n, "k": k})
    return calls


def _out_for(call: dict) -> torch.Tensor:
    a = call["a"]
    return torch.full((*a.shape[:-1], call["n"]), float("nan"), dtype=torch.bfloat16, device=a.device)


def _valid(call: dict, out: torch.Tensor) -> torch.Tensor:
    """The rows of ``out`` the op defines, as ``[rows, n]``."""
    if call["kind"] == "contiguous":
        return out[call["m_indices"] >= 0]
    if call["kind"] == "masked":
        return torch.cat([out[g, :c] for g, c in enumerate(call["counts"])])
    return out


def run_call(call: dict, module, sa=None, out=None) -> torch.Tensor:
    """``module``'s op (:mod:`deep_fp8_gemm.ops` or :mod:`deep_fp8_gemm.reference`) on ``call``, into ``out``
    (a new NaN-filled tensor when None); returns the output."""
    out = _out_for(call) if out is None else out
    lhs, rhs = (call["a"], call["sa"] if sa is None else sa), (call["b"], call["sb"])
    if call["kind"] == "dense":
        module.gemm_fp8_fp8_bf16_nt(lhs, rhs, out)
    elif call["kind"] == "contiguous":
        module.m_grouped_gemm_fp8_fp8_bf16_nt_contiguous(lhs, rhs, out, call["m_indices"])
    else:
        module.m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, call["masked_m"], call["expected_m"])
    return out


def float64_einsum(call: dict) -> torch.Tensor:
    """Valid rows of the exact product of the dequantised operands, computed independently in float64."""
    def deq_a(a, sa):
        return a.double() * sa.double().repeat_interleave(128, -1)[..., : a.size(-1)]

    def deq_b(b, sb):
        n, k = b.shape[-2:]
        return b.double() * sb.double().repeat_interleave(128, -2)[..., :n, :].repeat_interleave(128, -1)[..., :k]

    a, b = deq_a(call["a"], call["sa"]), deq_b(call["b"], call["sb"])
    if call["kind"] == "dense":
        return torch.einsum("mk,nk->mn", a, b)
    if call["kind"] == "contiguous":  # per expert: a gather of B per row would be rows x n x k float64
        idx = call["m_indices"].long()
        rows = idx >= 0
        out = torch.empty(int(rows.sum()), b.shape[-2], dtype=torch.float64, device=a.device)
        for g in range(b.shape[0]):
            mine = idx[rows] == g
            out[mine] = a[rows][mine] @ b[g].T
        return out
    return torch.cat([torch.einsum("mk,nk->mn", a[g, :c], b[g]) for g, c in enumerate(call["counts"])])


# --- GPU path -----------------------------------------------------------------------------------------------

def _time_us(fn: Callable[[], object], flush: torch.Tensor, runs: int = 30) -> float:
    """Median µs of ``runs`` calls, each after an L2 flush (``flush.zero_()``); CUDA events on a GPU,
    wall clock on the CPU (a code-path check only)."""
    fn()
    if not flush.is_cuda:
        samples = []
        for _ in range(runs):
            flush.zero_()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def _cublas(call: dict) -> Callable[[], list[torch.Tensor]] | None:
    """Block-scaled ``torch._scaled_mm`` over the call's valid rows (a loop over groups), or None."""
    def prep(a, sa, b, sb):
        m = a.size(0)
        m4 = -(-max(m, 1) // 4) * 4  # cuBLAS block scaling needs M % 4 == 0: pad with zero rows
        if m4 != m:
            a = torch.cat([a, a.new_zeros(m4 - m, a.size(1))])
            sa = torch.cat([sa, sa.new_ones(m4 - m, sa.size(1))])
        return a.contiguous(), b.t(), sa.t().contiguous().t(), sb.contiguous().t(), m

    if call["kind"] == "dense":
        parts = [prep(call["a"], call["sa"], call["b"], call["sb"])]
    elif call["kind"] == "contiguous":
        idx, parts = call["m_indices"], []
        for g, c in enumerate(call["counts"]):
            if c:
                rows = torch.nonzero(idx == g).squeeze(1)
                # Gather the e4m3 rows through a uint8 view: CUDA advanced indexing ("index_cuda") is not
                # implemented for float8 dtypes, and this runs outside fn()'s try below.
                a_rows = call["a"].view(torch.uint8).index_select(0, rows).view(call["a"].dtype)
                parts.append(prep(a_rows, call["sa"][rows], call["b"][g], call["sb"][g]))
    else:
        parts = [prep(call["a"][g, :c], call["sa"][g, :c], call["b"][g], call["sb"][g])
                 for g, c in enumerate(call["counts"]) if c]

    def fn():
        return [torch._scaled_mm(a, bt, s_a, s_b, out_dtype=torch.bfloat16)[:m] for a, bt, s_a, s_b, m in parts]

    try:
        fn()
        if call["a"].is_cuda:
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - unsupported here: reported as n/a
        return None
    return fn


def gpu_demo(m: int, device: str = "cuda", scale: int = 1) -> int:
    """The GPU path. ``device="cpu"`` with ``scale`` > 1 runs the same code on reduced CPU sizes (the ops
    then run the reference): only for testing this function."""
    print(f"\nRunning one DeepSeek-V3 layer's GEMMs on {device} (M={m}; quick timing: median of 30, L2 flushed)")
    calls = make_calls(m, device, scale=scale, m_moe=None if scale == 1 else 48)
    flush_bytes = 256 << 20 if device == "cuda" else 1 << 20  # 256 MiB > 60 MB L2
    flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device)
    runs = 30 if device == "cuda" else 2
    head = f"{'call':<44}{'µs':>9}{'TFLOPS':>8}{'cuBLAS µs':>11}{'speedup':>9}{'calc_diff':>11}  check"
    print(head + "\n" + "-" * len(head))
    failures = 0
    for call in calls:
        sa_tma = get_col_major_tma_aligned_tensor(call["sa"])
        try:
            out = run_call(call, ops, sa=sa_tma)
            cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in call.items()}
            ref = _valid(cpu, run_call(cpu, reference))
            diff = calc_diff(_valid(call, out).float().cpu(), ref.float())
            ok = diff < THRESHOLD
            us = _time_us(lambda: run_call(call, ops, sa=sa_tma, out=out), flush, runs) if ok else None
        except Exception as exc:  # noqa: BLE001 - report and continue with the next call
            print(f"{call['label']:<44}  error: {type(exc).__name__}: {str(exc)[:200]}")
            failures += 1
            continue
        failures += not ok
        base = _cublas(call)
        base_us = None
        if base is not None:
            base_ok = calc_diff(torch.cat(base()).float().cpu(), ref.float()) < THRESHOLD
            base_us = _time_us(base, flush, runs) if base_ok else None
        flops = 2 * call["valid_m"] * call["n"] * call["k"]
        cells = [f"{us:9.1f}" if us else f"{'-':>9}", f"{flops / us / 1e6:8.0f}" if us else f"{'-':>8}",
                 f"{base_us:11.1f}" if base_us else f"{'-':>11}",
                 f"{base_us / us:8.2f}x" if (us and base_us) else f"{'-':>9}"]
        print(f"{call['label']:<44}{''.join(cells)}{diff:11.1e}  {'ok' if ok else 'FAIL'}")
    print("\ncuBLAS = torch._scaled_mm with the same 1x128 / 128x128 block scales ('-': unsupported or wrong here)")
    print("all results match the reference" if not failures else f"{failures} call(s) FAILED")
    return 0 if not failures else 1


# --- no-GPU path --------------------------------------------------------------------------------------------

def audit_layer(m: int) -> tuple[str, list[dict] | None]:
    """Compiles and audits the kernels of the layer's calls; returns (message, records or None)."""
    try:
        from .kernels.targets import audit_targets
        from .runtime.audit import audit, format_table
    except Exception as exc:  # noqa: BLE001 - the JIT may be unavailable; the reference part still runs
        return f"kernel audit unavailable ({type(exc).__name__}: {exc}); kernels neither compiled nor executed", None
    c, k = MOE_CONTIGUOUS, MOE_MASKED
    targets = audit_targets("dense", LAYER_DENSE, [m], NUM_SMS)
    targets += audit_targets("contiguous", [(c["n"], c["k"])], [c["m_per_group"]], NUM_SMS, c["num_groups"])
    targets += audit_targets("masked", [(k["n"], k["k"])], [k["expected_m"]], NUM_SMS, k["num_groups"])
    print(f"compiling + auditing {len(targets)} sm_90a kernels for {NUM_SMS} SMs (cached compiles are fast):",
          flush=True)
    records = audit(targets, progress=True)
    print(format_table(records))
    bad = [r for r in records if not r["ok"]]
    return (NOT_RUN if not bad else f"{NOT_RUN}; {len(bad)} kernel(s) FAILED the audit"), records


def cpu_demo(m: int, do_audit: bool, reduce: int = 8, do_simulate: bool = True) -> int:
    status = 0
    message = "kernels not compiled (--no-audit); not executed: no sm_90 GPU"
    if do_audit:
        print("\n1. Kernels for one DeepSeek-V3 layer (dense at M=%d, MoE contiguous and masked)" % m)
        message, records = audit_layer(m)
        if records is not None and not all(r["ok"] for r in records):
            status = 1
    print(f"\n2. The same math through the CPU reference at reduced sizes (M=16, N and K divided by {reduce}), "
          "against a float64 einsum")
    calls = make_calls(16, "cpu", scale=reduce, m_moe=48)
    head = f"{'call':<48}{'rows':>6}{'calc_diff':>11}{'max |err| / max |ref|':>24}  check"
    print(head + "\n" + "-" * len(head))
    for call in calls:
        out = _valid(call, run_call(call, reference)).double()
        exact = float64_einsum(call)
        diff = calc_diff(out, exact)
        rel = ((out - exact).abs().max() / exact.abs().max().clamp(min=1e-30)).item() if exact.numel() else 0.0
        ok = diff < THRESHOLD and rel < 2 ** -7  # bf16 output: within a couple of ulps of the largest value
        status |= not ok
        print(f"{call['label']:<48}{call['valid_m']:>6}{diff:11.1e}{rel:24.1e}  {'ok' if ok else 'FAIL'}")
    if do_simulate:
        status |= simulate_calls(calls)
    print(f"\n{message}.")
    print("Run this on an H100/H200 (sm_90) to execute the kernels, or `bash bench/device_check.sh OUTDIR`.")
    return status


def simulate_calls(calls: list[dict]) -> int:
    """The real kernels (same source as the GPU's), executed by the CPU simulator on one call of each kind."""
    print("\n3. The real kernels executed by the CPU simulator (DFG_SIMULATE=1, 4 simulated SMs), same calls")
    head = f"{'call':<48}{'rows':>6}{'calc_diff':>11}  {'seconds':>8}  check"
    print(head + "\n" + "-" * len(head))
    status = 0
    picked = [next(c for c in calls if c["kind"] == kind) for kind in ("dense", "contiguous", "masked")]
    saved = {k: os.environ.get(k) for k in ("DFG_SIMULATE", "DFG_SIM_NUM_SMS")}
    os.environ.update(DFG_SIMULATE="1", DFG_SIM_NUM_SMS="4")
    try:
        for call in picked:
            start = time.perf_counter()
            out = _valid(call, run_call(call, ops)).double()
            diff = calc_diff(out, float64_einsum(call))
            ok = diff < THRESHOLD and not out.isnan().any()
            status |= not ok
            print(f"{call['label']:<48}{call['valid_m']:>6}{diff:11.1e}  {time.perf_counter() - start:8.1f}  "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return status


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def check_memory(reduce: int) -> None:
    """``ValueError`` when the no-GPU path's float64 check at ``--reduce`` needs more memory than this machine has
    (its largest operand: the dequantised B of a grouped call, G x N x K float64, a few times over), naming the
    smallest ``--reduce`` that fits."""
    def need(r: int) -> int:
        calls_b = [(c["num_groups"], c["n"], c["k"]) for c in (MOE_CONTIGUOUS, MOE_MASKED)] + [(1, n, k) for n, k in
                                                                                           LAYER_DENSE]
        red = (lambda x: x if r == 1 else max(128, (x // r) // 128 * 128) + x % 128)
        return 4 * max(g * red(n) * red(k) * 8 for g, n, k in calls_b)  # B in float64, its scales, a copy, margin

    try:
        available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX sysconf: do not guess
        return
    if need(reduce) > available // 2:
        fits = next((r for r in range(reduce + 1, 1025) if need(r) <= available // 2), None)
        raise ValueError(f"--reduce {reduce}: the float64 check of the reduced layer needs ~{need(reduce) / 2**30:.1f} "
                         f"GiB, more than half this machine's {available / 2**30:.1f} GiB; use --reduce "
                         f"{fits} or more")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deep_fp8_gemm demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=_positive_int, default=128, help="token count of the dense calls (default 128)")
    parser.add_argument("--cpu", action="store_true", help="take the no-GPU path even when a GPU is present")
    parser.add_argument("--no-audit", action="store_true", help="no-GPU path: skip compiling/auditing kernels")
    parser.add_argument("--no-sim", action="store_true",
                        help="no-GPU path: skip running the kernels in the CPU simulator")
    parser.add_argument("--reduce", type=_positive_int, default=8, metavar="F",
                        help="no-GPU path: divide N and K by F for the CPU reference run (default 8; 1: full size, "
                             "refused where the float64 check would not fit in memory)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    sm90, _ = _print_env()
    if sm90 and not args.cpu:
        status = gpu_demo(args.m)
    else:
        try:
            check_memory(args.reduce)
        except ValueError as exc:
            parser.error(str(exc))  # exit status 2, with the usage line
        status = cpu_demo(args.m, not args.no_audit, args.reduce, not args.no_sim)
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
