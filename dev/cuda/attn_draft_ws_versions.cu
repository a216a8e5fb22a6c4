/*
 * Versions of the block-sparse Hopper draft kernel under trial, built from
 * the library's pieces (src/cuda/draft/attn_draft_ws.cuh); the driver
 * (driver.c) runs each through the library's router and preparation and
 * checks it against the CPU reference.  README.md says how to add one and
 * how to promote it.
 *
 *   dw10  the 16-bit phase software-pipelined in FA3's form: QK(i) and
 *         PV(i-1) in flight together, the exponentials of block i written
 *         over the S registers in FP32 under PV(i-1), P packed to 16 bits
 *         and O rescaled after PV(i-1) lands (no register a running wgmma
 *         reads is written)
 *   dw11  dw10 with the two warpgroups taking turns to issue (dw7's named
 *         barriers): FA3's configuration
 * dw10 and dw11, first run (H200, 2026-12-02): within the tolerances of the
 * CPU reference, and 2.3% slower than the library kernel at Wan2.2-720p,
 * draft@85/0/0/15 (39.2 ms against 38.2, full calls).
 *   dw16  the library kernel made persistent: one CTA per SM takes work
 *         items from a global counter; the producer loads the next item's
 *         Q (and its first K/V blocks, the ring running on across items)
 *         while the consumers finish the current item's last blocks and
 *         write its output, so the CTA prologue (Q, the first K/V, the first
 *         QK: 2.7% of the samples at the first iteration, bench/NOTES.md)
 *         is no longer exposed once per item.  First run (H200,
 *         2026-12-03): 0.92-0.95x the library kernel, from the lost uniform
 *         registers (below); with them back, 0.99x at 85/0/0/15 and
 *         1.01x with every kept block in INT8 (15/0): no gain.  Kept as the
 *         persistent frame; bench/NOTES.md has the runs.
 * dw17-dw19 (row sums on the tensor core; dw16 + dw17; dw17 + a lazy
 * rescale) lost and left the folder: git show b1163e3 has them.
 * dw28 (the INT8 phase's O rescale after the PV and next QK issue) ran
 * as fast as the library and left the folder; it is at 3488159.
 * dw12 (the route's scalars loaded ahead), dw13 (+ near-full blocks mask
 * one column group), dw14 (+ dw9's INT8 ping-pong) and dw15 (+ a 3-stage
 * ring without INT8 blocks) were promoted: git history has dw12, dw13,
 * dw15 at fc2461c..eed0b14 and dw9, dw14 at 205e7db.
 */
#include "draft/attn_draft_ws.cuh"

/* p = 2^(x f - m) written over the scores (keys >= valid give 0), with
 * the row sums; the 16-bit packing comes later. */
static __device__ __forceinline__ void exp16_inplace(float (&s)[64], float f, const float *m,
                                                     int valid, int tig, float *rs) {
    const float m0 = -qvc_softmax_shift(m[0]), m1 = -qvc_softmax_shift(m[1]);
    const int lim = valid - 2 * tig;
    float r0 = 0.0f, r1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
        const bool v0 = nt * 8 < lim, v1 = nt * 8 + 1 < lim;
        s[nt * 4 + 0] = v0 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 0], f, m0)) : 0.0f;
        s[nt * 4 + 1] = v1 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 1], f, m0)) : 0.0f;
        s[nt * 4 + 2] = v0 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 2], f, m1)) : 0.0f;
        s[nt * 4 + 3] = v1 ? ex2_ftz(__fmaf_rn(s[nt * 4 + 3], f, m1)) : 0.0f;
        r0 += s[nt * 4 + 0] + s[nt * 4 + 1];
        r1 += s[nt * 4 + 2] + s[nt * 4 + 3];
    }
    rs[0] = qvc_quad_sum(r0);
    rs[1] = qvc_quad_sum(r1);
}

