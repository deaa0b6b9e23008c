"""The static K-loop analyser (deep_fp8_gemm/runtime/kloop.py): hand-written SASS listings with known
answers, the CI ceilings, and one real compiled kernel."""

from __future__ import annotations

import pytest

from deep_fp8_gemm.runtime import kloop


def _listing(lines: list[str], name: str = "k") -> str:
    """nvdisasm -c style text: a section header, then labels and /*addr*/ instructions (16 bytes each)."""
    out = [f"\t.section\t.text.{name},\"ax\",@progbits", f"{name}:"]
    addr = 0
    for line in lines:
        if line.endswith(":"):
            out.append(line)
        else:
            out.append(f"        /*{addr:04x}*/                   {line} ;")
            addr += 16
    return "\n".join(out) + "\n"


# A one-warpgroup math loop over one K block: wait (retry out of line), 4 wgmmas, drain, 2 FMUL, 4 FFMA.
MATH_LOOP = [
    "MOV R1, RZ",
    ".L_x_1:",
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",
    "@!P0 BRA `(.L_x_9)",
    ".L_x_2:",
    "LDS R3, [R4+0x100]",
    "WARPGROUP.ARRIVE",
    "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT",
    "UIADD3 UR8, UR8, 0x2, URZ",
    "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24",
    "UIADD3 UR8, UR8, 0x2, URZ",
    "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24",
    "UIADD3 UR8, UR8, 0x2, URZ",
    "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24, gsb0",
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",
    "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [R5+URZ], RZ",
    "FMUL R6, R3, R7",
    "FMUL R8, R3, R9",
    "FFMA R10, R24, R6, R10",
    "FFMA R11, R25, R6, R11",
    "FSEL R12, R6, R8, P1",
    "FFMA R13, R26, R12, R13",
    "FFMA R14, R27, R12, R14",
    "R2UR UR9, R15",
    "ISETP.NE.AND P2, PT, R16, RZ, PT",
    "@P2 BRA `(.L_x_1)",
    "EXIT",
    ".L_x_9:",
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",
    "@!P0 BRA `(.L_x_9)",
    "BRA `(.L_x_2)",
]


def test_math_loop_counts_by_class():
    r = kloop.analyse_sass(_listing(MATH_LOOP), block_m=64, block_n=64, num_math_warpgroups=1)
    math = r["math"]
    assert math["body_instructions"] == 23 and math["k_blocks_per_iteration"] == 1
    per = math["per_k_block"]
    assert (per["QGMMA"], per["FFMA"], per["FMUL"], per["FSEL"], per["uniform"], per["R2UR"], per["SYNCS"],
            per["lds_ldg"], per["branch"]) == (4, 4, 2, 1, 3, 1, 2, 1, 2)
    assert per["WARPGROUP"] == 2 and per["other"] == 1 and per["total"] == 23  # ARRIVE + DEPBAR; ISETP
    # After the drain: ARRIVE, 2 FMUL, 4 FFMA, FSEL, R2UR, ISETP, BRA, then around the back edge TRYWAIT,
    # BRA, LDS, WARPGROUP.ARRIVE before the first QGMMA.
    assert math["drain_to_wgmma"] == [15]
    assert r["issue_per_tensor_cycle"] == round(23 * 1 / (64 * 64 / 32), 3)
    assert r["producer"] is None


def test_unrolled_loop_is_divided_by_its_k_blocks():
    body = MATH_LOOP[2:-6]  # from the wait to the instruction before the back edge's compare
    lines = ["MOV R1, RZ", ".L_x_1:"] + body * 2 + ["ISETP.NE.AND P2, PT, R16, RZ, PT", "@P2 BRA `(.L_x_1)", "EXIT",
                                                      ".L_x_9:", "BRA `(.L_x_9)"]
    # The duplicated body's labels are harmless: only the back edge's target matters.
    r = kloop.analyse_sass(_listing(lines), block_m=64, block_n=64, num_math_warpgroups=1)
    assert r["math"]["qgmma"] == 8 and r["math"]["k_blocks_per_iteration"] == 2
    # 22 instructions per copy of the body (labels are not instructions) + compare and back edge.
    assert r["math"]["per_k_block"]["FFMA"] == 4 and r["math"]["per_k_block"]["total"] == (2 * 22 + 2) / 2
    assert r["math"]["drain_to_wgmma"] == [14, 16] and r["math"]["drain_to_wgmma_per_k_block"] == 15


