// deep_fp8_gemm CPU simulator: cp.async (non-bulk) and its completion, cp.async.mbarrier.arrive.
// Part of hal/sim.hpp (included from there, in order); see its header for the execution model.
//
// PTX ISA "cp.async": the copy is asynchronous; the issuing thread learns of its completion only through
// cp.async.wait_group / wait_all or cp.async.mbarrier.arrive, whose "arrive-on operation [is] triggered on the
// completion of all prior cp.async operations initiated by the executing thread" ("cp.async.mbarrier.arrive"; .noinc:
// the arrive counts against the barrier's expected arrivals). So the copy's write into shared memory is an event of its
// own: here it lands at the end of a scheduling pass (an adversarial schedule holds some back, per thread in issue
// order), its bytes read from global memory at the issue; a cp.async.mbarrier.arrive fires once every copy the thread
// issued before it has landed, also at the end of a pass. Before, the copy happened at the issue and was credited to the
// issuing thread, so a plain mbarrier.arrive in its place passed: whoever acquired the issuer's release saw the bytes.
//
// Happens-before: each CTA has a completion "unit", a Thread record without a fiber (tid = block_x, so vector clocks
// give it one slot after the CTA's threads). A landing copy joins the issuer's clocks at the issue into the unit's, ticks
// the unit and writes the bytes as the unit (checked and recorded by the race detector as a plain write: every access to
// those bytes must be ordered before the issue, and a reader after it must be ordered after the landing); the arrive it
// triggers releases the unit's clocks into the barrier's phase at .cta scope. A reader that synchronises only with the
// issuer (a plain arrive of the issuer, a barrier) is not ordered after the landing: `race`, naming the copy's site.
#pragma once

