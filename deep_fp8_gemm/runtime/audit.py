"""Static kernel audit ("kernel doctor"): compile each kernel and check what ptxas and the SASS say.

Needs no GPU. A kernel passes when it compiles, does not spill, uses no local memory (no stack, no
``STL``/``LDL``; the watchdog build may use the stack of its printf, see WATCHDOG_STACK_BYTES), contains its required instructions (for the GEMMs: ``QGMMA`` = FP8 wgmma, ``UTMALDG`` =
TMA loads, ``USETMAXREG`` = warp-specialised register split) and ptxas raised none of the
performance warnings in :data:`FATAL_WARNINGS`. GEMM kernels also get a static K-loop analysis
(:mod:`.kloop`, record field ``kloop``, table column ``issue/tc``) against their kind's ceilings
(``kloop_ceilings.json``): a kernel CI gates (``AuditTarget.gate_kloop``: the DeepSeek-V3 tables' picks) fails
when it exceeds one; any other kernel (the heuristic's pick for a user's shapes) and every kernel of the watchdog
build (``DFG_WATCHDOG_SECONDS``: its debug instructions sit in the loops) gets the finding as a ``note`` — the
figures are reported, the exit status is not changed. So the exit status means "a kernel spills, uses local
memory, lacks required SASS, holds forbidden SASS or more of an opcode than its bound (an FP8-output kernel's
``MUFU.RCP``), triggers a fatal ptxas warning, or is a gated kernel over its K-loop ceiling".
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence

from . import kloop
from .compiler import CompileError, compile_kernel, watchdog_options
from .sass import disassemble, instruction_histogram, opcode_histogram

# C7508: setmaxnreg ignored; C7511/C7517/C7519: wgmma serialised / extra waits inserted by ptxas.
FATAL_WARNINGS = ("C7508", "C7511", "C7517", "C7519")
# Opcodes always reported in the ``sass`` field, present or not. MUFU.RCP: the FP8-output epilogue's reciprocals
# (one per row and scale block, kernels/targets.py fp8_epilogue_max_rcp), and every IEEE division's.
REPORTED_SASS = ("QGMMA", "UTMALDG", "UTMASTG", "USETMAXREG", "STL", "LDL", "WARPGROUP", "SYNCS", "ACQBULK",
                 "MUFU.RCP")
#: ACQBULK is griddepcontrol.wait: every kernel waits for the previous one before touching global memory, so it
#: may run as a programmatic dependent launch (deep_fp8_gemm.set_pdl; the record's ``pdl`` field).
PDL_WAIT_SASS = "ACQBULK"
GEMM_REQUIRED_SASS = ("QGMMA", "UTMALDG", "USETMAXREG", PDL_WAIT_SASS)
# The watchdog build (DFG_WATCHDOG_SECONDS) passes vprintf a packed argument buffer on the stack
# (hal/ptx.cuh, watchdog::expired): that much stack and its local stores are expected there, spills are not.
WATCHDOG_STACK_BYTES = 64


@dataclasses.dataclass
class AuditTarget:
    """One kernel to audit.

    ``kind``: family (``"dense"``, ``"contiguous"``, ``"masked"``, ``"quant"``, ...); ``config``: the
    JSON-safe configuration that produced it (``smem_bytes`` = dynamic shared memory of the launch);
    ``name``/``source``: entry symbol and rendered translation unit; ``required_sass``: opcodes that
    must appear (a base name such as ``QGMMA``, or a full opcode with modifiers such as ``STG.E.64``, matched
    exactly); ``forbidden_sass``: full opcodes that must not appear (e.g. ``STG.E``, a 4-byte store where the
    kernel promises 8-byte ones); ``max_sass``: ``(opcode, bound)`` pairs, opcodes (matched as in
    ``required_sass``) that may appear at most ``bound`` times (e.g. ``MUFU.RCP`` in an FP8-output kernel: one
    reciprocal per row and scale block, not a division per value); ``options``: extra NVRTC options;
    ``gate_kloop``: a K-loop figure over its kind's ceiling fails the kernel (True: a kernel CI gates) or is only
    noted (False: see the module docstring).
    """

    kind: str
    config: dict
    name: str
    source: str
    required_sass: tuple[str, ...] = GEMM_REQUIRED_SASS
    options: tuple[str, ...] = ()
    forbidden_sass: tuple[str, ...] = ()
    gate_kloop: bool = True
    max_sass: tuple[tuple[str, int], ...] = ()


def _compile_record(target: AuditTarget) -> tuple[dict, bytes | None]:
    """The record with the compile results filled in, and the cubin (None if the compile failed)."""
    record: dict = {
        "kind": target.kind, "config": dict(target.config), "name": target.name,
        "compile_seconds": None, "cache_hit": None, "cubin_sha256": None, "registers": None, "spill_bytes": None,
        "stack_bytes": None, "smem_bytes": target.config.get("smem_bytes"), "sass": {},
        "warnings": [], "kloop": None, "ok": False, "problems": [], "notes": [], "watchdog": bool(watchdog_options()),
        "pdl": None,
        "kloop_gated": None,
    }
    try:
        kernel = compile_kernel(target.name, target.source, options=target.options)
    except CompileError as exc:
        record["problems"].append(f"compile failed (source: {exc.source_path}): {exc.log.strip()[:2000]}")
        return record, None
    res = kernel.resources
    record.update(compile_seconds=round(kernel.compile_seconds, 4), cache_hit=kernel.cache_hit,
                  cubin_sha256=hashlib.sha256(kernel.cubin).hexdigest(), registers=res.registers,
                  spill_bytes=res.spill_bytes, stack_bytes=res.stack_bytes, warnings=list(res.warnings))
    if res.spill_bytes:
        record["problems"].append(f"spills {res.spill_store_bytes} B stores / {res.spill_load_bytes} B loads")
    if res.stack_bytes and not (record["watchdog"] and res.stack_bytes <= WATCHDOG_STACK_BYTES):
        record["problems"].append(f"{res.stack_bytes} B stack frame (local memory)")
    bad = [code for code in res.warnings if code in FATAL_WARNINGS]
    if bad:
        record["problems"].append(f"ptxas performance warnings {bad}")
    _check_register_split(record, target.config, res.registers)
    return record, kernel.cubin


def _check_register_split(record: dict, config: dict, registers: int) -> None:
    """Warp-specialised kernels (configs with ``math_registers``): the launch allocates ``registers`` (R)
    per thread; the producer warpgroup's ``setmaxnreg.dec`` to P must free what the math warpgroups'
    ``setmaxnreg.inc`` to M takes, i.e. P <= R <= M and 128 (R - P) >= math_threads (M - R). Otherwise
    ``setmaxnreg.inc`` spins forever (SASS retries TRY_ALLOC) or, with R > M, is undefined."""
    if "math_registers" not in config:
        return
    producer, math = config["producer_registers"], config["math_registers"]
    math_threads = 128 * config["num_math_warpgroups"]
    if not producer <= registers <= math or 128 * (registers - producer) < math_threads * (math - registers):
        record["problems"].append(
            f"register split does not fit: launch {registers} regs/thread, producer -> {producer}, "
            f"{math_threads} math threads -> {math}"
        )


def _check_kloop(record: dict, target: AuditTarget, sass: str, ceilings: dict) -> None:
    """GEMM kernels (configs with ``block_m``, ``block_n``, ``num_math_warpgroups``): K-loop figures and
    the kind's ceilings."""
    cfg = target.config
    if not {"block_m", "block_n", "num_math_warpgroups"} <= cfg.keys():
        return
    try:
        # The wgmma tile (swap-AB's is the transposed one: its rows are the weights' BLOCK_N).
        rows, cols = cfg.get("mma_rows", cfg["block_m"]), cfg.get("mma_cols", cfg["block_n"])
        analysis = kloop.analyse_sass(sass, block_m=rows, block_n=cols,
                                      num_math_warpgroups=cfg["num_math_warpgroups"], function=target.name,
                                      mma_chunks=cfg.get("mma_chunks", 1),
                                      scale_slices=cfg.get("scale_groups_per_k_block", 1) if
                                      cfg.get("scale_groups_per_k_block", 1) > 1 else 0,
                                      loop_qgmma=cfg.get("kloop_qgmma"),
                                      convert_units=cfg.get("convert_units_per_warp", 0))
    except ValueError as exc:
        record["problems"].append(f"K-loop analysis: {exc}")
        return
    record["kloop"] = analysis
    ceiling_kind = target.kind + ("_swap_ab" if cfg.get("swap_ab") else "")
    over = kloop.check_ceilings(ceiling_kind, rows, analysis, ceilings, cols)
    record["kloop_gated"] = target.gate_kloop and not record["watchdog"]
    if record["kloop_gated"]:
        record["problems"] += over
    else:
        why = ("the watchdog build: its debug instructions are in the loop" if record["watchdog"] else
               "not a kernel CI gates: the ceilings are set for the DeepSeek-V3 tables' picks")
        record["notes"] += [f"{p} (not gated: {why})" for p in over]


