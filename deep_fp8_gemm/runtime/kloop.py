"""Static K-loop analysis of a GEMM kernel's SASS: how many instructions the warps issue per K block.

No GPU needed: it reads the disassembly (``nvdisasm -c`` or ``cuobjdump -sass``) of the compiled kernel.

Loops are the natural loops of the control-flow graph (:func:`find_loops`): an edge to a block that
dominates its source closes one, whether the branch is conditional (``@P0 BRA``) or not (a *rotated* loop
tests its exit at the top and jumps back unconditionally; ptxas emits those for the reference design's
K = 7168 kernels). A loop's counted body is its blocks laid out between its header and its back edge. The
*math loop* is the innermost loop whose body holds ``QGMMA`` (FP8 wgmma; a BF16 ``HGMMA`` counts as one); the *producer loop* the innermost
one holding ``UTMALDG`` (TMA load). ``BRA.U.ANY`` back edges are not loops over K: the compiler wraps an
instruction with uniform operands in them (e.g. ``ELECT`` around a TMA issued by one thread) and they
are counted as part of the body they sit in. Spin-wait retries (``SYNCS.PHASECHK`` + ``BRA``) that the
compiler moves out of line are not in the body, as they cost nothing when the barrier is already ready.

Per loop, instructions are counted by class (:data:`CLASSES`) and divided by the K blocks one iteration
covers (the loop may be unrolled over pipeline stages):

* math loop: ``QGMMA in body / (4 x waves_m x mma_chunks)`` K blocks per iteration (a 128-wide K block is 4 k32
  wgmmas per m64 wave of a warpgroup and per MMA chunk: the SwiGLU kinds compute their 256 columns as two
  m64n128 chunks);
* producer loop: one empty-barrier wait (``SYNCS.PHASECHK``) per K block. Counting TMA loads instead would
  depend on the kind (3 loads per K block, 4 with the 1D1D kinds' sB) and on the variants the body holds
  (a cluster producer issues either the multicast or the unicast loads of a K block, both in its body).

Figures reported (per warp, since every warp of a warpgroup runs the same instruction stream):

* ``per_k_block``: class -> instructions per K block per warp;
* ``drain_to_wgmma``: instructions after each wave's drain (``WARPGROUP.DEPBAR``) up to the next
  ``QGMMA`` in loop order (wrapping around the back edge): work one warpgroup cannot overlap with its
  own tensor-core work. ``drain_to_wgmma_per_k_block`` sums them over an iteration, divided by its K blocks;
* ``overhead_per_k_block_per_wave``: math instructions other than the promotion's FFMA per K block and
  m64 wave (independent of BLOCK_N: catches bookkeeping growth in wide and narrow tiles alike);
* ``issue_per_tensor_cycle`` = instructions per K block per warp x math warpgroups / (BLOCK_M x BLOCK_N
  / 32): math issue demand on one SM sub-partition (one warp of each math warpgroup lives on it) per
  cycle of tensor-core work (a K block of a BLOCK_M x BLOCK_N tile is BLOCK_M x BLOCK_N x 128 x 2 FLOP at
  8192 FLOP per clock per SM). Near 1 the promotion and bookkeeping can no longer hide under the other
  warpgroup's wgmma.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from pathlib import Path

# Instruction classes, in report order. ``WARPGROUP``: wgmma.fence / wait_group (``WARPGROUP.ARRIVE`` /
# ``.DEPBAR``); ``uniform``: uniform-datapath ops (U-prefixed, TMA excluded);
# ``lds_ldg``: shared/global/constant loads; ``branch``: control flow.
CLASSES = ("QGMMA", "WARPGROUP", "FFMA", "FMUL", "FSEL", "uniform", "R2UR", "SYNCS", "lds_ldg", "branch", "other",
           "total")
_BRANCH_OPS = frozenset({"BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "BREAK",
                         "ELECT", "YIELD", "NOP"})
_LOAD_OPS = frozenset({"LDS", "LDG", "LDSM", "LDC", "ULDC", "LD", "LDGSTS"})
WGMMAS_PER_K_BLOCK_PER_WAVE = 4  # 128-wide K block / k32 per e4m3 wgmma

_FUNC_HEADER = re.compile(r"^\s*\.section\s+\.text\.([A-Za-z_$][\w$.]*)", re.MULTILINE)
_CUOBJDUMP_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)", re.MULTILINE)
_LABEL = re.compile(r"^(\.L_x_\d+|\.L_\w+):")
# One instruction: address, optional predicate, opcode (with modifiers), operands up to ';'.
_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+(@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_TARGET = re.compile(r"`?\(?(\.L_x_\d+|\.L_\w+)\)?`?|(0x[0-9a-fA-F]+)")


@dataclasses.dataclass(frozen=True)
class Instruction:
    addr: int
    predicate: str | None  # "@P0", "@!UP1", ... or None
    opcode: str            # with modifiers, e.g. "QGMMA.64x128x32.F32.E4M3.E4M3"
    operands: str

    @property
    def base(self) -> str:
        base = self.opcode.split(".", 1)[0]
        # A BF16 wgmma (HGMMA, k16: 32 bytes of K per row, the same tensor cycles as an e4m3 k32 QGMMA of equal N) is
        # counted as one: a BF16 GEMM's 64-wide K block is 4 of them per wave, as FP8's 128-wide one (issue 41).
        return "QGMMA" if base == "HGMMA" else base


@dataclasses.dataclass(frozen=True)
class Loop:
    """A natural loop of the control-flow graph.

    ``start`` / ``end``: indices of its header's first instruction and of its back-edge branch (inclusive);
    ``body``: indices of the instructions it counts, in address order — the loop's blocks laid out between
    ``start`` and ``end``. Blocks of the loop placed elsewhere (spin-wait retries the compiler moves out of
    line, after the ``EXIT``) are not counted: they run only when a barrier is not ready yet.
    """

    start: int
    end: int
    body: tuple[int, ...] = ()


def parse_functions(sass: str) -> dict[str, tuple[list[Instruction], dict[str, int]]]:
    """Function name -> (instructions in address order, label -> instruction index).

    Accepts ``nvdisasm -c`` (``.section .text.NAME`` headers, ``.L_x_N`` labels) and ``cuobjdump -sass``
    (``Function : NAME`` headers, absolute branch targets); text with no header is one function ``""``.
    """
    heads = [(m.start(), m.group(1)) for m in _FUNC_HEADER.finditer(sass)]
    heads += [(m.start(), m.group(1)) for m in _CUOBJDUMP_FUNC.finditer(sass)]
    heads.sort()
    if not heads:
        heads = [(0, "")]
    functions = {}
    for i, (pos, name) in enumerate(heads):
        chunk = sass[pos: heads[i + 1][0] if i + 1 < len(heads) else len(sass)]
        instrs: list[Instruction] = []
        labels: dict[str, int] = {}
        for line in chunk.splitlines():
            label = _LABEL.match(line.strip())
            if label:
                labels[label.group(1)] = len(instrs)
                continue
            m = _INSTR.match(line)
            if m:
                pred = m.group(2).strip() if m.group(2) else None
                instrs.append(Instruction(int(m.group(1), 16), pred, m.group(3), m.group(4).strip()))
        functions[name] = (instrs, labels)
    return functions


def _branch_target(instr: Instruction, labels: dict[str, int], by_addr: dict[int, int]) -> int | None:
    """Index of the instruction a branch jumps to, or None (not a direct branch / unknown target)."""
    if instr.base != "BRA":
        return None
    m = _TARGET.search(instr.operands)
    if not m:
        return None
    if m.group(1):
        return labels.get(m.group(1))
    return by_addr.get(int(m.group(2), 16))


def _always(ins: Instruction) -> bool:
    return ins.predicate is None or ins.predicate in ("@PT", "@UPT")


def _is_trap(ins: Instruction) -> bool:
    return ins.base == "BPT" and ".TRAP" in ins.opcode


def _is_waterfall(ins: Instruction) -> bool:
    """``BRA.U.ANY`` / ``BRA.DIV``: the compiler's loop around an instruction with uniform operands (e.g.
    ``ELECT`` before a TMA issued by one thread) or a divergence check, not a loop of the kernel's source."""
    return ".U.ANY" in ins.opcode or ".DIV" in ins.opcode