/* The probabilities in 16 bits as the PV A fragments (probs16_fused's layout). */
template <int F16>
static __device__ __forceinline__ void pack_p16(const float (&s)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
        const float *lo = s + 8 * kk, *hi = lo + 4;
        pa[kk][0] = qvc_pack2<F16>(lo[0], lo[1]);
        pa[kk][1] = qvc_pack2<F16>(lo[2], lo[3]);
        pa[kk][2] = qvc_pack2<F16>(hi[0], hi[1]);
        pa[kk][3] = qvc_pack2<F16>(hi[2], hi[3]);
    }
}

/* dw10 / dw11 (PP): the 16-bit phase with QK(i) and PV(i-1) in flight
 * together; P of block i-1 waits in pa. */
template <int F16, int PP>
static __device__ __forceinline__ void dw10_16bit_phase(dw_acc &r, const qvc_draft_ws_args &w,
                                                        const dw_walk &wk, uint32_t base,
                                                        dw_bars b, int cw, int tig) {
    const int nb16 = wk.total - wk.nb8;
    mbar_wait(b.q16, 0);
    if (nb16 <= 0) return;
    const int ctid = threadIdx.x - 128;
    uint32_t qf[8][4];
    load_q16_frags<128>(base + DW_Q16_OFF, (ctid >> 5) * 16 + ((ctid & 31) >> 2), tig, qf);
    uint32_t pa[8][4];
    int sp = r.j % DW_STAGES; /* stage of the block whose P is in pa */
    {
        float sacc[64];
        mbar_wait(b.full + 8 * sp, (r.j / DW_STAGES) & 1);
        const int valid = (int)ld_shared_u32(base + dw_ring2::valid(sp));
        issue_qk16<F16>(sacc, qf, base + DW_K_OFF(sp));
        wg_wait<0>();
        reg_fence(sacc);
        float mx[2], rs[2];
        raw_max16(sacc, w.scale_log2, valid, tig, r.m, mx);
        qvc_softmax_raise<QVC_SM_SKIP_UNCHANGED>(mx, r.m, r.l, qvc_rows_of(r.o));
        probs16_fused<F16>(sacc, w.scale_log2, r.m, valid, tig, rs, pa);
        r.l[0] += qvc_quad_sum(rs[0]);
        r.l[1] += qvc_quad_sum(rs[1]);
        ++r.j;
    }
    if (PP && cw == 1) named_arrive(1, 256);
    for (int i = 1; i < nb16; ++i, ++r.j) {
        const int s = r.j % DW_STAGES;
        float sacc[64];
        mbar_wait(b.full + 8 * s, (r.j / DW_STAGES) & 1);
        const int valid = (int)ld_shared_u32(base + dw_ring2::valid(s));
        if (PP) named_sync(1 + cw, 256);
        issue_qk16<F16>(sacc, qf, base + DW_K_OFF(s));
        issue_pv16<F16>(r.o, pa, base + DW_V_OFF(sp));
        if (PP) named_arrive(2 - cw, 256);
        wg_wait<1>(); /* QK(i) done, PV(i-1) may still run */
        reg_fence(sacc);
        float mx[2], alpha[2], rs[2];
        raw_max16(sacc, w.scale_log2, valid, tig, r.m, mx);
        qvc_softmax_new_max<0>(mx, r.m, r.l, alpha);
        exp16_inplace(sacc, w.scale_log2, r.m, valid, tig, rs);
        wg_wait<0>();
        reg_fence(r.o);
        mbar_arrive(b.empty + 8 * sp);
        qvc_softmax_rescale<QVC_SM_SKIP_UNCHANGED>(qvc_rows_of(r.o), alpha);
        r.l[0] += rs[0];
        r.l[1] += rs[1];
        pack_p16<F16>(sacc, pa);
        sp = s;
    }
    if (PP && cw == 0) named_sync(1, 256); /* warpgroup 1's last arrive */
    issue_pv16<F16>(r.o, pa, base + DW_V_OFF(sp));
    wg_wait<0>();
    reg_fence(r.o);
    mbar_arrive(b.empty + 8 * sp);
}

