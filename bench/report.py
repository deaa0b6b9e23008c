"""Result files: ``<family>.json`` (everything), ``<family>.md`` (table), ``<family>.png`` (TFLOPS and
speedups per shape), and the ``bench/RESULTS.md`` summary rebuilt from whatever JSONs exist.

    python -m bench.report [--results DIR] [--summary FILE] [--plots]

JSON layout: ``{"family", "env", "method", "rows": [row], "extra"}``; a row is ``{"shape", "label",
"flops", "bytes", "h800_published_tflops", "rotation_copies", "impls": {name: record}}`` and a record
``{"status": ok|wrong|n/a|error|skipped, "us", "us_min", "us_p20", "us_p80", "runs", "spread", "tflops",
"gbs", "diff", "note", "error"}`` (timing fields only when ok).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .shapes import H800_LABEL, H800_PUBLISHED, H800_PUBLISHED_DENSE

OURS = "deep_fp8_gemm"
BASELINES = ("cublas_block", "bf16_matmul", "scaled_grouped_mm_rowwise", "torch_quant", "bf16_layer", "fp8_1d2d",
             "fp8_1d1d_loop")
LABELS = {
    OURS: "deep_fp8_gemm",
    "cublas_block": "cuBLAS block-scaled",
    "bf16_matmul": "bf16 matmul",
    "scaled_grouped_mm_rowwise": "_scaled_grouped_mm row-wise (different scaling)",
    "torch_quant": "plain-torch quantisation",
    "bf16_layer": "bf16 PyTorch MoE layer",
    "fp8_1d2d": "deep_fp8_gemm 1D2D kernel, same shape",
    "fp8_1d1d_loop": "deep_fp8_gemm 1D1D kernel, one launch per group",
    "ep_world1": "expert-parallel layer (ep_moe_forward), one-rank world",
    "ep_decode_world1": "expert-parallel decode (ep_moe_forward_decode), one-rank world",
    H800_LABEL: "reference design, H800 published",
}
COLORS = {OURS: "C0", "cublas_block": "C1", "bf16_matmul": "C2", "scaled_grouped_mm_rowwise": "C4", "torch_quant": "C5",
          "bf16_layer": "C2", "fp8_1d2d": "C6", "fp8_1d1d_loop": "C7", H800_LABEL: "C3"}
SHORT = {OURS: "ours", "cublas_block": "cuBLAS", "bf16_matmul": "bf16", "scaled_grouped_mm_rowwise": "rowwise",
         "torch_quant": "torch", "bf16_layer": "bf16 layer", "ep_world1": "EP 1 rank",
         "ep_decode_world1": "EP decode 1 rank", "fp8_1d2d": "1D2D", "fp8_1d1d_loop": "1D1D loop",
         H800_LABEL: "H800 pub."}
# Family-specific names (quant and moe tables): the MoE "cublas_block" is a per-expert loop of the call.
MOE_LABELS = {"cublas_block": "per-expert loop of block-scaled torch._scaled_mm"}
#: Issue 7's target for the memory-bound quantisation kernels: this fraction of HBM_TBS.
QUANT_TARGET = 0.8
# H200 SXM datasheet ceilings (leads, not measurements: KINDS.md measured ~4.3 TB/s device copy).
PEAK_FP8_TFLOPS = 1979.0
HBM_TBS = 4.8
RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: Host time per call on the stub driver (a CPU measurement, kept apart from the GPU families' JSONs): the runs
#: ``python -m bench.bench_host --device stub`` printed, before and after a change (issue 45).
HOST_RESULTS = RESULTS_DIR / "host_stub.json"
SUMMARY = Path(__file__).resolve().parent / "RESULTS.md"
NOT_MEASURED = "not yet measured on a GPU"


# --- numbers --------------------------------------------------------------------------------------------

def speedup(row: dict, baseline: str, key: str = "us") -> float | None:
    """``baseline µs / deep_fp8_gemm µs`` when both were checked correct and timed (``key="us_kernel"``: the
    profiler's kernel times); for ``H800_LABEL`` the TFLOPS ratio to the published number."""
    ours = row["impls"].get(OURS, {})
    if ours.get("status") != "ok":
        return None
    if baseline == H800_LABEL:
        published = row.get("h800_published_tflops")
        return ours["tflops"] / published if published else None
    other = row["impls"].get(baseline, {})
    if other.get("status") != "ok" or not other.get(key) or not ours.get(key):
        return None
    return other[key] / ours[key]


def geomean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in kept) / len(kept)) if kept else None


