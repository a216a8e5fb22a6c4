/*
 * V's E4M3 codes with per-channel scales (v_mode 0: sage8, vc8 and their
 * V-Smooth steps) from 16-bit inputs that allow 16-byte loads: the common
 * case of v_encode_kernel (v.cu), whose codes it gives bit for bit (the
 * same float operations); qvc_prep_v8 chooses (qvc_v_plain_ok).
 *
 *   v_plain_kernel<DT,D>  one CTA of 256 threads per (128-key block, bh),
 *                         as qk_plain.cu: a lane holds 8 adjacent
 *                         channels, each thread loads all of its keys of
 *                         the block before the first is used, keeps them
 *                         packed, then subtracts the block mean (if
 *                         demeaned) and encodes into the shared-memory tile
 *                         that v_tile_write_t writes out transposed.
 *
 * Why: v_encode_kernel's lane of 4 channels reloaded its scales and
 * reciprocals per 4 values and issued one load at a time; it ran at
 * 35-40% of DRAM bandwidth with 75-80% of the issue slots busy.
 */
#include <math.h>
#include <stdint.h>

#include "common/quant_code.cuh"
#include "prep_common.cuh"

#define VP_CPL PLAIN_CPL

template <int DT, int D>
__global__ void __launch_bounds__(PREP_THREADS, 3)
v_plain_kernel(v_plain_params p) {
    using G = plain_geom<D>;
    __shared__ __align__(16) uint8_t tile[QVI_BLOCK * TILE_STRIDE];
    const int blk = blockIdx.x, bh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = (lane % G::LPR) * VP_CPL;
    const int key0 = warp * G::RPW + lane / G::LPR; /* key of step 0 in the block */
    const int i0 = blk * QVI_BLOCK + key0;
    const int64_t base = qvc_head_base(p.v, bh);

    /* ---- producer: every key of the thread, in flight at once */
    uint4 raw[G::STEPS];
    plain_load_rows<D>(p.v, p.perm, bh, p.n, base, i0, c0, raw);

    /* the lane's channel scales, their reciprocals and the block's means */
    float cs[VP_CPL], rcp[VP_CPL], mu[VP_CPL];
    plain_load8f(p.chan + (int64_t)bh * D + c0, cs); /* both runs in flight before any use */
    if (p.bmu)
        plain_load8f(p.bmu + ((int64_t)bh * p.nblk + blk) * D + c0, mu);
    else
#pragma unroll
        for (int e = 0; e < VP_CPL; ++e) mu[e] = 0.0f;
    bool fast = true;
#pragma unroll
    for (int e = 0; e < VP_CPL; ++e) {
        rcp[e] = __frcp_rn(cs[e]);
        fast = fast && qvc_e4m3_fast_ok(cs[e], rcp[e]);
    }

    /* ---- codes into the tile, 8 bytes per lane and key (two stores: the
     * stride keeps 4-byte alignment only) */
#pragma unroll
    for (int s = 0; s < G::STEPS; ++s) {
        const int key = key0 + s * G::RPC;
        uint32_t lo = 0, hi = 0; /* padding keys: code 0 */
        if (blk * QVI_BLOCK + key < p.n) {
            float x[VP_CPL];
            qvc_widen8<DT>(raw[s], x);
            if (p.bmu) {
#pragma unroll
                for (int e = 0; e < VP_CPL; ++e) x[e] = __fsub_rn(x[e], mu[e]);
            }
            lo = qvc_e4m3_codes4(x, cs, rcp, fast);
            hi = qvc_e4m3_codes4(x + 4, cs + 4, rcp + 4, fast);
        }
        uint32_t *t = (uint32_t *)(tile + key * TILE_STRIDE + c0);
        t[0] = lo;
        t[1] = hi;
    }
    __syncthreads();

    /* ---- epilogue */
    v_tile_write_t<D>(tile, p.v_t + ((int64_t)bh * p.nblk + blk) * D * QVI_BLOCK);
    if (threadIdx.x == 0) p.v_blk[(int64_t)bh * p.nblk + blk] = 1.0f;
}

bool qvc_v_plain_ok(const qvc_view *v, int mode) {
    return mode == 0 && (v->D == 64 || v->D == 128) &&
           (v->dtype == QVA_BF16 || v->dtype == QVA_F16) && qvc_view_vec_ok(v, VP_CPL);
}

void qvc_v_plain_launch(const v_plain_params &p, int BH, cudaStream_t st) {
    const dim3 grid((unsigned)p.nblk, (unsigned)BH);
    if (p.v.dtype == QVA_BF16) {
        if (p.v.D == 64) v_plain_kernel<QVA_BF16, 64><<<grid, PREP_THREADS, 0, st>>>(p);
        else v_plain_kernel<QVA_BF16, 128><<<grid, PREP_THREADS, 0, st>>>(p);
    } else {
        if (p.v.D == 64) v_plain_kernel<QVA_F16, 64><<<grid, PREP_THREADS, 0, st>>>(p);
        else v_plain_kernel<QVA_F16, 128><<<grid, PREP_THREADS, 0, st>>>(p);
    }
}
