/*
 * attn_draft_ws_128x128: DraftAttention2's phased kernel on Hopper's own
 * instructions (DA2 §3.2-3.3, C.3; docs/DRAFT.md §5), head dim 128 or 64,
 * routes without an NVFP4 phase (those run attn_draft_mma_64x128; the
 * chooser, choose.cu, decides).  A block-sparse form of the dense 8-bit
 * kernel's pipeline (dense/attn8_ws_128x128.cu):
 *
 *   one CTA per (video query region a, head bh): 128 packed query rows,
 *   producer   warpgroup 0: one thread walks the route of (bh, a) -- the
 *              INT8 key regions, then every prefix block, then the 16-bit
 *              key regions -- and TMA-loads each block's K and V^T into a
 *              2-stage ring (mbarriers, 128-byte swizzle); 3 stages when
 *              no route of the call has INT8 blocks (dw_ring3).  A
 *              direct Q (a 16-bit input in the operand's format, rows on
 *              16-byte boundaries: the host decides) is gathered from the
 *              caller's tensor by the whole warpgroup first, by cp.async
 *              into the tile TMA would give, so that no packed copy of Q
 *              is made
 *   mainloop   warpgroups 1, 2, 64 query rows each, ONE online-softmax
 *              state across the phases:
 *     INT8     S = Q8 K8^T  wgmma m64n128k32 s8 (SS); P codes by exp2 or
 *              ExpCast from one FMA per score; the block's PV partial =
 *              P V8 by wgmma e4m3 (RS; with ExpCast the n136 form whose
 *              ones rows give the decoded row sum), rounded to FP16 with
 *              saturation (Table 6) and added; entered and left by the
 *              Eq. 8 unit change; the two warpgroups in ping-pong
 *     16-bit   S = Q16 K16^T wgmma m64n128k16 bf16/f16 (RS: each thread's
 *              Q fragments loaded once per item); P in 16 bits
 *              from the S registers; O += P V16 by wgmma (RS) straight into
 *              the O accumulator; the two warpgroups in ping-pong
 *   in both phases a block of >= 120 valid keys masks only its last
 *   column group; the producer loads the route ahead of its stage waits
 *   and hands each block's valid keys to the consumers in a word of its
 *   ring stage (the INT8 phase loads its scalars a block ahead itself)
 *   epilogue   O / l scattered back to the sequence order, and the LSE
 *
 * Head dim 64 (the template's D) keeps the head-dim-128 shared-memory
 * layout: Q and K rows fill the first 64-channel half of their tiles (the
 * INT8 ones a 64-byte row in a 128-byte box, zero-filled by TMA), QK takes
 * half the k-steps, V^T tiles hold 64 rows, PV runs at n64 (n72 with the
 * ExpCast ones rows, which sit at the INT8 V^T tile's row 64) and O takes
 * 32 registers.
 *
 * Prefix queries (a text prefix; DA2 C.1: dense over every valid key) run
 * in the same kernel as extra CTAs whose walk is every prefix block and
 * then every video region in 16 bits; they come first in the launch order
 * (dw_work).
 *
 * Empty lists cost nothing: the producer skips them and the consumers
 * never wait for them.  Query regions keep different numbers of key
 * blocks; with one CTA per region (24,360 at Wan2.2-720p, ~185 per SM) the
 * hardware block scheduler balances the load dynamically and the tail is
 * under one CTA's run time, so there is no persistent scheduler.
 *
 * Numerics against the CPU reference (src/cpu/draft.c), as the mma.sync
 * draft kernel except where marked:
 *   - INT8 scores exact (INT32); the P codes from one FMA per score: a code
 *     can differ by one step from the three-rounding reference
 *     (docs/NUMERICS.md);
 *   - 16-bit phase: p = exp2(s - m) by ex2.approx (2 ulp), the row sum of
 *     the FP32 p, P rounded to 16 bits; the PV product accumulates into O
 *     in the tensor core (the CPU adds a per-block FP32 partial): FP32
 *     summation order only.
 * Other schedules were tried in dev/cuda (its README says what each taught).
 */
#include "draft/attn_draft_ws.cuh"

/* ------------------------------------------------------------ kernel */
template <int F16, int EXPCAST, class L, int D>
__global__ void __launch_bounds__(DW_THREADS, 1)
attn_draft_ws_128x128(const __grid_constant__ CUtensorMap tq16,
                      const __grid_constant__ CUtensorMap tk16,
                      const __grid_constant__ CUtensorMap tv16,
                      const __grid_constant__ CUtensorMap tq8,
                      const __grid_constant__ CUtensorMap tk8,
                      const __grid_constant__ CUtensorMap tv8, const dw_params p) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t base = smem_addr(sm);
    const dw_bars b = dw_bars_at<L>(base);
    const qvc_draft_ws_args &w = p.w;
    int a, bh;
    dw_walk wk;
    dw_work(w, p.npre, a, bh, wk);
    dw_cta_init<L, EXPCAST, D>(sm, b, 0, w.direct_q);

    if (threadIdx.x < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(DW_PRODUCER_REGS));
        if (!w.direct_q) {
            if (threadIdx.x == 0) dw_producer<L, D>(tq16, tk16, tv16, tq8, tk8, tv8, w, wk, a, bh, base, b);
            return;
        }
        /* the loads in the order the consumers need them: Q8 (an INT8
         * phase comes first; the host reads Q in place only without one,
         * but the order holds either way), Q16, then the walk (bench/
         * NOTES.md, "Q read in place": K/V ahead of the gathered Q cost
         * the kernel 2.5%) */
        if (threadIdx.x == 0) dw_load_q<L, D>(tq16, tq8, w, wk, a, bh, base, b);
        dw_gather_q<D>(w, wk, a, bh, base, b);
        if (threadIdx.x == 0) dw_load_walk<L, D>(tk16, tv16, tk8, tv8, w, wk, bh, base, b, 0);
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(DW_CONSUMER_REGS));
    const int ctid = threadIdx.x - 128, cw = ctid >> 7;
    const int warp = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, tig = lane & 3;
    dw_accd<D> r;
    dw_acc_reset(r);
    r.j = 0;
    if (L::INT8 && wk.nb8) dw_int8_phase<EXPCAST>(r, w, wk, a, bh, base, b, cw, tig);
    dw_16bit_phase<F16, L>(r, w, wk, base, b, cw, tig);
    dw_epilogue(r, w, wk, a, bh, cw * 64 + warp * 16 + g, tig);
}

/* ------------------------------------------------------------ host */
template <int D>
struct dw_launch {
    template <int F16, int EXPCAST, class L>
    static qva_status go(const CUtensorMap *m, const dw_params *p, cudaStream_t st) {
        /* linear index = prefix-query CTAs, then video CTAs (dw_work) */
        const dim3 grid((unsigned)(p->w.R + p->npre), (unsigned)p->w.BH);
        return dw_launch_kernel(attn_draft_ws_128x128<F16, EXPCAST, L, D>, grid, (int)L::SMEM, m, p, st,
                                "attn_draft_ws_128x128");
    }
};

extern "C" qva_status qvc_attn_draft_ws_128x128(const qvc_draft_ws_args *w, cudaStream_t st) {
    return w->D == 64 ? dw_dispatch<dw_launch<64>, 64>(w, st)
                      : dw_dispatch<dw_launch<128>, 128>(w, st);
}
