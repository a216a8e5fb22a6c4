/*
 * The draft call's operands other than the Q and K packs (prep_qk.cu),
 * in the packed region order (draft_internal.h gives their layout):
 *   dg_pack16t_kernel   V 16-bit, transposed per block, and its amax; with
 *                       +vsample also V's E4M3 codes, from the sampled
 *                       delta_c (qvc_stat_sample over the packed video rows)
 *   dg_scale_kernel     V's channel scales delta_c, the NVFP4 tensor scales;
 *                       with +vsample whether a head's sampled delta_c serve
 *   dg_v8_kernel        V E4M3 codes, transposed in the PV slot order (with
 *                       +vsample only the heads whose sampled scales do not)
 *   dg_fp4_rows_kernel  Q, K NVFP4 reconstructions (groups of 16 channels)
 *   dg_fp4_cols_kernel  V NVFP4 reconstructions (groups of 16 keys)
 * dg_prep launches what the plan needs.  host.cu runs dg_prep_qk (the
 * pooling and the INT8 codes with the Q and K packs: Q and K are read
 * once) on the caller's stream before the router's map, and dg_prep_rest
 * on the side stream, under the router.
 *
 * Every quantizer is the CPU's expression (src/cpu/draft.c,
 * src/formats.c) with explicit _rn intrinsics (no FMA contraction), so
 * codes and scales are bit-exact with the CPU reference.
 */
#include "prep_common.cuh"

/* ================================================================ device helpers */

/* qva_nvfp4_tensor_scale. */
static __device__ __forceinline__ float dg_tensor_scale(float amax) {
    if (!isfinite(amax)) return 1.0f;
    const float g = __fdiv_rn(amax, 2688.0f);
    return g > 0.0f ? g : 1.0f;
}

/* nvfp4_group + nvfp4_group_unscaled of src/formats.c on 16 values:
 * out = sigma * e2m1(x / (g * sigma)). */
static __device__ __forceinline__ void dg_nvfp4_group(float *x, float g) {
    float amax = 0.0f;
#pragma unroll
    for (int u = 0; u < 16; ++u) amax = fmaxf(amax, fabsf(x[u]));
    const float sigma = dg_e4m3_decode(dg_e4m3(__fdiv_rn(amax, __fmul_rn(6.0f, g))));
    const float denom = __fmul_rn(g, sigma);
#pragma unroll
    for (int u = 0; u < 16; ++u) {
        const uint32_t code = sigma == 0.0f ? 0u : dg_e2m1(__fdiv_rn(x[u], denom));
        x[u] = __fmul_rn(sigma, dg_e2m1_decode(code));
    }
}

/* BF16 bits of a value BF16 holds exactly. */
static __device__ __forceinline__ uint16_t dg_bf16_bits(float a) {
    return (uint16_t)(__float_as_uint(a) >> 16);
}

/* Tile row c stores logical word j at j ^ dg_swz(c).  A warp's column
 * write covers D/8 chunks x 256/D consecutive words (the lowest a multiple
 * of 256/D), so chunk * 256/D spreads the 32 lanes over all banks. */
static __device__ __forceinline__ int dg_swz(int c, int lg) { return (c >> 3) << (5 - lg); }

/* Logical words 4q .. 4q+3 of a swizzled tile row (s = its dg_swz, even):
 * one aligned 16-byte group, its two halves swapped when s & 2. */
static __device__ __forceinline__ uint4 dg_tile_ld(const uint32_t *row, int q, int s) {
    const uint4 u = *(const uint4 *)(row + ((4 * q) ^ (s & ~3)));
    return (s & 2) ? make_uint4(u.z, u.w, u.x, u.y) : u;
}

/* Tile word (w ^ s) of row c of the PV-order code tile holds slots 4w ..
 * 4w+3, keys k0, k0+1, k0+8, k0+9 (qvc_pv_slot_key, k0 = 16 (w/4) +
 * 2 (w%4)): keys 2j, 2j+1 are the half (key / 8) % 2 of word
 * 4 (key / 16) + (key % 8) / 2, key = 2j.  The 16-bit index of that half. */
static __device__ __forceinline__ int dg_code_half(int c, int j, int s) {
    const int key = 2 * j, w = 4 * (key >> 4) + ((key & 7) >> 1);
    return 2 * (c * (DG_KEYS / 4) + (w ^ s)) + ((key >> 3) & 1);
}