namespace dfg::sim::detail {

// The completion unit of CTA `cta` of launch `l` (created at its first cp.async).
inline Thread& copy_unit(Launch& l, u32 cta) {
    Cta& c = l.ctas[cta];
    if (!c.copy_unit) {
        auto u = std::make_unique<Thread>();
        u->cta = cta;
        u->tid = l.cfg.block_x;
        u->kernel = l.index;
        u->gcta = c.gcta;
        u->gtid = u32(S().threads.size());
        u->copy_unit = true;
        u->clocks.strong.home = c.gcta;
        u->clocks.strong.own.assign(l.cfg.block_x + 1, 0);
        u->clocks.strong.own[l.cfg.block_x] = 1;
        u->clocks.strong.done = l.start_done;
        S().threads.push_back(u.get());
        c.copy_unit = std::move(u);
    }
    return *c.copy_unit;
}

// cp.async.ca.shared.global [dst], [src], bytes: checked at the issue (both addresses aligned to the size, the
// destination in this CTA's shared memory, the source read as a plain read now); the write lands later (land_copies).
DFG_SIM_API void cp_async_copy(void* smem_dst, const void* gmem_src, u32 bytes) {
    const u32 offset = smem_offset(smem_dst, "cp_async_4");
    check_smem_range(offset, bytes, "cp_async_4");
    check_aligned(smem_dst, bytes, "cp.async (shared destination)");
    check_aligned(gmem_src, bytes, "cp.async (global source)");
    Thread& t = me();
    const u32 site = site_id(t.site);
    if (S().races) {
        fine_access(t, reinterpret_cast<uintptr_t>(gmem_src), bytes, Access{"a cp.async read", false, false, Scope::Cta, site});
        // Plain accesses to the destination must be ordered before the issue: the copy may land any time after.
        async_access(t, reinterpret_cast<uintptr_t>(smem_dst), bytes, true, false, site, "a cp.async write");
    }
    PendingCopy copy{t.cta, offset, bytes, {}, t.tid, t.clocks, site};
    std::memcpy(copy.data, gmem_src, bytes);
    copy_unit(L(), t.cta);  // its slot exists before anyone acquires its clock
    L().pending_copies.push_back(std::move(copy));
    ++t.copies_issued;
    tick(t);  // what the issuing thread does next is not ordered before the landing
}

// cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar]: the arrive fires once this thread's earlier cp.asyncs landed.
DFG_SIM_API void cp_async_arrive(u64* bar) {
    Thread& t = me();
    const u32 offset = mbarrier_offset(bar, "cp_async_mbar_arrive");
    mbarrier_at(t.cta, offset, "cp_async_mbar_arrive");  // initialised now (its use when it fires is checked again)
    copy_unit(L(), t.cta);
    L().pending_copy_arrives.push_back(PendingCopyArrive{t.cta, offset, t.tid, t.copies_issued, site_id(t.site)});
}

// Lands the pending copies (each thread's in issue order; with `all` false an adversarial schedule holds some back),
// then fires the arrives whose copies have all landed. Runs in the scheduler: returns an error message or "".
inline std::string land_copies(bool all) {
    Launch& l = L();
    Stream& s = S();
    std::vector<u64> held;  // (cta, tid) of threads with a copy held back: their later copies wait too
    std::deque<PendingCopy> later;
    for (PendingCopy& copy : l.pending_copies) {
        const u64 key = u64(copy.cta) << 32 | copy.tid;
        if (std::find(held.begin(), held.end(), key) != held.end() || (!all && g_schedule.chance(2))) {
            held.push_back(key);
            later.push_back(std::move(copy));
            continue;
        }
        Cta& c = l.ctas[copy.cta];
        if (c.exited)
            return format("cluster lifetime: a cp.async lands in cta %u (smem+%#x), which has already exited", copy.cta,
                          copy.offset);
        Thread& unit = copy_unit(l, copy.cta);
        unit.clocks.join(copy.issuer);
        tick(unit);
        u8* dst = c.smem + copy.offset;
        if (s.races) {
            Thread* const saved = s.current;
            s.current = &unit;  // the unit makes the write: a report names it and the copy's site
            try {
                fine_access(unit, reinterpret_cast<uintptr_t>(dst), copy.bytes,
                            Access{"a cp.async write (at its completion)", true, false, Scope::Cta, copy.site});
            } catch (const SchedulerFailure&) {
                s.current = saved;
                return s.error;
            }
            s.current = saved;
        }
        std::memcpy(dst, copy.data, copy.bytes);
        ++l.threads[size_t(copy.cta) * l.cfg.block_x + copy.tid]->copies_done;
    }
    l.pending_copies.swap(later);
    std::vector<PendingCopyArrive> waiting;
    for (const PendingCopyArrive& a : l.pending_copy_arrives) {
        const Thread& issuer = *l.threads[size_t(a.cta) * l.cfg.block_x + a.tid];
        if (issuer.copies_done < a.upto) {
            waiting.push_back(a);
            continue;
        }
        Cta& c = l.ctas[a.cta];
        auto it = c.mbarriers.find(a.bar_offset);
        u64 tag = 0;
        if (!c.exited) std::memcpy(&tag, c.smem + a.bar_offset, 8);
        if (c.exited || it == c.mbarriers.end() || tag != kMbarrierTag)
            return format("cp.async.mbarrier.arrive of cta %u thread %u (%s): the mbarrier at smem+%#x is no longer "
                          "initialised (overwritten, or the CTA exited) when the copies complete",
                          a.cta, a.tid, site_text(a.site).c_str(), a.bar_offset);
        Mbarrier& mb = it->second;
        if (mb.pending == 0)
            return format("cp.async.mbarrier.arrive of cta %u thread %u (%s): arrival beyond the expected count %u on "
                          "the mbarrier at smem+%#x",
                          a.cta, a.tid, site_text(a.site).c_str(), mb.expected, a.bar_offset);
        --mb.pending;
        Thread& unit = copy_unit(l, a.cta);
        sync_release_clocks(mb.arrivals, unit.clocks, unit.gcta, unit.gtid, Scope::Cta, true,
                            "cp.async.mbarrier.arrive (.release.cta, at the copies' completion)", a.site);
        tick(unit);
        mbarrier_maybe_complete(mb);
    }
    l.pending_copy_arrives.swap(waiting);
    return "";
}

// The last thread of CTA `cta` exits: no copy may still be on its way into its shared memory.
inline void copies_exit_check(const Launch& l, u32 cta) {
    for (const PendingCopy& copy : l.pending_copies)
        if (copy.cta == cta)
            fail(format("cluster lifetime: cta %u exits while a cp.async into its shared memory (smem+%#x, issued at "
                        "%s) has not completed",
                        cta, copy.offset, site_text(copy.site).c_str()));
    for (const PendingCopyArrive& a : l.pending_copy_arrives)
        if (a.cta == cta)
            fail(format("cluster lifetime: cta %u exits while the cp.async.mbarrier.arrive of thread %u (%s) has not "
                        "fired",
                        cta, a.tid, site_text(a.site).c_str()));
}

}  // namespace dfg::sim::detail
