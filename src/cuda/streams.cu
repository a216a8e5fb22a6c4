/*
 * Fork and join of a call's independent chains of kernels (cuda_internal.h,
 * qvc_fork): two side streams that start after everything queued on the
 * caller's stream before the fork, and that the caller's stream waits for
 * at the join.  Events only, so the pattern is legal inside CUDA graph
 * capture and orders correctly against the legacy default stream.
 */
#include <string.h>

#include "cuda_internal.h"

/* The side streams take the device's greatest priority.  Their chains
 * start with small statistics kernels (the K and V samples) that the
 * codes wait for; at the caller's priority they were dispatched only
 * after the last CTA of Q's codes, which fill the GPU, and ran at Q's
 * tail with the SMs part idle.  Now they run beside Q's first wave
 * (bench/NOTES.md, "The side streams' priority": the preparation 1-2.5%
 * shorter at Wan).  A user's own streams of the greatest priority
 * compete with them as equals. */
extern "C" qva_status qvc_fork_ensure(qvc_fork *f) {
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    for (int i = 0; i < QVC_FORK_SIDES && e == cudaSuccess; ++i)
        if (!f->side[i])
            e = cudaStreamCreateWithPriority(&f->side[i], cudaStreamNonBlocking, greatest);
    for (int i = 0; i <= QVC_FORK_SIDES && e == cudaSuccess; ++i)
        if (!f->ev[i]) e = cudaEventCreateWithFlags(&f->ev[i], cudaEventDisableTiming);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "side streams");
}

extern "C" void qvc_fork_free(qvc_fork *f) {
    for (int i = 0; i < QVC_FORK_SIDES; ++i)
        if (f->side[i]) cudaStreamDestroy(f->side[i]);
    for (int i = 0; i <= QVC_FORK_SIDES; ++i)
        if (f->ev[i]) cudaEventDestroy(f->ev[i]);
    memset(f, 0, sizeof *f);
}

extern "C" qva_status qvc_fork_begin(const qvc_fork *f, cudaStream_t st) {
    cudaError_t e = cudaEventRecord(f->ev[0], st);
    for (int i = 0; i < QVC_FORK_SIDES && e == cudaSuccess; ++i)
        e = cudaStreamWaitEvent(f->side[i], f->ev[0], 0);
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "fork onto the side streams");
}

extern "C" qva_status qvc_fork_end(const qvc_fork *f, cudaStream_t st) {
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < QVC_FORK_SIDES && e == cudaSuccess; ++i) {
        e = cudaEventRecord(f->ev[1 + i], f->side[i]);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(st, f->ev[1 + i], 0);
    }
    return e == cudaSuccess ? QVA_OK : qvc_cuda_fail(e, "join the side streams");
}