/* dg_pack16t_kernel's codes (CODES): this thread's keys 2j, 2j+1 (j = j0
 * + 16k) of channels c .. c+7, coded against dv, into the tile (free once
 * the 16-bit rows are out), then the block's [D][128] codes to out. */
static __device__ __forceinline__ void dg_codes_out(const float (&v)[4][2][8], uint32_t *tile,
                                                    int c, int j0, int lg, int D, const float *dv,
                                                    uint8_t *out) {
    float d[8], rd[8];
    bool fast = true; /* a head whose codes pass 448 is coded again (dg_v8_kernel) */
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        d[e] = __ldg(dv + c + e);
        rd[e] = __frcp_rn(d[e]);
        fast = fast && qvc_e4m3_fast_ok(d[e], rd[e]);
    }
    uint32_t w[2][8]; /* [pairs 2h, 2h+1][channel]: four codes, pair 2h low */
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float x4[4] = {v[2 * h][0][e], v[2 * h][1][e], v[2 * h + 1][0][e], v[2 * h + 1][1][e]};
            const float d4[4] = {d[e], d[e], d[e], d[e]}, r4[4] = {rd[e], rd[e], rd[e], rd[e]};
            w[h][e] = qvc_e4m3_codes4(x4, d4, r4, fast);
        }
    __syncthreads(); /* every 16-bit row has left the tile */
    uint16_t *half = (uint16_t *)tile;
    const int s = dg_swz(c, lg);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int e = 0; e < 8; ++e)
            half[dg_code_half(c + e, j0 + k * DG_RSTEP, s)] = (uint16_t)(w[k >> 1][e] >> (16 * (k & 1)));
    __syncthreads();
    uint4 *o = (uint4 *)out;
#pragma unroll
    for (int k = 0; k < 4; ++k) { /* D * 8 pieces of 16 bytes, row cc = t / 8 */
        const int t = threadIdx.x + k * 2 * D, cc = t >> 3;
        o[t] = dg_tile_ld(tile + cc * (DG_KEYS / 4), t & 7, dg_swz(cc, lg));
    }
}

/* V 16-bit transposed [blk][D][128], amax as dg_pack16_kernel.  A task is
 * keys 2j, 2j+1 x one chunk: per channel the two values are tile word j of
 * row c (little-endian: key 2j first); the tile rows then go out whole.
 * CODES (+vsample): the video blocks' E4M3 codes of V / dvs (the sampled
 * delta_c: qvc_e4m3_codes4, any |x|) into v8t as dg_v8_kernel lays them
 * out, through the same tile once the 16-bit rows have left it. */
template <int DT, int F16, bool VEC, bool CODES>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_pack16t_kernel(qvc_view x, const int32_t *pack, int64_t n_pack, int pblk, int R, uint16_t *dst,
                  float *amax, const float *dvs, uint8_t *v8t) {
    __shared__ __align__(16) uint32_t tile[128 * (DG_KEYS / 2)]; /* [c][key pair], swizzled */
    const int blk = blockIdx.x, bh = blockIdx.y, D = (int)x.D, lg = DG_CPR_LG(D);
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, j0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh);
    const int32_t *pk = pack + (int64_t)blk * DG_KEYS + 2 * j0;
    int32_t orig[4][2];
    float v[4][2][8];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h) orig[k][h] = __ldg(pk + 2 * k * DG_RSTEP + h);
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            qvc_ld8<DT, VEC>(x.data, base + (int64_t)max(orig[k][h], 0) * x.sn + c, v[k][h]);
    const int s = dg_swz(c, lg);
    float m[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int j = j0 + k * DG_RSTEP;
        dg_mask8(v[k][0], orig[k][0] >= 0);
        dg_mask8(v[k][1], orig[k][1] >= 0);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            tile[(c + e) * (DG_KEYS / 2) + (j ^ s)] = dg_pair16<F16>(v[k][0][e], v[k][1][e]);
            m[e] = fmaxf(m[e], fmaxf(fabsf(v[k][0][e]), fabsf(v[k][1][e])));
        }
    }
    __syncthreads();
    uint4 *o = (uint4 *)(dst + ((int64_t)bh * n_pack + (int64_t)blk * DG_KEYS) * D);