def test_two_waves_per_k_block():
    # BLOCK_M 128 with one warpgroup would be 2 m64 waves: 8 wgmmas are one K block, not two.
    lines = ["MOV R1, RZ", ".L_x_1:"] + ["QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24"] * 8 + \
        ["WARPGROUP.DEPBAR.LE gsb0, 0x0", "FFMA R1, R2, R3, R1", "@P0 BRA `(.L_x_1)"]
    r = kloop.analyse_sass(_listing(lines), block_m=256, block_n=64, num_math_warpgroups=2)
    assert r["math"]["k_blocks_per_iteration"] == 1
    assert r["issue_per_tensor_cycle"] == round(11 * 2 / (256 * 64 / 32), 3)


def test_innermost_loop_and_waterfall_loops():
    lines = [
        ".L_x_0:",                       # outer tile loop
        "S2UR UR4, SR_CgaCtaId",
        ".L_x_1:",                       # producer K loop
        "SYNCS.ARRIVE.TRANS64 RZ, [UR9], R2",
        ".L_x_2:",                       # ELECT waterfall around a one-thread TMA: part of the body
        "@P0 ELECT P1, URZ, PT",
        "UTMALDG.3D [UR8], [UR26]",
        "@P0 BRA.U.ANY `(.L_x_2)",
        "UTMALDG.3D [UR16], [UR10]",
        "UTMALDG.3D [UR16], [UR12]",
        "UIADD3 UR5, UR5, 0x1, URZ",
        "@!P0 BRA `(.L_x_1)",
        "@P1 BRA `(.L_x_0)",
        "EXIT",
    ]
    loops = kloop.find_loops(*kloop.parse_functions(_listing(lines))["k"])
    assert len(loops) == 2  # the BRA.U.ANY is not a loop
    r = kloop.analyse_sass(_listing(lines), block_m=128, block_n=128, num_math_warpgroups=2)
    assert r["math"] is None and r["issue_per_tensor_cycle"] is None
    prod = r["producer"]
    assert prod["body_instructions"] == 8 and prod["utmaldg"] == 3 and prod["k_blocks_per_iteration"] == 1
    assert prod["per_k_block"]["branch"] == 3 and prod["per_k_block"]["uniform"] == 1


def test_rotated_loop():
    """A loop whose exit test sits at the top and whose back edge is an unconditional ``BRA`` (ptxas rotates
    the reference design's K = 7168 loops this way) is the math loop, not the tile loop around it; the branch
    back from the out-of-line spin-wait retry is no loop of its own."""
    lines = [
        ".L_x_0:",                                            # persistent tile loop
        "S2R R0, SR_TID.X",
        ".L_x_1:",                                            # K loop header: exit test first
        "ISETP.GE.AND P1, PT, R16, R17, PT",
        "@P1 BRA `(.L_x_3)",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",
        "@!P0 BRA `(.L_x_8)",
        ".L_x_2:",
        "WARPGROUP.ARRIVE",
        "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT",
        "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24",
        "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24",
        "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "FFMA R10, R24, R6, R10",
        "IADD3 R16, R16, 0x1, RZ",
        "BRA `(.L_x_1)",                                      # rotated back edge
        ".L_x_3:",
        "STG.E [R2.64], R10",
        "@P2 BRA `(.L_x_0)",
        "EXIT",
        ".L_x_8:",                                            # out-of-line retry
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",
        "@!P0 BRA `(.L_x_8)",
        "BRA `(.L_x_2)",
    ]
    instrs, labels = kloop.parse_functions(_listing(lines))["k"]
    loops = kloop.find_loops(instrs, labels)
    assert sorted(len(lp.body) for lp in loops) == [2, 13, 16]  # the retry, the K loop, the tile loop
    r = kloop.analyse_sass(_listing(lines), block_m=64, block_n=64, num_math_warpgroups=1)
    math = r["math"]
    # From the exit test to the back edge: 13 instructions, the retry block laid out after EXIT not counted.
    assert math["body_instructions"] == 13 and math["k_blocks_per_iteration"] == 1
    assert math["per_k_block"]["FFMA"] == 1 and math["per_k_block"]["branch"] == 3
    assert math["drain_to_wgmma"] == [8]  # FFMA, IADD3, BRA, then around: ISETP .. WARPGROUP.ARRIVE