/* The library kernel's frame with the version's phases. */
template <int F16, int EXPCAST, int VER>
__global__ void __launch_bounds__(DW_THREADS, 1)
dev_draft_ws_kernel(const __grid_constant__ CUtensorMap tq16, const __grid_constant__ CUtensorMap tk16,
                    const __grid_constant__ CUtensorMap tv16, const __grid_constant__ CUtensorMap tq8,
                    const __grid_constant__ CUtensorMap tk8, const __grid_constant__ CUtensorMap tv8,
                    const dw_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const dw_bars b = dw_bars_at<dw_ring2>(base);
    const qvc_draft_ws_args &w = p.w;
    int a, bh;
    dw_walk wk;
    dw_work(w, p.npre, a, bh, wk);
    dw_cta_init<dw_ring2, EXPCAST>(sm, b, 0);
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(DW_PRODUCER_REGS));
        if (threadIdx.x == 0) dw_producer<dw_ring2>(tq16, tk16, tv16, tq8, tk8, tv8, w, wk, a, bh, base, b);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(DW_CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7;
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    dw_acc r;
    dw_acc_reset(r);
    r.j = 0;
    if (wk.nb8) dw_int8_phase<EXPCAST>(r, w, wk, a, bh, base, b, cw, tig);
    if (VER >= 10 && VER <= 11)
        dw10_16bit_phase<F16, VER == 11>(r, w, wk, base, b, cw, tig);
    else
        dw_16bit_phase<F16, dw_ring2>(r, w, wk, base, b, cw, tig);
    dw_epilogue(r, w, wk, a, bh, cw * 64 + warp * 16 + g, tig);
}

/* dw10 / dw11 run their ring2 frame whatever the ring dw_dispatch picks
 * (a route without INT8 blocks runs fine on it). */
template <int VER>
struct launch_version {
    template <int F16, int EXPCAST, class L>
    static qva_status go(const CUtensorMap *m, const dw_params *p, cudaStream_t st) {
        const dim3 grid((unsigned)(p->w.R + p->npre), (unsigned)p->w.BH);
        return dw_launch_kernel(dev_draft_ws_kernel<F16, EXPCAST, VER>, grid, DW_SMEM_BYTES, m, p, st,
                                "dev draft ws");
    }
};

extern "C" qva_status dev_draft_ws_dw10(const qvc_draft_ws_args *w, cudaStream_t st) {
    return dw_dispatch<launch_version<10> >(w, st);
}
extern "C" qva_status dev_draft_ws_dw11(const qvc_draft_ws_args *w, cudaStream_t st) {
    return dw_dispatch<launch_version<11> >(w, st);
}

/* ------------------------------------------------------------ dw16 */
/* The item counter of dw16's launches (reset before each launch). */
static __device__ int g_dw16_next;

/* Past the ring's mbarriers: the "Q free" mbarrier (every consumer thread
 * arrives once its item's last wgmma is done: Q16 and Q8 may be
 * overwritten) and the item index the producer publishes with Q16. */
template <class L>
struct dw16_extra {
    static constexpr uint32_t QFREE = L::BAR + 96, ITEM = L::BAR + 104; /* past the valid words */
    static constexpr uint32_t SMEM = L::SMEM;
};

/* dw16's producer: items from the counter until it passes n_items, each
 * as dw_producer<L> loads one, the ring position j running on across
 * items.  Q16's mbarrier completes once per item (the end sentinel too);
 * Q8's once per item that has INT8 blocks. */
template <class L>
static __device__ __forceinline__ void dw16_producer(const CUtensorMap &tq16, const CUtensorMap &tk16,
                                                     const CUtensorMap &tv16, const CUtensorMap &tq8,
                                                     const CUtensorMap &tk8, const CUtensorMap &tv8,
                                                     const dw_params &p, int64_t n_items,
                                                     uint8_t *sm, uint32_t base, dw_bars b) {
    typedef dw16_extra<L> X;
    const qvc_draft_ws_args &w = p.w;
    volatile int *item = (volatile int *)(sm + X::ITEM);
    int64_t j = 0;
    for (int it = 0;; ++it) {
        if (it > 0) mbar_wait(base + X::QFREE, (it - 1) & 1); /* Q16 / Q8 free */
        const int idx = atomicAdd(&g_dw16_next, 1);
        *item = idx;
        if (idx >= n_items) {
            mbar_arrive(b.q16); /* the end: no bytes, the phase completes */
            return;
        }
        int a, bh;
        dw_walk wk;
        dw_work_at(w, p.npre, idx, a, bh, wk);
        dw_load_q<L>(tq16, tq8, w, wk, a, bh, base, b);
        dw_load_walk<L>(tk16, tv16, tk8, tv8, w, wk, bh, base, b, j);
        j += wk.total;
    }
}