#pragma unroll
    for (int k = 0; k < 8; ++k) { /* D * 16 pieces of 16 bytes, row cc = t / 16 */
        const int t = threadIdx.x + k * 2 * D, cc = t >> 4;
        o[t] = dg_tile_ld(tile + cc * (DG_KEYS / 2), t & 15, dg_swz(cc, lg));
    }
    if constexpr (CODES) {
        if (blk >= pblk) dg_codes_out(v, tile, c, j0, lg, D, dvs + (int64_t)bh * D,
                                      v8t + ((int64_t)bh * R + (blk - pblk)) * D * DG_KEYS);
    }
    if (amax && blk >= pblk) dg_amax_store(m, D, lg, amax + ((int64_t)bh * R + (blk - pblk)) * D);
}

/* Per (tensor w, head): the channel amax over all regions; V's gives the
 * channel scales delta_c = amax/2.25 (1 if zero), and with NVFP4 each
 * tensor scale comes from the max over channels.  Thread = 4 channels of
 * every (DG_SCALE_THREADS / (D/4))-th region; a max in any order (values
 * >= 0, never NaN) is the serial loop's bits.  redo (+vsample): dv holds
 * the sampled delta_c, which serve where every channel's amax / delta_c
 * <= 448 (qvi_v8_prepare_carried's rule); else the head takes its own and
 * redo[bh] = 1. */
#define DG_SCALE_THREADS 512
__global__ void __launch_bounds__(DG_SCALE_THREADS)
dg_scale_kernel(const float *amax, int BH, int R, int D, int w0, int with4, int with8, float *g4,
                float *dv, int *redo) {
    __shared__ __align__(16) float red[DG_SCALE_THREADS * 4]; /* [slice][D] */
    __shared__ float wm[DG_SCALE_THREADS / 32];
    const int w = w0 + (int)blockIdx.x, bh = blockIdx.y, t = threadIdx.x;
    const int c4 = D / 4, q = t % c4, slice = t / c4, slices = DG_SCALE_THREADS / c4;
    const float4 *am = (const float4 *)(amax + ((int64_t)w * BH + bh) * R * D) + q;
    float4 m = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int a = slice; a < R; a += slices) {
        const float4 u = __ldg(am + (int64_t)a * c4);
        m.x = fmaxf(m.x, u.x), m.y = fmaxf(m.y, u.y), m.z = fmaxf(m.z, u.z), m.w = fmaxf(m.w, u.w);
    }
    *(float4 *)&red[slice * D + 4 * q] = m;
    __syncthreads();
    float cm = 0.0f, own = 1.0f;
    int serve = 1;
    const bool v8 = w == 2 && with8;
    if (t < D) {
        for (int sl = 0; sl < slices; ++sl) cm = fmaxf(cm, red[sl * D + t]);
        const float sc = __fdiv_rn(cm, 2.25f); /* v_channel_scale, no means */
        own = sc > 0.0f ? sc : 1.0f;
        if (v8 && redo) {
            const float use = dv[(int64_t)bh * D + t];
            serve = use > 0.0f && isfinite(use) && __fdiv_rn(cm, use) <= 448.0f;
        }
    }
    if (v8 && redo) { /* uniform over the CTA */
        serve = __syncthreads_and(serve);
        if (!serve && t < D) dv[(int64_t)bh * D + t] = own;
        if (t == 0) redo[bh] = !serve;
    } else if (v8 && t < D) {
        dv[(int64_t)bh * D + t] = own;
    }
    if (with4) {
        for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(DG_FULL, cm, o));
        if ((t & 31) == 0) wm[t >> 5] = cm;
        __syncthreads();
        if (t == 0) {
            float tm = 0.0f;
            for (int i = 0; i < DG_SCALE_THREADS / 32; ++i) tm = fmaxf(tm, wm[i]);
            g4[(int64_t)bh * 3 + w] = dg_tensor_scale(tm);
        }
    }
}

/* E4M3 codes of V / delta_c for one region block, transposed [D][128] in
 * the PV slot order (qvc_e4m3_codes4: the quotient by 1/delta_c and two
 * remainder steps, no division; one step for 16-bit inputs,
 * qvc_e4m3_codes4_in16).  Tile word w of row c holds slots 4w .. 4w+3 (keys
 * k0, k0+1, k0+8, k0+9 by qvc_pv_slot_key, k0 = 16 (w/4) + 2 (w%4)); a task
 * is those 4 keys x one chunk.  redo (+vsample): only the heads it marks,
 * the others' codes are dg_pack16t_kernel's. */