def _check_sass(record: dict, target: AuditTarget, sass: str) -> None:
    histogram, full = instruction_histogram(sass), opcode_histogram(sass)

    def count(op: str) -> int:  # "QGMMA": every QGMMA.*; "STG.E.64": that opcode exactly
        return full.get(op, 0) if "." in op else histogram.get(op, 0)

    bounded = tuple(op for op, _ in target.max_sass)
    record["sass"] = {op: count(op) for op in (*REPORTED_SASS, *target.required_sass, *target.forbidden_sass,
                                                *bounded)}
    record["pdl"] = count(PDL_WAIT_SASS) > 0
    if (histogram["STL"] or histogram["LDL"]) and not (record["watchdog"] and not record["spill_bytes"]):
        record["problems"].append(f"local memory instructions: {histogram['STL']} STL, {histogram['LDL']} LDL")
    missing = [op for op in target.required_sass if not count(op)]
    if missing:
        record["problems"].append(f"missing SASS {missing}")
    present = [f"{op} x{count(op)}" for op in target.forbidden_sass if count(op)]
    if present:
        record["problems"].append(f"forbidden SASS {present}")
    over = [f"{op} x{count(op)} (at most {bound})" for op, bound in target.max_sass if count(op) > bound]
    if over:
        record["problems"].append(f"SASS over its bound {over}")