def test_unconditional_self_loop_is_a_loop():
    lines = [".L_x_1:", "QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24", "BRA `(.L_x_1)", "@PT BRA `(.L_x_1)"]
    loops = kloop.find_loops(*kloop.parse_functions(_listing(lines))["k"])
    assert [len(lp.body) for lp in loops] == [2]  # the @PT branch after it is unreachable


def test_trap_ends_a_block():
    """A device-side check's trap laid out just before a spin-wait retry must not fall through into it, or
    the retry (and the loop it returns to) would be reachable around the loop header."""
    lines = [
        "LDG.E R5, desc[UR6][R4.64]",
        "@P3 BRA `(.L_x_7)",                                  # a failed check jumps to its trap
        ".L_x_1:",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",
        "@!P0 BRA `(.L_x_8)",
        ".L_x_2:",
        "UTMALDG.3D [UR24], [UR4]",
        "UTMALDG.3D [UR32], [UR30]",
        "UTMALDG.3D [UR16], [UR14]",
        "UTMALDG.3D [UR8], [UR22]",
        "@!P1 BRA `(.L_x_1)",
        "EXIT",
        ".L_x_7:",
        "BPT.TRAP 0x1",
        ".L_x_8:",
        "YIELD",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2",
        "@!P0 BRA `(.L_x_8)",
        "BRA `(.L_x_2)",
    ]
    r = kloop.analyse_sass(_listing(lines), block_m=128, block_n=128, num_math_warpgroups=2)
    assert r["producer"]["body_instructions"] == 7 and r["producer"]["k_blocks_per_iteration"] == 1


def test_producer_k_blocks_are_its_empty_barrier_waits():
    """One wait per K block, however many TMA loads it issues: a cluster producer holds the multicast and the
    unicast variant of its B load (5 static loads for one K block), and a 2x unrolled one two waits."""
    one = [
        ".L_x_1:",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R29+URZ+0x34278], R20",
        "@!P1 BRA `(.L_x_9)",
        ".L_x_2:",
        "UTMALDG.3D [UR8], [UR6]",
        "@P0 BRA `(.L_x_3)",
        "UTMALDG.3D.MULTICAST [UR8], [UR6], UR4",
        "BRA `(.L_x_4)",
        ".L_x_3:",
        "UTMALDG.3D [UR8], [UR4]",
        "UTMALDG.3D [UR8], [UR4]",
        ".L_x_4:",
        "UTMALDG.3D [UR16], [UR4]",
        "@!P2 BRA `(.L_x_1)",
        "EXIT",
        ".L_x_9:",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R29+URZ+0x34278], R20",
        "@!P1 BRA `(.L_x_9)",
        "BRA `(.L_x_2)",
    ]
    r = kloop.analyse_sass(_listing(one), block_m=128, block_n=128, num_math_warpgroups=2)
    prod = r["producer"]
    assert prod["utmaldg"] == 5 and prod["k_blocks_per_iteration"] == 1
    assert prod["body_instructions"] == 10 and prod["per_k_block"]["total"] == 10
    two = [".L_x_1:"] + [x for x in one[1:3] + one[4:5] + one[12:13]] * 2 + ["@!P2 BRA `(.L_x_1)", "EXIT"] + one[15:]
    r = kloop.analyse_sass(_listing(two), block_m=128, block_n=128, num_math_warpgroups=2)
    assert r["producer"]["k_blocks_per_iteration"] == 2 and r["producer"]["per_k_block"]["total"] == 4.5