def _control_flow(instrs: list[Instruction], labels: dict[str, int]) -> tuple[list[int], list[list[int]]]:
    """Basic blocks (their first instruction indices, ascending) and each block's successor blocks (the
    taken branch's block first). A waterfall branch's taken edge is left out (:func:`_is_waterfall`)."""
    by_addr = {ins.addr: i for i, ins in enumerate(instrs)}
    leaders = {0}
    for i, ins in enumerate(instrs):
        target = _branch_target(ins, labels, by_addr)
        if target is not None:
            leaders.add(target)
        if (ins.base in ("BRA", "BRX", "JMP", "JMX", "EXIT", "RET") or _is_trap(ins)) and i + 1 < len(instrs):
            leaders.add(i + 1)
    starts = sorted(leaders)
    block_of = {s: b for b, s in enumerate(starts)}
    succs: list[list[int]] = []
    for b, first in enumerate(starts):
        last = (starts[b + 1] if b + 1 < len(starts) else len(instrs)) - 1
        ins = instrs[last]
        out = []
        target = _branch_target(ins, labels, by_addr)
        if target is not None and not _is_waterfall(ins):
            out.append(block_of[target])
        # Falls through unless the last instruction always leaves (an unpredicated BRA / EXIT / RET / trap; an
        # indirect BRX / JMX is treated as leaving: none of the kernels uses one in a loop). A trap must end
        # its block: ptxas lays the device-side checks' traps out of line just before the spin-wait retries.
        leaves = (ins.base in ("BRA", "EXIT", "RET") or _is_trap(ins)) and _always(ins) \
            or ins.base in ("BRX", "JMP", "JMX")
        if not leaves and b + 1 < len(starts):
            out.append(b + 1)
        succs.append(out)
    return starts, succs