def family_of(rows: Sequence[dict]) -> str | None:
    """The shape family of a result table (``rows[0]["shape"]["family"]``), None when empty."""
    return rows[0]["shape"].get("family") if rows else None


def quant_bandwidth(rec: dict, nbytes: int) -> tuple[float, float, str] | None:
    """``(GB/s, fraction of HBM_TBS, source)`` of a checked quantisation call: from the profiler's kernel
    time when it was measured (short calls, where events add ~1-3 µs of launch latency), else the event time."""
    if rec.get("status") != "ok":
        return None
    us, source = (rec["us_kernel"], "CUPTI") if rec.get("us_kernel") else (rec.get("us"), "events")
    if not us:
        return None
    gbs = nbytes / us / 1e3
    return gbs, gbs / (HBM_TBS * 1e3), source


def floor_us(flops: int, nbytes: int) -> tuple[float, str]:
    """The H200 roofline floor in µs for a call and what binds it ("compute" or "memory")."""
    compute, memory = flops / (PEAK_FP8_TFLOPS * 1e6), nbytes / (HBM_TBS * 1e6)
    return (compute, "compute") if compute >= memory else (memory, "memory")


# --- environment ------------------------------------------------------------------------------------------

def _nvidia_smi() -> dict:
    fields = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=15, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.splitlines()[0].split(",")] if out.strip() else []
    return dict(zip(["smi_name", "driver", "clock_sm", "clock_max_sm", "clock_mem", "temperature", "power"], values))


def collect_env(device=None) -> dict:
    """GPU, driver, CUDA, torch, clocks (nvidia-smi), NVRTC, library version, UTC date."""
    import torch

    env: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "python": platform.python_version(),
        "torch": torch.__version__, "cuda": torch.version.cuda,
    }
    if device is not None and getattr(device, "type", device) == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env.update(gpu=props.name, sm_count=props.multi_processor_count,
                   capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1))
        env.update(_nvidia_smi())
    else:
        env["gpu"] = "none (CPU smoke run)"
    try:
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        env["nvrtc"] = f"{major}.{minor}"
    except Exception:  # noqa: BLE001 - informational only
        env["nvrtc"] = "unavailable"
    try:
        from importlib.metadata import version

        env["deep_fp8_gemm"] = version("deep_fp8_gemm")
    except Exception:  # noqa: BLE001
        env["deep_fp8_gemm"] = "source tree"
    return env


# --- text ---------------------------------------------------------------------------------------------------

