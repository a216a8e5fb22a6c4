/*
 * What the two selects of the draft router share (router_select.cu, the
 * count select of each head's boundaries; router_mass.cu, the MASS
 * budget's weighted select): the first digit's width, the shared-memory
 * adds of their bins and the reader of a head's keys.
 */
#ifndef QVATTN_CUDA_DRAFT_ROUTER_SELECT_CUH
#define QVATTN_CUDA_DRAFT_ROUTER_SELECT_CUH

#include "router_internal.cuh"

/* The first digit's width (-D for trials, 9 to 14): the sign, the
 * exponent and the top mantissa bits of the map's value.  The map's values
 * are probabilities whose top 8 bits fall in a handful of bins, so an
 * 8-bit first digit hardly narrows and the map is read three times.  12
 * bits narrow the boundary's bin to an eighth of an octave: on CPU maps at
 * Wan's 609 regions it held 7-8 K keys of a CTA's half on most heads (the
 * list holds 12,288), so the second pass lists them.  14 bits narrow more
 * but cost more in the first pass than they save (the warp's adds to one
 * bin combine less often, and four times the bins); measured on the H100
 * (NOTES): 154 -> 132 us at 12 bits, 139 at 14, at Wan. */
#ifndef DR_SEL_WIDE_BITS
#define DR_SEL_WIDE_BITS 12
#endif
#define DR_SEL_WIDE_BINS (1 << DR_SEL_WIDE_BITS)

/* x >> n for n in [0, 32]. */
static __device__ __forceinline__ uint32_t dr_shr32(uint32_t x, int n) {
    return n >= 32 ? 0u : x >> n;
}

/* h[addr] += v where p, addr a shared-window address: no branch around
 * the add, and no address made from the generic one at each add. */
static __device__ __forceinline__ void dr_red_shared(uint32_t addr, unsigned v, bool p) {
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %2, 0;\n\t"
                 "@q red.shared::cta.add.u32 [%0], %1;\n\t}\n" ::"r"(addr),
                 "r"(v), "r"((int)p)
                 : "memory");
}

/*
 * How a pass reads the keys [lo, hi) of one head in global memory: 16-byte
 * loads from the first 16-byte boundary a0 on (nv vectors, DR_SPAN_U per
 * thread in flight), the few keys before a0 and from a1 on in one more
 * round.  Every lane runs the same trip count, as the first passes' warp
 * votes need.  Both the count and the weighted passes read this way.
 */
#define DR_SPAN_U 4
typedef struct dr_span {
    const uint32_t *Ab;
    int lo, hi, a0, nv, a1;
} dr_span;

static __device__ __forceinline__ dr_span dr_span_of(const uint32_t *Ab, int lo, int hi) {
    dr_span sp;
    sp.Ab = Ab, sp.lo = lo, sp.hi = hi;
    sp.a0 = min(hi, lo + (int)((16u - ((uintptr_t)(Ab + lo) & 15u)) & 15u) / 4);
    sp.nv = (hi - sp.a0) / 4, sp.a1 = sp.a0 + 4 * sp.nv;
    return sp;
}

/* The thread's DR_SPAN_U vectors of the round at vector b (zeros past nv). */
static __device__ __forceinline__ void dr_span_load(const dr_span &sp, int b,
                                                    uint4 (&q)[DR_SPAN_U]) {
    const uint4 *Av = (const uint4 *)(sp.Ab + sp.a0);
#pragma unroll
    for (int u = 0; u < DR_SPAN_U; ++u) {
        const int j = b + u * DR_SEL_THREADS + (int)threadIdx.x;
        q[u] = j < sp.nv ? __ldg(Av + j) : make_uint4(0u, 0u, 0u, 0u);
    }
}

/* The thread's key of the last round (before a0 or from a1 on, each fewer
 * than 4): its index into *i, its bits (0 where none, *in false). */
static __device__ __forceinline__ uint32_t dr_span_rest(const dr_span &sp, int *i, bool *in) {
    const int tid = (int)threadIdx.x, head = sp.a0 - sp.lo, tail = sp.hi - sp.a1;
    *i = tid < head ? sp.lo + tid : sp.a1 + tid - head;
    *in = tid < head + tail;
    return *in ? __ldg(sp.Ab + *i) : 0u;
}

/* The weighted select of the MASS budget (router_mass.cu), launched by
 * qvc_dr_select_mass (router_select.cu). */
__global__ void __launch_bounds__(DR_SEL_THREADS, 1)
dr_mass_select_kernel(const float *A, long long M, dr_mass_params mp, dr_sel *sel,
                      int64_t *head_quota /* [BH][4] */);

#endif