def _dominators(succs: list[list[int]]) -> list[set[int]]:
    """Per block, the blocks that dominate it (iterative data flow from block 0; unreachable: all)."""
    n = len(succs)
    preds: list[list[int]] = [[] for _ in range(n)]
    for b, out in enumerate(succs):
        for s in out:
            preds[s].append(b)
    everything = set(range(n))
    dom = [everything] * n
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for b in range(1, n):
            incoming = [dom[p] for p in preds[b]]
            new = set.intersection(*incoming) | {b} if incoming else {b}
            if new != dom[b]:
                dom[b], changed = new, True
    return dom


def find_loops(instrs: list[Instruction], labels: dict[str, int]) -> list[Loop]:
    """The natural loops of a function: one per back edge (an edge to a block that dominates its source),
    whether closed by a conditional branch or by an unconditional one (a rotated loop: the exit test at the
    top, ``BRA`` back at the bottom). Waterfall branches (:func:`_is_waterfall`) close no loop: their
    instructions count in the loop around them. A branch back into a loop from an out-of-line block (a
    spin-wait retry returning) is no back edge: its target does not dominate it."""
    if not instrs:
        return []
    starts, succs = _control_flow(instrs, labels)
    dom = _dominators(succs)
    preds: list[list[int]] = [[] for _ in starts]
    for b, out in enumerate(succs):
        for s in out:
            preds[s].append(b)
    ends = [(starts[b + 1] if b + 1 < len(starts) else len(instrs)) - 1 for b in range(len(starts))]
    loops = []
    for latch, out in enumerate(succs):
        for header in out:
            if header not in dom[latch]:
                continue
            blocks, stack = {header, latch}, [latch]
            while stack:
                for p in preds[stack.pop()]:
                    if p not in blocks:
                        blocks.add(p)
                        stack.append(p)
            first, last = starts[header], ends[latch]
            if last < first:  # the latch lies before the header: count the header's span instead
                last = max(ends[b] for b in blocks)
            body = tuple(i for b in sorted(blocks) if first <= starts[b] and ends[b] <= last
                         for i in range(starts[b], ends[b] + 1))
            loops.append(Loop(first, last, body))
    return loops


def _innermost_holding(loops: list[Loop], instrs: list[Instruction], opcode: str) -> list[Loop]:
    """Loops holding ``opcode`` with no smaller such loop inside them."""
    holding = [lp for lp in loops if any(instrs[j].base == opcode for j in lp.body)]
    return [lp for lp in holding
            if not any(o is not lp and set(o.body) < set(lp.body) for o in holding)]