def test_cuobjdump_absolute_targets():
    text = "\tFunction : k\n" + "\n".join([
        "        /*0000*/                   MOV R1, RZ ;",
        "        /*0010*/                   QGMMA.64x64x32.F32.E4M3.E4M3 R24, gdesc[UR8], R24 ;",
        "        /*0020*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
        "        /*0030*/               @P0 BRA 0x10 ;",
    ]) + "\n"
    r = kloop.analyse_sass(text, block_m=64, block_n=16, num_math_warpgroups=1)
    assert r["math"]["body_instructions"] == 3 and r["math"]["k_blocks_per_iteration"] == 0.25
    assert r["math"]["drain_to_wgmma"] == [1]


def test_unknown_function_and_bad_geometry_are_errors():
    with pytest.raises(ValueError, match="not in the disassembly"):
        kloop.analyse_sass(_listing(MATH_LOOP), block_m=64, block_n=64, num_math_warpgroups=1, function="other")
    with pytest.raises(ValueError, match="block_m"):
        kloop.analyse_sass(_listing(MATH_LOOP), block_m=96, block_n=64, num_math_warpgroups=1)


def test_ceilings():
    ceilings = {"dense": {"issue_per_tensor_cycle_m64": 0.1, "math_per_k_block": 10, "producer_per_k_block": 5}}
    r = kloop.analyse_sass(_listing(MATH_LOOP), block_m=64, block_n=64, num_math_warpgroups=1)
    problems = kloop.check_ceilings("dense", 64, r, ceilings)
    assert len(problems) == 2 and "slots per tensor cycle" in problems[0] and "23.0 instructions" in problems[1]
    assert kloop.check_ceilings("masked", 64, r, ceilings) == []  # kind without ceilings
    assert kloop.check_ceilings("dense", 64, {"math": None, "producer": None}, ceilings)  # no loop found
    loose = {"dense": {"issue_per_tensor_cycle_m64": 1.0, "math_per_k_block": 100}}
    assert kloop.check_ceilings("dense", 64, r, loose) == []
    # 23 instructions, 4 FFMA, one wave: 19 of overhead.
    assert kloop.overhead_per_wave(r["math"]) == 19 == r["math"]["overhead_per_k_block_per_wave"]
    assert kloop.check_ceilings("dense", 64, r, {"dense": {"overhead_per_k_block_per_wave": 19}}) == []
    assert "non-FFMA" in kloop.check_ceilings("dense", 64, r, {"dense": {"overhead_per_k_block_per_wave": 18}})[0]
    # The listing drains 15 instructions (test_math_loop_counts_by_class): at the ceiling passes, one below fails.
    assert kloop.check_ceilings("dense", 64, r, {"dense": {"drain_per_wave": 15}}) == []
    assert "from a wgmma wait" in kloop.check_ceilings("dense", 64, r, {"dense": {"drain_per_wave": 14}})[0]


def test_shipped_ceilings_cover_every_gemm_kind():
    ceilings = kloop.load_ceilings()
    assert set(ceilings) == {"dense", "dense_swap_ab", "contiguous", "masked", "1d1d", "k_grouped", "dense_fp8out",
                             "contiguous_fp8out", "masked_fp8out", "psum_fp8out", "contiguous_swiglu", "masked_swiglu",
                             "dense_block32", "bf16", "tf32", "mxfp4", "mxfp4_convert"}
    # The swap-AB kernels' ceilings are no looser than the plain 64-row kernel's where they are comparable.
    swap, plain = ceilings["dense_swap_ab"], ceilings["dense"]
    for key in ("math_per_k_block", "producer_per_k_block", "overhead_per_k_block_per_wave"):
        assert swap[key] <= plain[key], key
    for kind, limits in ceilings.items():
        assert limits["math_per_k_block"] > 0 and limits["producer_per_k_block"] > 0
        assert any(key.startswith("issue_per_tensor_cycle_m") for key in limits), kind
    # The loops before issue 13's diet (figures of the analyser on those kernels) must fail the gate.
    for kind, block_m, issue, total, ffma in (("dense", 128, 0.966, 309, 80), ("dense", 64, 1.453, 186, 32),
                                              ("dense", 64, 3.219, 103, 8), ("contiguous", 128, 0.981, 314, 80),
                                              ("masked", 128, 1.082, 277, 64)):
        old = {"math": {"per_k_block": {"total": total, "FFMA": ffma, "QGMMA": 4}}, "producer": None,
               "issue_per_tensor_cycle": issue}
        assert kloop.check_ceilings(kind, block_m, old, ceilings), (kind, block_m, issue)