template <int DT, bool VEC>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_v8_kernel(qvc_view x, const int32_t *pack, int64_t prefix_pad, int R, const float *dv,
             const int *redo, uint8_t *v8t) {
    __shared__ __align__(16) uint32_t tile[128 * (DG_KEYS / 4)]; /* [c][slot quad], swizzled */
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, lg = DG_CPR_LG(D);
    if (redo && !redo[bh]) return;
    const int c = (threadIdx.x & ((1 << lg) - 1)) * 8, w0 = threadIdx.x >> lg;
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    int orig[2][4]; /* -1: a padding slot, exactly the keys >= count[a] (partition.c) */
    dg_chunk<DT, VEC> v[2][4];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int w = w0 + k * DG_RSTEP;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int slot = 4 * w + u;
            orig[k][u] = __ldg(pack + slot0 + (slot & ~31) + qvc_pv_slot_key(slot & 31));
        }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int u = 0; u < 4; ++u)
            v[k][u].load(x.data, base + (int64_t)max(orig[k][u], 0) * x.sn + c);
    float d[8], rd[8];
    bool fast = true; /* qvc_e4m3_codes4 without a division, for all 8 channels */
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        d[e] = __ldg(dv + (int64_t)bh * D + c + e);
        rd[e] = __frcp_rn(d[e]);
        fast = fast && qvc_e4m3_fast_ok(d[e], rd[e]);
    }
    const int s = dg_swz(c, lg);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int w = w0 + k * DG_RSTEP;
        float f[4][8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            v[k][u].get(f[u]);
            dg_mask8(f[u], orig[k][u] >= 0);
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float x4[4] = {f[0][e], f[1][e], f[2][e], f[3][e]};
            const float d4[4] = {d[e], d[e], d[e], d[e]}, r4[4] = {rd[e], rd[e], rd[e], rd[e]};
            /* 16-bit inputs: their own values against their amax's scale */
            tile[(c + e) * (DG_KEYS / 4) + (w ^ s)] = DT == QVA_F32 ? qvc_e4m3_codes4(x4, d4, r4, fast)
                                                                    : qvc_e4m3_codes4_in16(x4, d4, r4, fast);
        }
    }
    __syncthreads();
    uint4 *o = (uint4 *)(v8t + ((int64_t)bh * R + a) * D * DG_KEYS);
#pragma unroll
    for (int k = 0; k < 4; ++k) { /* D * 8 pieces of 16 bytes, row cc = t / 8 */
        const int t = threadIdx.x + k * 2 * D, cc = t >> 3;
        o[t] = dg_tile_ld(tile + cc * (DG_KEYS / 4), t & 7, dg_swz(cc, lg));
    }
}

/* NVFP4 of Q or K (groups of 16 channels of a row), BF16 reconstructions. */
template <int DT>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_fp4_rows_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t prefix_pad,
                   int R, const float *g4, int which, uint16_t *dst) {
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, G = D / 16, n = count[a];
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    const float g = g4[(int64_t)bh * 3 + which];
    for (int idx = threadIdx.x; idx < DG_KEYS * G; idx += DG_PREP_THREADS) {
        const int i = idx / G, grp = idx % G;
        float v[16];
        const int64_t row = i < n ? base + (int64_t)__ldg(pack + slot0 + i) * x.sn : -1;
#pragma unroll
        for (int u = 0; u < 16; ++u) v[u] = row >= 0 ? qvc_ld<DT>(x.data, row + grp * 16 + u) : 0.0f;
        dg_nvfp4_group(v, g);
        uint16_t *o = dst + (((int64_t)bh * R + a) * DG_KEYS + i) * D + grp * 16;
#pragma unroll
        for (int u = 0; u < 16; ++u) o[u] = dg_bf16_bits(v[u]);
    }
}