def classify(ins: Instruction) -> str:
    """The class (one of :data:`CLASSES` but ``total``) an instruction is counted in."""
    base = ins.base
    if base in ("QGMMA", "WARPGROUP", "FFMA", "FMUL", "FSEL", "R2UR", "SYNCS"):
        return base
    if base in _LOAD_OPS:
        return "lds_ldg"
    if base in _BRANCH_OPS:
        return "branch"
    if base.startswith("U") and not base.startswith("UTMA") and base not in ("USETMAXREG",):
        return "uniform"
    return "other"


def class_counts(body: list[Instruction]) -> dict[str, int]:
    counts = Counter(classify(ins) for ins in body)
    out = {c: counts.get(c, 0) for c in CLASSES if c != "total"}
    out["total"] = len(body)
    return out


def _is_barrier_wait(ins: Instruction) -> bool:
    """An mbarrier wait's first try (``mbarrier.try_wait.parity`` → ``SYNCS.PHASECHK.TRANS64.TRYWAIT``)."""
    return ins.base == "SYNCS" and ".PHASECHK" in ins.opcode


def _drain_gaps(body: list[Instruction]) -> list[int]:
    """Per ``WARPGROUP.DEPBAR`` in the body: instructions after it up to the next QGMMA (cyclically)."""
    gaps = []
    n = len(body)
    for i, ins in enumerate(body):
        if ins.opcode.startswith("WARPGROUP.DEPBAR"):
            for step in range(1, n + 1):
                if body[(i + step) % n].base == "QGMMA":
                    gaps.append(step - 1)
                    break
    return gaps


def _loop_report(body: list[Instruction], k_blocks: float) -> dict:
    counts = class_counts(body)
    return {
        "body_instructions": len(body),
        "k_blocks_per_iteration": k_blocks,
        "per_k_block": {c: round(v / k_blocks, 2) for c, v in counts.items()},
        "utmaldg": sum(ins.base == "UTMALDG" for ins in body),
        "qgmma": counts["QGMMA"],
    }


def _scale_warp_report(loops: list[Loop], instrs: list[Instruction], slices: int) -> dict | None:
    """The 1x32 recipe's scale warps (policy_block32.cuh): per stage, a wait on the stage's scales barrier (an mbarrier
    wait followed by ``FMUL`` products, not in a ``QGMMA`` loop), the sB staging, the products of the stage's
    ``slices`` k32 slices and their ``STS``, an arrive on the full barrier. Per K block: the instructions laid out
    from that wait to the first branch after the arrive, plus ``slices - 1`` more passes over a slice loop the
    compiler kept rolled (the innermost loop inside holding both ``FMUL`` and ``STS``)."""
    for i, ins in enumerate(instrs):
        if not _is_barrier_wait(ins):
            continue
        arrive = next((j for j in range(i + 1, len(instrs)) if instrs[j].base == "SYNCS"), None)
        if arrive is None or ".ARRIVE" not in instrs[arrive].opcode:
            continue
        section = range(i, arrive)
        if not any(instrs[j].base == "FMUL" for j in section) or any(instrs[j].base == "QGMMA" for j in section):
            continue
        end = next((j for j in range(arrive, len(instrs)) if instrs[j].base == "BRA"), len(instrs) - 1)
        inside = [lp for lp in loops if i < lp.start and lp.end < arrive
                  and any(instrs[j].base == "FMUL" for j in lp.body) and any(instrs[j].base == "STS" for j in lp.body)]
        rolled = min(inside, key=lambda lp: len(lp.body)) if inside else None
        stage = end - i + 1
        extra = (slices - 1) * len(rolled.body) if rolled else 0
        body = [instrs[j] for j in range(i, end + 1)]
        return {"per_k_block": stage + extra, "slice_loop": len(rolled.body) if rolled else 0,
                "per_k_block_by_class": class_counts(body)}
    return None