def _compiled_loops(cfg) -> dict:
    """The K-loop analysis of ``cfg``'s compiled kernel (``kloop.analyse_sass`` on its SASS)."""
    from deep_fp8_gemm.kernels.gemm import render_source
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.runtime.sass import disassemble

    kernel = compile_kernel(cfg.kernel_name(), render_source(cfg))
    return kloop.analyse_sass(disassemble(kernel.cubin), block_m=cfg.block_m, block_n=cfg.block_n,
                              num_math_warpgroups=cfg.num_math_warpgroups, function=cfg.kernel_name(),
                              mma_chunks=cfg.mma_chunks)


def test_real_kernel():
    """One compiled kernel: the analyser finds one math and one producer loop, each within its ceiling."""
    from deep_fp8_gemm.config import get_config

    cfg = get_config(128, 4096, 7168, 1, "dense", 132)
    r = _compiled_loops(cfg)
    math, prod = r["math"], r["producer"]
    assert math["per_k_block"]["QGMMA"] == 4 * cfg.waves_m
    assert math["per_k_block"]["FFMA"] == cfg.block_n // 2 * cfg.waves_m  # one FFMA per accumulator value
    assert prod["per_k_block"]["QGMMA"] == 0 and prod["utmaldg"] >= 3
    assert len(math["drain_to_wgmma"]) == cfg.waves_m * math["k_blocks_per_iteration"]
    assert kloop.check_ceilings("dense", cfg.block_m, r, kloop.load_ceilings()) == []
    # The heuristic's issue model (config.math_issue_per_k_block) tracks the compiled loop.
    from deep_fp8_gemm.config import math_issue_per_k_block

    modelled = math_issue_per_k_block("dense", cfg.block_m, cfg.block_n)
    assert abs(modelled - math["per_k_block"]["total"]) <= 0.1 * math["per_k_block"]["total"], (modelled, math)


def test_issue_term_steers_the_heuristic(monkeypatch):
    """With the issue model inflated (the pre-diet loops issued 2-3x more), the heuristic must avoid the
    narrow tiles whose bookkeeping no longer hides under their tensor work."""
    from deep_fp8_gemm import config
    from deep_fp8_gemm.config import cost

    config.get_config.cache_clear()
    try:
        # n = 2112 (a 128-row pick today; n = 7168's is already 256 x 128, the largest tile)
        lean = config.get_config(4096, 2112, 7168, 1, "dense", 132)
        monkeypatch.setattr(cost, "_ISSUE_PER_K_BLOCK", 400)
        config.get_config.cache_clear()
        heavy = config.get_config(4096, 2112, 7168, 1, "dense", 132)
        # The pick moves to a tile with more waves per K block (the fixed per-K-block cost is shared), and
        # it moves because the model now says the lean pick is slower.
        assert (heavy.block_m, heavy.block_n) != (lean.block_m, lean.block_n)
        assert heavy.block_m > lean.block_m
        assert config.estimate_seconds(lean, 4096) > config.estimate_seconds(heavy, 4096)
    finally:
        config.get_config.cache_clear()