def audit(targets: Iterable[AuditTarget], *, progress: bool = True) -> list[dict]:
    """Compiles (through the cache) and checks every target; one record per target, in order.

    Record fields: ``kind, config, name, compile_seconds, cache_hit, cubin_sha256`` (of the binary: a refactor
    that must not change the kernels compares these), ``registers, spill_bytes,
    stack_bytes, smem_bytes, sass`` (opcode -> count), ``warnings`` (ptxas codes), ``kloop`` (GEMMs:
    :func:`.kloop.analyse_function`'s report, else None), ``kloop_gated`` (whether its ceilings can fail it;
    None without a K-loop analysis), ``ok``, ``problems`` (what fails it), ``notes`` (K-loop findings that do
    not), ``watchdog``.
    ``progress`` draws a progress bar on stderr.
    """
    targets = list(targets)
    ceilings = kloop.load_ceilings()
    start = time.perf_counter()
    # NOTES: nvdisasm spends ~0.5 s starting up whatever the cubin size, so disassembly runs in worker
    # threads (subprocesses; the GIL is released) while the next kernel compiles.
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        pending = []
        for i, target in enumerate(targets):
            record, cubin = _compile_record(target)
            pending.append((record, target, pool.submit(disassemble, cubin) if cubin is not None else None))
            if progress:
                print_progress(i + 1, len(targets), time.perf_counter() - start, target.name)
        for record, target, future in pending:
            if future is not None:
                sass = future.result()
                _check_sass(record, target, sass)
                _check_kloop(record, target, sass, ceilings)
            record["ok"] = not record["problems"]
    return [record for record, _, _ in pending]


def _audit_chunk(targets: list[AuditTarget]) -> list[dict]:
    """One worker's share of :func:`audit_parallel` (no progress bar: the parent draws it)."""
    return audit(targets, progress=False)