def _convert_warp_report(loops: list[Loop], instrs: list[Instruction], units_per_warp: int,
                         block_m: int, block_n: int) -> dict | None:
    """The MXFP4 conversion warps (kernels/mxfp4_convert_gemm.cuh): per K block, a stage loop (wait on the raw
    barrier, the unit loop, the per-row scales, ``fence.proxy.async``, the arrive) around the unit loop (the
    innermost loop holding ``PRMT`` and ``STS`` and no ``QGMMA`` / ``UTMALDG``; one 16-byte unit of codes per
    iteration). Static counts, every branch of a body counted (both table paths of a unit: an upper bound on what a
    folded unit issues): ``per_k_block`` = the stage loop's instructions outside the unit loop + ``units_per_warp``
    x the unit loop's. ``per_tensor_cycle``: per_k_block / the tensor time of the tile's K block (BLOCK_M x BLOCK_N
    x 128 x 2 FLOP at 8192 per clock): one conversion warp per SM sub-partition."""
    def holds(lp: Loop, op: str) -> bool:
        return any(instrs[j].base == op for j in lp.body)

    units = [lp for lp in loops if holds(lp, "PRMT") and holds(lp, "STS") and not holds(lp, "QGMMA")
             and not holds(lp, "UTMALDG")]
    inner = [lp for lp in units if not any(o is not lp and set(o.body) < set(lp.body) for o in units)]
    if not inner:
        return None
    unit = max(inner, key=lambda lp: sum(instrs[j].base == "PRMT" for j in lp.body))
    around = [lp for lp in loops if lp is not unit and set(unit.body) < set(lp.body)]
    if not around:
        return None
    stage = min(around, key=lambda lp: len(lp.body))
    outside = len(stage.body) - len(unit.body)
    per_k_block = outside + units_per_warp * len(unit.body)
    body = [instrs[j] for j in unit.body]
    return {"unit_loop": len(unit.body), "stage_outside_units": outside, "units_per_warp": units_per_warp,
            "per_k_block": per_k_block, "unit_by_class": class_counts(body),
            "per_tensor_cycle": round(per_k_block / (block_m * block_n * 128 * 2 / 8192), 3)}


def analyse_function(instrs: list[Instruction], labels: dict[str, int], *, block_m: int, block_n: int,
                     num_math_warpgroups: int, mma_chunks: int = 1, scale_slices: int = 0,
                     loop_qgmma: int | None = None, convert_units: int = 0) -> dict:
    """The math and producer loop reports of one function (see the module docstring).

    Returns ``{"math": {...} | None, "producer": {...} | None, "issue_per_tensor_cycle": float | None}``;
    a loop report has ``body_instructions, k_blocks_per_iteration, per_k_block`` (class -> count),
    ``qgmma, utmaldg`` and, for the math loop, ``drain_to_wgmma`` (list per drain),
    ``drain_to_wgmma_per_k_block`` and ``overhead_per_k_block_per_wave`` (:func:`overhead_per_wave`).
    ``scale_slices`` (the 1x32 recipe: 4): also ``"scale_warps"``, the scale warps' instructions per K block
    (:func:`_scale_warp_report`), which share the SM sub-partitions with the math warps.
    ``convert_units`` (the MXFP4 conversion kernel: the most 16-byte units one conversion warp converts per K
    block): also ``"convert_warps"`` (:func:`_convert_warp_report`).
    ``loop_qgmma``: a kernel with more than one math loop (the MXFP4 kernel's folded and general loops) names the one
    to measure by its wgmma count per iteration; the other loops holding QGMMA are reported under ``"other_math"``
    (their body instructions and QGMMA counts).
    """
    if block_m % (64 * num_math_warpgroups):
        raise ValueError(f"block_m={block_m} is not a multiple of 64 x num_math_warpgroups={num_math_warpgroups}")
    waves_m = block_m // num_math_warpgroups // 64
    loops = find_loops(instrs, labels)
    result: dict = {"math": None, "producer": None, "issue_per_tensor_cycle": None}

    math_loops = _innermost_holding(loops, instrs, "QGMMA")
    qgmma_of = lambda lp: sum(instrs[j].base == "QGMMA" for j in lp.body)
    if loop_qgmma is not None:
        chosen = [lp for lp in math_loops if qgmma_of(lp) == loop_qgmma]
        if not chosen:
            raise ValueError(f"no math loop with {loop_qgmma} QGMMA (loops hold {[qgmma_of(lp) for lp in math_loops]})")
        result["other_math"] = [{"body_instructions": len(lp.body), "qgmma": qgmma_of(lp)}
                                for lp in math_loops if qgmma_of(lp) != loop_qgmma]
        math_loops = chosen
    if math_loops:
        # The main loop: most wgmmas (an unrolled copy), then the longest body.
        lp = max(math_loops, key=lambda lp: (qgmma_of(lp), len(lp.body)))
        body = [instrs[j] for j in lp.body]
        qgmma = sum(ins.base == "QGMMA" for ins in body)
        k_blocks = qgmma / (WGMMAS_PER_K_BLOCK_PER_WAVE * waves_m * mma_chunks)
        report = _loop_report(body, k_blocks)
        report["mma_chunks"] = mma_chunks
        gaps = _drain_gaps(body)
        report["drain_to_wgmma"] = gaps
        report["drain_to_wgmma_per_k_block"] = round(sum(gaps) / k_blocks, 2)
        report["overhead_per_k_block_per_wave"] = overhead_per_wave(report)
        result["math"] = report
        result["issue_per_tensor_cycle"] = round(
            report["body_instructions"] / k_blocks * num_math_warpgroups / (block_m * block_n / 32), 3)

    producer_loops = _innermost_holding(loops, instrs, "UTMALDG")
    if producer_loops:
        lp = max(producer_loops, key=lambda lp: (sum(instrs[j].base == "UTMALDG" for j in lp.body), len(lp.body)))
        body = [instrs[j] for j in lp.body]
        # One empty-barrier wait per K block, however many TMA loads a K block takes (3 for the 1D2D kinds,
        # 4 with the 1D1D sB slice) and however many variants of them the body holds (a cluster producer has
        # both the multicast and the unicast loads of its tail row: 5 static, 3 or 4 executed).
        waits = sum(_is_barrier_wait(ins) for ins in body)
        result["producer"] = _loop_report(body, float(max(waits, 1)))
    if scale_slices:
        result["scale_warps"] = _scale_warp_report(loops, instrs, scale_slices)
    if convert_units:
        result["convert_warps"] = _convert_warp_report(loops, instrs, convert_units, block_m, block_n)
    return result