def _check_fp32_accumulate_loops(kind: str, cfg) -> None:
    """The wgrad kinds (per-row B scales): one FMUL (sA x sB, under the wgmma) and one FFMA per accumulator
    value, four TMA loads per K block in the producer (A, B, sA and sB), within the kind's ceilings (drain
    included), and the heuristic's issue model within 10% of the compiled loop."""
    from deep_fp8_gemm.config import math_issue_per_k_block

    r = _compiled_loops(cfg)
    math, prod = r["math"], r["producer"]
    assert math["per_k_block"]["QGMMA"] == 4 * cfg.waves_m
    assert math["per_k_block"]["FFMA"] == cfg.block_n // 2 * cfg.waves_m
    assert math["per_k_block"]["FMUL"] == cfg.block_n // 2 * cfg.waves_m
    assert prod["per_k_block"]["QGMMA"] == 0 and prod["utmaldg"] >= 4
    assert kloop.check_ceilings(kind, cfg.block_m, r, kloop.load_ceilings()) == []
    modelled = math_issue_per_k_block(kind, cfg.block_m, cfg.block_n)
    assert abs(modelled - math["per_k_block"]["total"]) <= 0.1 * math["per_k_block"]["total"], (modelled, math)


def test_real_1d1d_kernel():
    """The 1D1D family: sB TMA-loaded per stage, the loops found and within the kind's ceilings."""
    from deep_fp8_gemm.config import get_config

    _check_fp32_accumulate_loops("1d1d", get_config(7168, 7168, 4096, 1, "1d1d", 132))


def test_real_k_grouped_kernel():
    """The k-grouped kind (run-time K per group): the 1D1D math loop found in the run-time ring walk, A_g and
    B_g loaded through the per-group maps."""
    from deep_fp8_gemm.config import k_grouped_config

    _check_fp32_accumulate_loops("k_grouped", k_grouped_config(4096, 7168, 8, 132))


def _hand_count_producer(sass: str) -> tuple[int, int, int]:
    """The producer loop counted from the listing's text, independently of the analyser: the smallest span
    from a label to a conditional branch back to it that holds ``UTMALDG`` and no ``QGMMA`` (every producer
    loop of this library is laid out that way). Returns (instructions, TMA loads, barrier waits) in it."""
    lines = sass.splitlines()
    label_line = {ln.strip()[:-1]: i for i, ln in enumerate(lines) if ln.strip().startswith(".L_x_") and ln.strip().endswith(":")}
    best = None
    for i, ln in enumerate(lines):
        if " BRA " not in ln or "@" not in ln or ".U.ANY" in ln:
            continue
        target = ln.split("`(")[-1].split(")")[0]
        start = label_line.get(target)
        if start is None or start > i:
            continue
        span = [x for x in lines[start:i + 1] if x.strip().startswith("/*")]
        if any("UTMALDG" in x for x in span) and not any("QGMMA" in x for x in span):
            if best is None or len(span) < len(best):
                best = span
    assert best is not None, "no producer loop in the listing"
    return len(best), sum("UTMALDG" in x for x in best), sum("PHASECHK" in x for x in best)


@pytest.mark.parametrize("which", ["dense_cluster_multicast_b", "1d1d", "k_grouped"])
def test_producer_figure_equals_a_hand_count(which):
    """Issue 28, item 0: a K block of the producer is one empty-barrier wait, so the producer's figure per K
    block is its loop's static instruction count (one wait per iteration): the cluster producer's 5 static
    loads (multicast and unicast variants) and the wgrad producers' 4 (sB too) no longer scale it."""
    from deep_fp8_gemm.config import GemmConfig, get_config
    from deep_fp8_gemm.config import k_grouped_config
    from deep_fp8_gemm.kernels.gemm import render_source
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.runtime.sass import disassemble

    cfg = {"dense_cluster_multicast_b": lambda: GemmConfig(kind="dense", shape_n=2112, shape_k=7168, num_groups=1, block_m=128, block_n=144, num_stages=5, cluster_m=2, cluster_n=1, band_width=16, grid_size=132),
           "1d1d": lambda: get_config(7168, 7168, 4096, 1, "1d1d", 132),
           "k_grouped": lambda: k_grouped_config(4096, 7168, 8, 132)}[which]()
    sass = disassemble(compile_kernel(cfg.kernel_name(), render_source(cfg)).cubin)
    instructions, loads, waits = _hand_count_producer(sass)
    assert waits == 1 and loads == {"dense_cluster_multicast_b": 5, "1d1d": 4, "k_grouped": 4}[which]
    prod = kloop.analyse_sass(sass, block_m=cfg.block_m, block_n=cfg.block_n,
                              num_math_warpgroups=cfg.num_math_warpgroups, function=cfg.kernel_name())["producer"]
    assert prod["k_blocks_per_iteration"] == 1 and prod["utmaldg"] == loads
    assert prod["body_instructions"] == instructions == prod["per_k_block"]["total"]