/* NVFP4 of V (groups of 16 keys of a channel), transposed [D][128]. */
template <int DT>
__global__ void __launch_bounds__(DG_PREP_THREADS)
dg_fp4_cols_kernel(qvc_view x, const int32_t *pack, const int32_t *count, int64_t prefix_pad,
                   int R, const float *g4, uint16_t *dst) {
    const int a = blockIdx.x, bh = blockIdx.y, D = (int)x.D, n = count[a];
    const int64_t base = qvc_head_base(x, bh), slot0 = prefix_pad + (int64_t)a * DG_KEYS;
    const float g = g4[(int64_t)bh * 3 + 2];
    for (int idx = threadIdx.x; idx < D * (DG_KEYS / 16); idx += DG_PREP_THREADS) {
        const int c = idx % D, grp = idx / D;
        float v[16];
#pragma unroll
        for (int u = 0; u < 16; ++u) {
            const int key = grp * 16 + u;
            v[u] = key < n ? qvc_ld<DT>(x.data, base + (int64_t)__ldg(pack + slot0 + key) * x.sn + c)
                           : 0.0f;
        }
        dg_nvfp4_group(v, g);
        uint16_t *o = dst + (((int64_t)bh * R + a) * D + c) * DG_KEYS + grp * 16;
#pragma unroll
        for (int u = 0; u < 16; ++u) o[u] = dg_bf16_bits(v[u]);
    }
}

/* ================================================================ launchers */

/* V 16-bit transposed and, with amax, its channel amax; with v8t (16-bit
 * inputs) also its E4M3 codes from the sampled scales dvs. */
template <int DT, int F16, bool CODES>
static void dg_launch_pack16t_as(const qvc_view &x, const qvc_draft_layout *L, int R, int BH,
                                 uint16_t *dst, float *amax, const float *dvs, uint8_t *v8t,
                                 cudaStream_t st) {
    const dim3 grid((unsigned)(L->n_pack / DG_KEYS), (unsigned)BH);
    const int pblk = (int)(L->prefix_pad / DG_KEYS);
    const int32_t *pk = L->pack_to_orig;
    const int64_t np = L->n_pack;
    const unsigned nt = 2 * (unsigned)x.D;
    if (qvc_view_vec_ok(&x, 8))
        dg_pack16t_kernel<DT, F16, true, CODES><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax, dvs, v8t);
    else
        dg_pack16t_kernel<DT, F16, false, CODES><<<grid, nt, 0, st>>>(x, pk, np, pblk, R, dst, amax, dvs, v8t);
}

template <int DT, int F16>
static void dg_launch_pack16t(const qvc_view &x, const qvc_draft_layout *L, int R, int BH,
                              uint16_t *dst, float *amax, const float *dvs, uint8_t *v8t,
                              cudaStream_t st) {
    if constexpr (DT != QVA_F32) /* +vsample takes 16-bit inputs (qvi_cuda_supports) */
        if (v8t) return dg_launch_pack16t_as<DT, F16, true>(x, L, R, BH, dst, amax, dvs, v8t, st);
    dg_launch_pack16t_as<DT, F16, false>(x, L, R, BH, dst, amax, NULL, NULL, st);
}

/* V's E4M3 codes (after dg_scale_kernel's delta_c): every head, or with
 * redo those it marks. */
template <int DT>
static void dg_launch_v8(const qvc_view &x, const qvc_draft_layout *L, const dg_ops *o,
                         const int *redo, cudaStream_t st) {
    const dim3 grid((unsigned)o->R, (unsigned)o->BH);
    const unsigned nt = 2 * (unsigned)o->D;
    const int32_t *pk = L->pack_to_orig;
    const int64_t pp = L->prefix_pad;
    if (qvc_view_vec_ok(&x, 8))
        dg_v8_kernel<DT, true><<<grid, nt, 0, st>>>(x, pk, pp, o->R, o->dv, redo, o->v8t);
    else
        dg_v8_kernel<DT, false><<<grid, nt, 0, st>>>(x, pk, pp, o->R, o->dv, redo, o->v8t);
}