def analyse_sass(sass: str, *, block_m: int, block_n: int, num_math_warpgroups: int,
                 function: str | None = None, mma_chunks: int = 1, scale_slices: int = 0,
                 loop_qgmma: int | None = None, convert_units: int = 0) -> dict:
    """:func:`analyse_function` on one function of a disassembly (``function`` = its name; default: the
    only function, or the first one holding ``QGMMA``)."""
    functions = parse_functions(sass)
    if function is not None:
        if function not in functions:
            raise ValueError(f"function {function!r} not in the disassembly (has {sorted(functions)})")
        instrs, labels = functions[function]
    else:
        chosen = next((f for f in functions.values() if any(i.base == "QGMMA" for i in f[0])), None)
        instrs, labels = chosen or next(iter(functions.values()))
    return analyse_function(instrs, labels, block_m=block_m, block_n=block_n, num_math_warpgroups=num_math_warpgroups,
                            mma_chunks=mma_chunks, scale_slices=scale_slices, loop_qgmma=loop_qgmma,
                            convert_units=convert_units)


# ---------------------------------------------------------------------------------------- CI ceilings
CEILINGS_PATH = Path(__file__).with_name("kloop_ceilings.json")


def load_ceilings(path: Path | None = None) -> dict[str, dict[str, float]]:
    """Per-kind ceilings from :data:`CEILINGS_PATH` (``{"dense": {"issue_per_tensor_cycle": x, ...}}``)."""
    data = json.loads((path or CEILINGS_PATH).read_text())
    return {kind: limits for kind, limits in data.items() if not kind.startswith("_")}


def overhead_per_wave(math: dict) -> float:
    """Math-loop instructions per K block other than FFMA, per m64 wave (QGMMA / (4 x MMA chunks) waves per K
    block)."""
    per = math["per_k_block"]
    waves = max(per.get("QGMMA", 4) / (WGMMAS_PER_K_BLOCK_PER_WAVE * math.get("mma_chunks", 1)), 1.0)
    return round((per["total"] - per.get("FFMA", 0)) / waves, 2)