/* dw16: the library kernel's phases and epilogue over the items of one
 * persistent CTA. */
template <int F16, int EXPCAST, class L>
__global__ void __launch_bounds__(DW_THREADS, 1)
dev_draft_ws_persist(const __grid_constant__ CUtensorMap tq16, const __grid_constant__ CUtensorMap tk16,
                     const __grid_constant__ CUtensorMap tv16, const __grid_constant__ CUtensorMap tq8,
                     const __grid_constant__ CUtensorMap tk8, const __grid_constant__ CUtensorMap tv8,
                     const dw_params p) {
    typedef dw16_extra<L> X;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const dw_bars b = dw_bars_at<L>(base);
    const qvc_draft_ws_args &w = p.w;
    const int64_t n_items = (int64_t)(w.R + p.npre) * w.BH;
    dw_cta_init<L, EXPCAST>(sm, b, base + X::QFREE);
    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(DW_PRODUCER_REGS));
        if (threadIdx.x == 0) dw16_producer<L>(tq16, tk16, tv16, tq8, tk8, tv8, p, n_items, sm, base, b);
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(DW_CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7;
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    const volatile int *item = (const volatile int *)(sm + X::ITEM);
    dw_acc r;
    r.j = 0;
    uint32_t n8 = 0; /* items with INT8 blocks so far: Q8's phase */
    for (uint32_t it = 0;; ++it) {
        mbar_wait(b.q16, it & 1); /* Q16 landed, or the end */
        /* The item index through a shuffle and the exit through a vote, and
         * the warp reconverged after the epilogue: otherwise ptxas cannot
         * prove the loop warp-uniform, and the 16-bit loop moves its
         * descriptors and ring indices out of the uniform registers (1,248
         * SASS instructions per iteration against the library's 1,143;
         * 8% slower at Wan2.2-720p). */
        const int idx = __shfl_sync(0xffffffffu, *item, 0);
        if (__all_sync(0xffffffffu, idx >= n_items)) break;
        int a, bh;
        dw_walk wk;
        dw_work_at(w, p.npre, idx, a, bh, wk);
        dw_acc_reset(r);
        if (L::INT8 && wk.nb8) dw_int8_phase<EXPCAST>(r, w, wk, a, bh, base, b, cw, tig, n8++ & 1);
        dw_16bit_phase<F16, L>(r, w, wk, base, b, cw, tig, it & 1);
        mbar_arrive(base + X::QFREE); /* every wgmma of the item is done */
        dw_epilogue(r, w, wk, a, bh, cw * 64 + warp * 16 + g, tig);
        __syncwarp();
    }
}

struct launch_persist {
    template <int F16, int EXPCAST, class L>
    static qva_status go(const CUtensorMap *m, const dw_params *p, cudaStream_t st) {
        int dev = 0, sms = 0;
        void *next = NULL;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess) e = cudaGetSymbolAddress(&next, g_dw16_next);
        if (e == cudaSuccess) e = cudaMemsetAsync(next, 0, sizeof(int), st);
        if (e != cudaSuccess) return qvc_cuda_fail(e, "dev draft ws persist setup");
        return dw_launch_kernel(dev_draft_ws_persist<F16, EXPCAST, L>, dim3((unsigned)sms),
                                (int)dw16_extra<L>::SMEM, m, p, st, "dev draft ws persist");
    }
};

extern "C" qva_status dev_draft_ws_dw16(const qvc_draft_ws_args *w, cudaStream_t st) {
    return dw_dispatch<launch_persist>(w, st);
}