/* The NVFP4 reconstructions q4, k4, v4t (after dg_scale_kernel's g4). */
static qva_status dg_prep_fp4(const qvc_draft_layout *L, const qvc_view *qv, const qvc_view *kv,
                              const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const dim3 grid((unsigned)o->R, (unsigned)o->BH);
    const int32_t *pk = L->pack_to_orig, *cnt = L->count;
    const int64_t pp = L->prefix_pad;
    const int R = o->R;
    qva_status r;
    QVC_DISPATCH_DTYPE(qv->dtype, (dg_fp4_rows_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                      *qv, pk, cnt, pp, R, o->g4, 0, o->q4)));
    if ((r = qvc_launch_check("draft prep: Q nvfp4")) != QVA_OK) return r;
    QVC_DISPATCH_DTYPE(kv->dtype, (dg_fp4_rows_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                      *kv, pk, cnt, pp, R, o->g4, 1, o->k4)));
    if ((r = qvc_launch_check("draft prep: K nvfp4")) != QVA_OK) return r;
    QVC_DISPATCH_DTYPE(vv->dtype, (dg_fp4_cols_kernel<DT_><<<grid, DG_PREP_THREADS, 0, st>>>(
                                      *vv, pk, cnt, pp, R, o->g4, o->v4t)));
    return qvc_launch_check("draft prep: V nvfp4");
}
/* V's 16-bit operand, transposed, and with amax each region's channel
 * amax into amax[2] of [3][BH][R][D]; with codes also its E4M3 codes
 * (+vsample: o->dv holds the sampled scales). */
static qva_status dg_prep_v16t(const qvi_draft_plan *pl, const qvc_draft_layout *L,
                               const qvc_view &x, dg_ops *o, float *amax, int codes,
                               cudaStream_t st) {
    const int BH = o->BH, R = o->R;
    float *am = amax ? amax + (size_t)2 * BH * R * o->D : NULL;
    uint8_t *v8t = codes ? o->v8t : NULL;
    if (pl->use_f16)
        QVC_DISPATCH_DTYPE(x.dtype, (dg_launch_pack16t<DT_, 1>(x, L, R, BH, o->v16t, am, o->dv, v8t, st)));
    else
        QVC_DISPATCH_DTYPE(x.dtype, (dg_launch_pack16t<DT_, 0>(x, L, R, BH, o->v16t, am, o->dv, v8t, st)));
    return qvc_launch_check("draft prep: 16-bit operands");
}

/* The rest once Q and K are packed (with their INT8 codes): V is read
 * once by its 16-bit pack (which also gives the channel amax of every
 * region) and once more by its E4M3 quantizer, which needs the channel
 * scales of all regions; the NVFP4 operands read Q, K, V once more.  With
 * +vsample the scales come first, from the packed video rows' sample
 * (the CPU's prep_lowbit), the pack writes the codes with them, and V is
 * read again only for a head they do not serve. */
qva_status dg_prep_rest(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                        const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const int lowbit = pl->with4 || pl->with8, sample = pl->with8 && pl->v_sample;
    qva_status r = QVA_OK;
    if (sample)
        r = qvc_stat_sample(vv, o->BH, (int64_t)o->R * DG_KEYS, L->pack_to_orig + L->prefix_pad, 0,
                            o->vs_part, o->dv, NULL, st);
    if (r == QVA_OK) r = dg_prep_v16t(pl, L, *vv, o, lowbit ? o->amax : NULL, sample, st);
    if (r != QVA_OK || !lowbit) return r;
    const int w0 = pl->with4 ? 0 : 2; /* without NVFP4 only V's channel scales */
    int *redo = sample ? o->v_redo : NULL;
    dg_scale_kernel<<<dim3((unsigned)(3 - w0), (unsigned)o->BH), DG_SCALE_THREADS, 0, st>>>(
        o->amax, o->BH, o->R, o->D, w0, pl->with4, pl->with8, o->g4, o->dv, redo);
    if ((r = qvc_launch_check("draft prep: scales")) != QVA_OK) return r;
    if (pl->with8) {
        QVC_DISPATCH_DTYPE(vv->dtype, (dg_launch_v8<DT_>(*vv, L, o, redo, st)));
        if ((r = qvc_launch_check("draft prep: V E4M3")) != QVA_OK) return r;
    }
    return pl->with4 ? dg_prep_fp4(L, qv, kv, vv, o, st) : QVA_OK;
}

qva_status dg_prep(const qvi_draft_plan *pl, const qvc_draft_layout *L, const qvc_view *qv,
                   const qvc_view *kv, const qvc_view *vv, dg_ops *o, cudaStream_t st) {
    const qva_status r = dg_prep_qk(pl, L, qv, kv, o, NULL, st);
    return r != QVA_OK ? r : dg_prep_rest(pl, L, qv, kv, vv, o, st);
}