def check_ceilings(kind: str, block_m: int, analysis: dict, ceilings: dict[str, dict[str, float]],
                   block_n: int | None = None) -> list[str]:
    """Problems (empty: fine) where a kernel's loop figures exceed its kind's ceilings.

    Ceiling keys: ``issue_per_tensor_cycle_m{64,128,256}`` (per BLOCK_M: small tiles have less tensor work to
    hide bookkeeping under; ``issue_per_tensor_cycle_m{M}n{N}``, where present, for one tile: the narrowest), ``math_per_k_block`` and ``producer_per_k_block`` (total instructions per K block),
    ``overhead_per_k_block_per_wave`` (math instructions other than the promotion's FFMA, per K block and m64
    wave: independent of BLOCK_N, so it catches bookkeeping growth in wide and narrow tiles alike),
    ``drain_per_wave`` (the longest ``drain_to_wgmma`` gap: what a wave runs between its wgmma wait and the next
    wgmma, which catches work moved out from under the tensor cores at an unchanged instruction count),
    ``scale_warps_per_k_block`` (the 1x32 recipe's scale warps, :func:`_scale_warp_report`),
    ``convert_per_k_block`` (the MXFP4 conversion warps, :func:`_convert_warp_report`).
    A kind without an entry is not gated; a GEMM kernel without a math loop is a problem.
    """
    limits = ceilings.get(kind)
    if not limits:
        return []
    problems = []
    math, producer = analysis.get("math"), analysis.get("producer")
    if math is None:
        return ["K-loop analysis found no math loop (no conditional backward branch around QGMMA)"]
    tile_key = f"issue_per_tensor_cycle_m{block_m}n{block_n}"
    issue_limit = limits.get(tile_key, limits.get(f"issue_per_tensor_cycle_m{block_m}"))
    if issue_limit is not None and analysis["issue_per_tensor_cycle"] > issue_limit:
        where = f"BLOCK_M {block_m}" + (f" x BLOCK_N {block_n}" if tile_key in limits else "")
        problems.append(f"math loop issues {analysis['issue_per_tensor_cycle']} slots per tensor cycle "
                        f"> ceiling {issue_limit} ({kind}, {where})")
    overhead = overhead_per_wave(math)
    if "overhead_per_k_block_per_wave" in limits and overhead > limits["overhead_per_k_block_per_wave"]:
        problems.append(f"math loop spends {overhead} non-FFMA instructions per K block per m64 wave > ceiling "
                        f"{limits['overhead_per_k_block_per_wave']} ({kind})")
    drain = max(math.get("drain_to_wgmma") or [0])
    if "drain_per_wave" in limits and drain > limits["drain_per_wave"]:
        problems.append(f"math loop runs {drain} instructions from a wgmma wait to the next wgmma > ceiling "
                        f"{limits['drain_per_wave']} ({kind})")
    if "math_per_k_block" in limits and math["per_k_block"]["total"] > limits["math_per_k_block"]:
        problems.append(f"math loop {math['per_k_block']['total']} instructions per K block > ceiling "
                        f"{limits['math_per_k_block']} ({kind})")
    if producer is not None and "producer_per_k_block" in limits and \
            producer["per_k_block"]["total"] > limits["producer_per_k_block"]:
        problems.append(f"producer loop {producer['per_k_block']['total']} instructions per K block > ceiling "
                        f"{limits['producer_per_k_block']} ({kind})")
    # The side stages beside the math loop, each with its own ceiling: (limit key, analysis key, what is missing, who).
    for key, stage, missing, who in (
            ("scale_warps_per_k_block", "scale_warps", "scale-warp stage (products and their stores)", "scale warps"),
            ("convert_per_k_block", "convert_warps", "conversion loop (PRMT and STS outside the math loop)",
             "conversion warps")):
        if key not in limits:
            continue
        found = analysis.get(stage)
        if found is None:
            problems.append(f"K-loop analysis found no {missing} ({kind})")
        elif found["per_k_block"] > limits[key]:
            problems.append(f"{who} issue {found['per_k_block']} instructions per K block > ceiling {limits[key]} "
                            f"({kind})")
    return problems