def audit_parallel(targets: Iterable[AuditTarget], jobs: int, *, progress: bool = True) -> list[dict]:
    """:func:`audit` in ``jobs`` worker processes ("spawn": no forked torch threads), the records in the targets'
    order. Each worker compiles and disassembles its share (NVRTC and nvdisasm both keep a core busy); the disk
    cache's per-key locks make concurrent compiles of one kernel safe. ``jobs`` 1: :func:`audit` itself."""
    targets = list(targets)
    if jobs <= 1 or len(targets) < 2:
        return audit(targets, progress=progress)
    import multiprocessing

    chunks = [targets[i::jobs] for i in range(jobs)]  # interleaved: each worker gets every kind's kernels
    start = time.perf_counter()
    results: list[list[dict] | None] = [None] * jobs
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_audit_chunk, chunk): i for i, chunk in enumerate(chunks)}
        done = 0
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            done += len(chunks[futures[future]])
            if progress:
                print_progress(done, len(targets), time.perf_counter() - start, f"worker {futures[future]}")
    records: list[dict] = [None] * len(targets)  # type: ignore[list-item]
    for i, chunk_records in enumerate(results):
        records[i::jobs] = chunk_records
    return records


def print_progress(done: int, total: int, seconds: float, label: str) -> None:
    """Progress on stderr: a redrawn bar on a terminal; in logs (not a TTY) one line per ~10%."""
    if sys.stderr.isatty():
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r\033[K[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {seconds:6.1f} s {label}")
        if done == total:
            sys.stderr.write("\n")
    elif done == total or done % max(total // 10, 1) == 0:
        sys.stderr.write(f"{done}/{total} kernels, {seconds:.1f} s\n")
    sys.stderr.flush()


def format_table(records: Sequence[dict]) -> str:
    """A fixed-width table of audit records, one line per kernel, problems indented below."""
    width = max([len(r["name"]) for r in records] + [4]) + 2
    kind_width = max([len(r["kind"]) for r in records] + [4]) + 1
    header = f"{'kind':<{kind_width}}{'name':<{width}}{'regs':>5}{'spill':>6}{'stack':>6}{'smem':>8}{'QGMMA':>6}{'TMA ld':>7}" \
             f"{'TMA st':>7}{'setmaxnreg':>11}{'rcp':>5}{'issue/tc':>9}{'compile s':>10}{'cache':>7}  status"
    lines = [header, "-" * len(header)]
    for r in records:
        s = r["sass"]
        compile_s = "-" if r["compile_seconds"] is None else f"{r['compile_seconds']:.3f}"
        issue = (r.get("kloop") or {}).get("issue_per_tensor_cycle")
        lines.append(
            f"{r['kind']:<{kind_width}}{r['name']:<{width}}{_cell(r['registers']):>5}{_cell(r['spill_bytes']):>6}"
            f"{_cell(r['stack_bytes']):>6}{_cell(r['smem_bytes']):>8}{_cell(s.get('QGMMA')):>6}"
            f"{_cell(s.get('UTMALDG')):>7}{_cell(s.get('UTMASTG')):>7}{_cell(s.get('USETMAXREG')):>11}"
            f"{_cell(s.get('MUFU.RCP')):>5}{_cell(issue):>9}{compile_s:>10}{_cache_cell(r['cache_hit']):>7}"
            f"  {'ok' if r['ok'] else 'FAIL'}")
        lines += [f"    - {p.splitlines()[0] if p else p}" for p in r["problems"]]
        lines += [f"    note: {n}" for n in r.get("notes", ())]
    failed = sum(not r["ok"] for r in records)
    noted = sum(bool(r.get("notes")) for r in records)
    lines.append(f"{len(records)} kernels, {failed} failed" + (f", {noted} over a K-loop ceiling that does not gate "
                                                               f"them (notes)" if noted else ""))
    return "\n".join(lines)


def _cache_cell(hit: str | None) -> str:
    if hit is None:  # compile failed
        return "-"
    return hit or "new"


def _cell(value: object) -> str:
    return "-" if value is None else str(value)