def test_real_swiglu_kernel():
    """The SwiGLU kind (issue 27): its 256 columns as two m64n128 wgmma chunks per wave, so 8 QGMMA and 128 FFMA per
    K block (one per accumulator value, each chunk with its own sB block), within the kind's ceilings and the issue
    model."""
    from deep_fp8_gemm.config import get_config, math_issue_per_k_block

    cfg = get_config(32, 4096, 7168, 8, "masked_swiglu", 132)
    assert (cfg.block_n, cfg.mma_n, cfg.mma_chunks) == (256, 128, 2)
    r = _compiled_loops(cfg)
    math = r["math"]
    assert math["k_blocks_per_iteration"] == 1
    assert math["per_k_block"]["QGMMA"] == 4 * cfg.waves_m * cfg.mma_chunks
    assert math["per_k_block"]["FFMA"] == cfg.block_n // 2 * cfg.waves_m
    assert kloop.check_ceilings("masked_swiglu", cfg.block_m, r, kloop.load_ceilings()) == []
    modelled = math_issue_per_k_block("masked_swiglu", cfg.block_m, cfg.block_n)
    assert abs(modelled - math["per_k_block"]["total"]) <= 0.1 * math["per_k_block"]["total"], (modelled, math)


def test_real_mxfp4_convert_kernel():
    """The MXFP4 prefill kernel (issue 43): the folded math loop (4 wgmmas per K block), the producer loop and the
    conversion warps' report (the stage outside the unit loop + 6 units of the unit loop), within the kind's
    ceilings, which the cost model's figures (cost.MXFP4_CONVERT_ISSUE_PER_K_BLOCK) equal; a ceiling below the
    conversion's figure fails."""
    from deep_fp8_gemm.config.cost import MXFP4_CONVERT_ISSUE_PER_K_BLOCK
    from deep_fp8_gemm.kernels import mxfp4_gemm
    from deep_fp8_gemm.runtime.compiler import compile_kernel
    from deep_fp8_gemm.runtime.sass import disassemble

    cfg = mxfp4_gemm.pick_convert_config(6144, 3584, 32, "contiguous", 128)
    info = cfg.as_dict()
    name, source = mxfp4_gemm.render_source(cfg)
    r = kloop.analyse_sass(disassemble(compile_kernel(name, source).cubin), block_m=cfg.block_m, block_n=cfg.block_n,
                           num_math_warpgroups=info["num_math_warpgroups"], function=name,
                           loop_qgmma=info["kloop_qgmma"], convert_units=info["convert_units_per_warp"])
    convert = r["convert_warps"]
    assert convert["per_k_block"] == convert["stage_outside_units"] + 6 * convert["unit_loop"]
    assert convert["unit_by_class"]["QGMMA"] == 0 and convert["unit_by_class"]["total"] == convert["unit_loop"]
    assert (convert["per_k_block"], r["math"]["per_k_block"]["total"]) == MXFP4_CONVERT_ISSUE_PER_K_BLOCK[128]
    ceilings = kloop.load_ceilings()
    assert kloop.check_ceilings("mxfp4_convert", cfg.block_m, r, ceilings, cfg.block_n) == []
    tight = {"mxfp4_convert": dict(ceilings["mxfp4_convert"], convert_per_k_block=convert["per_k_block"] - 1)}
    assert "conversion warps issue" in kloop.check_ceilings("mxfp4_convert", cfg.block_m, r, tight, cfg.block_n)[0]