def _f(value: float | None, fmt: str = "{:.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _cell(rec: dict | None, key: str, fmt: str = "{:.0f}") -> str:
    if not rec:
        return "–"
    if rec.get("status") != "ok":
        return rec.get("status", "–")
    return _f(rec.get(key), fmt)


def _present_baselines(rows: Sequence[dict]) -> list[str]:
    return [b for b in BASELINES if any(b in r["impls"] for r in rows)]


def _notes(row: dict, ok_notes: bool = False) -> str:
    notes = []
    for name, rec in row["impls"].items():
        text = rec.get("error") or (rec.get("note") if ok_notes or rec.get("status") != "ok" else "")
        if rec.get("status") == "wrong":
            text = f"wrong result (calc_diff {rec.get('diff'):.2e})"
        if text:
            notes.append(f"{SHORT.get(name, name)}: {text[:110 if ok_notes else 90]}")
    return "; ".join(notes).replace("|", "/")


def quant_table(rows: Sequence[dict]) -> str:
    """Quantisation kernels: µs (events and CUPTI), GB/s and % of HBM bandwidth, the torch path's µs and the
    speedup over it, the check."""
    kernel_col = any(r["impls"].get(OURS, {}).get("us_kernel") for r in rows)
    head = ["kernel / shape", "MB moved", "µs", *(["kernel µs (CUPTI)"] if kernel_col else []), "GB/s",
            f"% of {HBM_TBS} TB/s", "torch µs", "× torch", "check (calc_diff)", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ours = r["impls"].get(OURS, {})
        bw = quant_bandwidth(ours, r["bytes"])
        kernel = [_f(ours.get("us_kernel"), "{:.1f}")] if kernel_col else []
        pct = f"{100 * bw[1]:.0f}%" + (" (CUPTI)" if bw[2] == "CUPTI" else "") if bw else "–"
        cells = [r["label"], f"{r['bytes'] / 1e6:.1f}", _cell(ours, "us", "{:.1f}"), *kernel,
                 _f(bw[0] if bw else None), pct, _cell(r["impls"].get("torch_quant"), "us", "{:.1f}"),
                 _f(speedup(r, "torch_quant"), "{:.2f}x"), _f(ours.get("diff"), "{:.1e}"), _notes(r)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"MB moved = input read + e4m3 output + scales written, once each. GB/s and % of the H200's "
              f"{HBM_TBS} TB/s (datasheet; target >= {100 * QUANT_TARGET:.0f}%) use the profiler's kernel time where "
              "it was measured (calls under the profiling threshold), else the event time. × torch = torch µs / "
              "ours µs (event times). Check: per-token, per-block and cast-transpose must equal the torch path bit for "
              "bit (0.0), SiLU·mul within 1e-4. Cast-transpose rows: the torch column is two separate quantisations "
              "(per_token_cast_to_fp8 of x and of x.t().contiguous(); on sm_90 the fused per-token kernel twice)."]
    return "\n".join(lines)


def moe_table(rows: Sequence[dict]) -> str:
    """MoE layer: µs, effective TFLOPS over routed slots, the bf16 layer's and the cuBLAS loop's µs and the
    speedups, calc_diff against the reference (the bf16 layer)."""
    kernel_col = any(r["impls"].get(OURS, {}).get("us_kernel") for r in rows)
    ep = [name for name in ("ep_world1", "ep_decode_world1") if any(name in r["impls"] for r in rows)]
    head = ["layer", "routed slots", "µs", *(["kernel µs (CUPTI)"] if kernel_col else []), "TFLOPS (routed)",
            "bf16 layer µs", "× bf16 layer", "cuBLAS loop µs", "× cuBLAS loop",
            *(f"{SHORT[name]} µs" for name in ep), "calc_diff", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ours = r["impls"].get(OURS, {})
        shape = r["shape"]
        kernel = [_f(ours.get("us_kernel"), "{:.1f}")] if kernel_col else []
        cells = [r["label"], str(shape.get("tokens", 0) * shape.get("top_k", 0)), _cell(ours, "us", "{:.1f}"),
                 *kernel, _cell(ours, "tflops"), _cell(r["impls"].get("bf16_layer"), "us", "{:.1f}"),
                 _f(speedup(r, "bf16_layer"), "{:.2f}x"), _cell(r["impls"].get("cublas_block"), "us", "{:.1f}"),
                 _f(speedup(r, "cublas_block"), "{:.2f}x"),
                 *(_cell(r["impls"].get(name), "us", "{:.1f}") for name in ep), _f(ours.get("diff"), "{:.1e}"),
                 _notes(r, ok_notes=True)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "TFLOPS = 2 · routed slots · 3·H·I / time. × = baseline µs / ours µs (event times, eager calls "
              "including routing and the host synchronisation each implementation does). calc_diff: against the "
              "bf16 layer (two FP8 GEMMs with requantised activations: ~2e-3 expected; the check allows 1e-2). "
              f"cuBLAS loop = {MOE_LABELS['cublas_block']} (same FP8 math as ours, one expert at a time)."
              + (" EP 1 rank / EP decode 1 rank = the expert-parallel layer (deep_fp8_gemm.distributed) on a "
                 "one-rank world: the same GEMMs plus its dispatch / return machinery, no network."
                 if ep else "")]
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict]) -> str:
    """One line per shape: deep_fp8_gemm µs / TFLOPS / GB/s, each baseline's µs and speedup, the H800
    published TFLOPS and ratio, the check (calc_diff) and any note. The quant and moe families have their
    own columns (:func:`quant_table`, :func:`moe_table`)."""
    family = family_of(rows)
    if family == "quant":
        return quant_table(rows)
    if family == "moe":
        return moe_table(rows)
    baselines = _present_baselines(rows)
    kernel_col = any(r["impls"].get(OURS, {}).get("us_kernel") for r in rows)
    head = ["shape", "µs", *(["kernel µs (CUPTI)"] if kernel_col else []), "TFLOPS", "GB/s"]
    for b in baselines:
        head += [f"{SHORT[b]} µs", f"× {SHORT[b]}"]
        if kernel_col and b == "cublas_block":
            head += ["× cuBLAS (CUPTI)"]
    head += ["H800 pub. TFLOPS", "× H800 pub.", "% of H200 floor", "calc_diff", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ours = r["impls"].get(OURS, {})
        kernel = [_f(ours.get("us_kernel"), "{:.1f}")] if kernel_col else []
        cells = [r["label"], _cell(ours, "us", "{:.1f}"), *kernel, _cell(ours, "tflops"), _cell(ours, "gbs")]
        for b in baselines:
            cells += [_cell(r["impls"].get(b), "us", "{:.1f}"), _f(speedup(r, b), "{:.2f}x")]
            if kernel_col and b == "cublas_block":
                cells.append(_f(speedup(r, b, "us_kernel"), "{:.2f}x"))
        floor, bound = floor_us(r["flops"], r["bytes"])
        roof = f"{100 * floor / ours['us']:.0f}% ({bound})" if ours.get("status") == "ok" else "–"
        cells += [_f(r.get("h800_published_tflops")), _f(speedup(r, H800_LABEL), "{:.2f}x"), roof,
                  _f(ours.get("diff"), "{:.1e}"), _notes(r)]
        lines.append("| " + " | ".join(cells) + " |")
    legend = "; ".join(f"{SHORT[b]} = {LABELS[b]}" for b in (*baselines, H800_LABEL))
    lines += ["", f"× = speedup of deep_fp8_gemm (baseline µs / ours µs; H800: TFLOPS ratio). {legend}. "
              f"H200 floor = max(FLOPs / {PEAK_FP8_TFLOPS:.0f} TFLOPS, bytes / {HBM_TBS} TB/s) (datasheet). "
              + ("kernel µs (CUPTI) = the profiler's device-kernel time per call, a cross-check of the event time "
                 "(which includes ~1-3 µs of launch latency) for short calls; speedups use event times. "
                 if kernel_col else "") +
              "Full error texts are in the JSON."]
    return "\n".join(lines)


def headline(rows: Sequence[dict]) -> list[str]:
    """Geometric-mean speedups and how many shapes beat the published H800 number."""
    out = []
    family = family_of(rows)
    for b in (*_present_baselines(rows), H800_LABEL):
        values = [speedup(r, b) for r in rows]
        g = geomean(values)
        n = sum(v is not None for v in values)
        if g is not None:
            extra = ""
            if b == H800_LABEL:
                extra = f", {sum(v >= 1.0 for v in values if v is not None)}/{n} shapes at or above it"
            label = MOE_LABELS.get(b, LABELS[b]) if family == "moe" else LABELS[b]
            out.append(f"geomean speedup vs {label}: **{g:.2f}x** over {n} shapes{extra}")
    if family == "quant":
        fractions = [bw[1] for r in rows if (bw := quant_bandwidth(r["impls"].get(OURS, {}), r["bytes"]))]
        if fractions:
            out.append(f"HBM bandwidth: {100 * min(fractions):.0f}–{100 * max(fractions):.0f}% of {HBM_TBS} TB/s "
                       f"(median {100 * sorted(fractions)[len(fractions) // 2]:.0f}%); "
                       f"**{sum(f >= QUANT_TARGET for f in fractions)}/{len(fractions)}** calls at or above the "
                       f"{100 * QUANT_TARGET:.0f}% target")
    if family == "moe":
        diffs = [r["impls"][OURS]["diff"] for r in rows if r["impls"].get(OURS, {}).get("status") == "ok"]
        if diffs:
            out.append(f"calc_diff vs the bf16 layer: {min(diffs):.1e}–{max(diffs):.1e}")
    ok = sum(r["impls"].get(OURS, {}).get("status") == "ok" for r in rows)
    out.append(f"deep_fp8_gemm checked correct and timed on {ok}/{len(rows)} shapes")
    return out


def extra_markdown(extra: dict) -> str:
    """The host-overhead table (dense) or whatever else a family adds."""
    if not extra:
        return ""
    if "error" in extra:
        return f"extra measurements failed: {extra['error']}"
    lines = []
    overhead = extra.get("host_overhead")
    if overhead:
        lines += ["", "Host overhead per call (back-to-back calls, no flush):", "",
                  "| implementation | shape | calls | host µs/call | wall µs/call | GPU µs/call "
                  "| isolated kernel µs |",
                  "|---|---|---|---|---|---|---|"]
        for o in overhead:
            if "error" in o:
                lines.append(f"| {LABELS.get(o['impl'], o['impl'])} | {o['label']} | – | {o['error']} | | | |")
                continue
            lines.append(f"| {LABELS.get(o['impl'], o['impl'])} | {o['label']} | {o['calls']} | {o['host_us']:.1f} | "
                         f"{o['wall_us']:.1f} | {o['gpu_us']:.1f} | {_f(o.get('kernel_us'), '{:.1f}')} |")
        lines += ["", "host µs/call > isolated kernel µs means such calls are launch-bound (capture them in a "
                  "CUDA graph)."]
    return "\n".join(lines)


def env_line(env: dict) -> str:
    clocks = ""
    if env.get("clock_sm"):
        clocks = (f", SM clock {env['clock_sm']} (max {env.get('clock_max_sm', '?')}), "
                  f"mem clock {env.get('clock_mem', '?')}")
    return (f"{env.get('gpu', '?')} ({env.get('sm_count', '?')} SMs), driver {env.get('driver', '?')}, "
            f"CUDA {env.get('cuda', '?')}, torch {env.get('torch', '?')}, NVRTC {env.get('nvrtc', '?')}{clocks}; "
            f"{env.get('date', '?')}" + (" (--quick)" if env.get("quick") else ""))


def compact_table(rows: Sequence[dict]) -> str:
    """A fixed-width console table: deep_fp8_gemm µs (and CUPTI kernel µs), TFLOPS, GB/s, speedups."""
    baselines = _present_baselines(rows) or ["cublas_block", "bf16_matmul"]
    heads = "".join(f"{'x' + SHORT[b].replace(' ', ''):>12}" for b in baselines)
    lines = [f"  {'shape':<44}{'µs':>9}{'kern µs':>9}{'TFLOPS':>8}{'GB/s':>7}{heads}{'xH800':>7}  status"]
    for r in rows:
        ours = r["impls"].get(OURS, {})
        ok = ours.get("status") == "ok"
        ratios = "".join(f"{_f(speedup(r, b), '{:.2f}'):>12}" for b in baselines)
        lines.append(
            f"  {r['label'][:43]:<44}{_f(ours.get('us') if ok else None, '{:.1f}'):>9}"
            f"{_f(ours.get('us_kernel') if ok else None, '{:.1f}'):>9}{_f(ours.get('tflops') if ok else None):>8}"
            f"{_f(ours.get('gbs') if ok else None):>7}{ratios}{_f(speedup(r, H800_LABEL), '{:.2f}'):>7}"
            f"  {ours.get('status', '?')}")
    return "\n".join(lines)


def console_line(row: dict) -> str:
    ours = row["impls"].get(OURS, {})
    parts = [f"{row['label']:<40}"]
    if ours.get("status") == "ok":
        parts.append(f"{ours['us']:9.1f} us {ours['tflops']:7.0f} TFLOPS {ours['gbs']:6.0f} GB/s")
        if ours.get("us_kernel"):
            parts.append(f"(kernel {ours['us_kernel']:.1f} us)")
    else:
        parts.append(f"{ours.get('status', '?'):>9} {ours.get('error') or ours.get('note') or ''}"[:120])
    for b in (*BASELINES, H800_LABEL):
        s = speedup(row, b)
        if s is not None:
            parts.append(f"x{SHORT[b]} {s:.2f}")
    return "  ".join(parts)


# --- files --------------------------------------------------------------------------------------------------

def _atomic_write(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def write_family(family: str, rows: Sequence[dict], env: dict, out_dir: Path | str, *,
                 extra: dict | None = None, plot: bool = True) -> list[Path]:
    """Writes ``<family>.json`` and ``.md`` (and ``.png`` with ``plot`` when matplotlib is importable)."""
    from .timing import METHOD_NOTE

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"family": family, "env": env, "method": METHOD_NOTE, "rows": list(rows), "extra": extra or {}}
    json_path, md_path = out_dir / f"{family}.json", out_dir / f"{family}.md"
    _atomic_write(json_path, json.dumps(doc, indent=1, default=str))
    _atomic_write(md_path, family_markdown(doc))
    paths = [json_path, md_path]
    if plot:
        png = plot_family(doc, out_dir / f"{family}.png")
        if png is not None:
            paths.append(png)
    return paths


def family_markdown(doc: dict) -> str:
    parts = [f"## {doc['family']}", "", env_line(doc["env"]), "", f"Method: {doc['method']}.", ""]
    parts += [f"- {line}" for line in headline(doc["rows"])]
    parts += ["", markdown_table(doc["rows"]), ""]
    extra = extra_markdown(doc.get("extra") or {})
    if extra:
        parts += [extra, ""]
    return "\n".join(parts)


def plot_family(doc: dict, path: Path) -> Path | None:
    """Two panels: TFLOPS per shape (deep_fp8_gemm, baselines, H800 published) and speedups (log scale, 1x
    line). Returns None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = doc["rows"]
    labels = [r["label"].replace(" n=", "\nn=") for r in rows]
    quant = family_of(rows) == "quant"
    metric = "gbs" if quant else "tflops"  # quantisation kernels: bandwidth, not FLOPs
    series = [(OURS, [r["impls"].get(OURS, {}).get(metric) for r in rows])]
    series += [(b, [r["impls"].get(b, {}).get(metric) for r in rows]) for b in _present_baselines(rows)]
    if any(r.get("h800_published_tflops") for r in rows):
        series.append((H800_LABEL, [r.get("h800_published_tflops") for r in rows]))
    x = list(range(len(rows)))
    width = 0.8 / len(series)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8.0, 0.55 * len(rows) + 3), 9), sharex=True)
    for i, (name, values) in enumerate(series):
        ax1.bar([xi + (i - (len(series) - 1) / 2) * width for xi in x], [v or 0 for v in values], width,
                label=LABELS[name], color=COLORS[name])
    if quant:
        ax1.axhline(HBM_TBS * 1e3, color="black", linewidth=0.8, linestyle="--", label=f"{HBM_TBS} TB/s (datasheet)")
        ax1.set_ylabel("GB/s (bytes read + written once, event time)")
    else:
        ax1.set_ylabel("TFLOPS (2mnk/t, valid rows)" if family_of(rows) != "moe" else "TFLOPS (routed slots)")
    ax1.set_title(f"{doc['family']} — {doc['env'].get('gpu', '?')}, {doc['env'].get('date', '')}")
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3)
    speedups = [(b, [speedup(r, b) for r in rows]) for b in (*_present_baselines(rows), H800_LABEL)
                if b != H800_LABEL or any(r.get("h800_published_tflops") for r in rows)]
    for name, values in speedups:
        ax2.plot(x, [v if v is not None else float("nan") for v in values], marker="o", linestyle="none",
                 label=f"vs {LABELS[name]}", color=COLORS[name])
    ax2.axhline(1.0, color="black", linewidth=0.8)
    ax2.set_yscale("log")
    ax2.set_ylabel("speedup of deep_fp8_gemm")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, rotation=90, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reference_table() -> str:
    """The reference design's published H800 SXM numbers (ANCHORS.md) with each shape's H200 roofline floor."""
    lines = ["| kind | shape | H800 pub. TFLOPS | H800 pub. GB/s | H800 pub. µs | H200 floor µs | bound by | "
             "TFLOPS at the floor |", "|---|---|---|---|---|---|---|---|"]
    for shape, tflops in H800_PUBLISHED.items():
        gbs = H800_PUBLISHED_DENSE[shape][1] if shape in H800_PUBLISHED_DENSE else None
        floor, bound = floor_us(shape.flops(), shape.bytes())
        lines.append(f"| {shape.family} | {shape.label} | {tflops:.0f} | {_f(gbs)} | "
                     f"{shape.flops() / tflops / 1e6:.1f} | {floor:.1f} | {bound} | "
                     f"{shape.flops() / floor / 1e6:.0f} |")
    return "\n".join(lines)


TARGETS = """Targets (issues 4 and 5): every published shape at or above its H800 TFLOPS; M=4096 large-K dense shapes
>= 1,500 TFLOPS; geometric mean >= 1.3x block-scaled cuBLAS over the dense table; M <= 128 dense shapes at >= 80%
of HBM bandwidth (bytes = A + B + scales + D once each); contiguous >= 1,346 / 1,214 TFLOPS, masked >= its rows
below; a contiguous call with 50% padding rows within 10% of the same call without them (the
`(+4096 pad rows each)` row of the contiguous table against its unpadded twin).

Issue 7 (families `quant` and `moe`): the fused quantisation kernels (per-token with M-major scales, per-block,
SiLU·mul + quantise) at >= 80% of the H200's 4.8 TB/s (bytes = input read + e4m3 output + scales written once
each), bit-exact with the plain-torch path, and faster than it; the MoE layer (E = 256, top-8, H = 7168,
I = 2048, T in {1, 16, 128, 1024, 4096}) against the bf16 PyTorch layer and a per-expert loop of block-scaled
`torch._scaled_mm`, with calc_diff against the bf16 layer."""


def host_markdown(path: Path) -> list[str]:
    """The summary's host-time section from ``path`` (:data:`HOST_RESULTS`; nothing when it is absent): per op the
    µs per call, the launch floor, their ratio and, for ops returning new tensors, the floor that makes them too and
    the ratio to it (``bench.bench_host``'s ``outputs_floor_us`` / ``ratio_outputs``; absent from older runs), in
    each recorded run side by side; the bar applies to the last of these (``bar_ratio``)."""
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    runs = doc["runs"]
    ops = list(dict.fromkeys(row["op"] for run in runs for row in run["ops"]))
    head = "| op | " + " | ".join(f"{r['label']}: µs / floor µs / ratio (+ outputs)" for r in runs) + " |"
    lines = ["## Host time per call (CPU, stub driver)", "", f"{doc['what']}; {doc['machine']}. The bar (issue 45): "
             "ratio <= 1.5 on every entry point that launches a kernel; for an op that returns new tensors the floor "
             "makes them too (floor + outputs; a torch tensor costs ~0.75 µs to make, so two are already half a "
             "bare launch); per_channel launches no kernel (plain torch, n/a).", "", head,
             "|---|" + "---|" * len(runs)]
    for op in ops:
        cells = []
        for run in runs:
            row = next((r for r in run["ops"] if r["op"] == op), None)
            if row is None:
                cells.append("–")
                continue
            head_cell = f"{row['call_us']:.2f} / {row['launch_floor_us']:.2f} / "
            if "outputs_floor_us" in row and row.get("bar_ratio") is not None:
                cell = (head_cell + f"{row['ratio']:.2f}x (+ outputs {row['outputs_floor_us']:.2f} / "
                        f"**{row['ratio_outputs']:.2f}x**)")
            elif "bar_ratio" in row and row["bar_ratio"] is None:  # no kernel: the bar does not apply
                cell = head_cell + f"{row['ratio']:.2f}x (no kernel: n/a)"
            else:
                cell = head_cell + f"**{row['ratio']:.2f}x**"
            cells.append(cell)
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return lines + [""]


def write_summary(results_dir: Path | str = RESULTS_DIR, summary: Path | str = SUMMARY, plots: bool = False) -> Path:
    """Rebuilds the summary Markdown from every ``<family>.json`` in ``results_dir`` (``plots``: redraw PNGs)."""
    results_dir, summary = Path(results_dir), Path(summary)
    docs = []
    for path in sorted(results_dir.glob("*.json")):
        if path.name == HOST_RESULTS.name:  # the host-time runs: their own section (host_markdown), not a family
            continue
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipping {path}: {exc}")
    parts = ["# Benchmark results", "",
             "Generated by `python -m bench.report` from `bench/results/*.json`; produce those with "
             "`python -m bench.bench_dense`, `python -m bench.bench_grouped`, `python -m bench.bench_quant`, "
             "`python -m bench.bench_moe` or `bash bench/device_check.sh OUTDIR` "
             "on a Hopper GPU (see `bench/__init__.py`).", ""]
    if not docs:
        from .timing import METHOD_NOTE

        parts += [f"**Status: {NOT_MEASURED}.** No deep_fp8_gemm kernel has been timed yet: not the GEMMs (families "
                  "`dense-*`, `contiguous`, `masked`), not the fused quantisation kernels (`quant`: per-token, "
                  "per-block, SiLU·mul + quantise against their bytes-moved floor and the plain-torch path), not the "
                  "MoE layer (`moe`: against the bf16 PyTorch layer and a per-expert block-scaled `torch._scaled_mm` "
                  "loop). The table below is the GEMMs' bar.", "", TARGETS, "",
                  f"Method (when measured): {METHOD_NOTE}.", ""]
    else:
        parts += ["Machine: " + env_line(docs[0]["env"]), ""]
        for doc in docs:
            parts += [f"## {doc['family']}", ""]
            if doc["env"] != docs[0]["env"]:
                parts += [env_line(doc["env"]), ""]
            parts += [f"- {line}" for line in headline(doc["rows"])]
            png = results_dir / f"{doc['family']}.png"
            if plots:
                plot_family(doc, png)
            if png.exists():
                parts += ["", f"![{doc['family']}]({os.path.relpath(png, summary.parent)})"]
            parts += ["", markdown_table(doc["rows"]), ""]
            extra = extra_markdown(doc.get("extra") or {})
            if extra:
                parts += [extra, ""]
        parts += [f"Method: {docs[0]['method']}.", "", TARGETS, ""]
    parts += host_markdown(HOST_RESULTS)
    parts += ["## Reference design's published numbers (H800 SXM, NVCC 12.8)", "",
              "From `../shared/ANCHORS.md`. Different GPU: the H800 has the H200's 132 SMs and 1979 TFLOPS FP8 peak "
              "but "
              "3.35 TB/s of HBM instead of 4.8, so memory-bound (small-M) shapes have ~1.4x more headroom on an H200. "
              "TFLOPS = 2mnk/t over valid rows; µs derived from it. "
              "H200 floor = max(FLOPs / 1979 TFLOPS, bytes / 4.8 TB/s), datasheet ceilings "
              "(a device copy measured ~4.3 TB/s on these machines).", "", reference_table(), ""]
    _atomic_write(summary, "\n".join(parts))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="directory of <family>.json files")
    parser.add_argument("--summary", type=Path, default=SUMMARY, help="summary Markdown to write")
    parser.add_argument("--plots", action="store_true", help="redraw every <family>.png from its JSON")
    parser.add_argument("--print", dest="show", action="store_true", help="print the headline of every family")
    args = parser.parse_args(argv)
    path = write_summary(args.results, args.summary, plots=args.plots)
    print(f"wrote {path}")
    if args.show:
        for doc_path in sorted(Path(args.results).glob("*.json")):
            doc = json.loads(doc_path.read_text())
            print(f"\n{doc['family']}: {env_line(doc['env'])}")
            for line in headline(doc["rows"]):
                print("  " + line.replace("**", ""))
            print(compact_table(doc["rows"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
