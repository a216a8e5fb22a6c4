/*
 * The CUDA kernel chooser (src/cuda/choose.cu) as a function of the config
 * alone: no device is needed, so this runs wherever nvcc built the backend.
 * qva_supports() and the dispatch both ask qvc_choose_kernel, so what it
 * says here is what runs on a GPU.
 */
#include "check.h"
#include "cuda_internal.h"
#include "draft/plan.h"

#include <string.h>

static qvc_kernel pick(const char *method, int64_t d, void (*edit)(qva_config *), char *why,
                       size_t len) {
    qva_config cfg;
    qva_config_default(&cfg);
    CHECK(qva_config_set_method(&cfg, method) == QVA_OK, "method %s", method);
    cfg.draft.grid_t = 2, cfg.draft.grid_h = 16, cfg.draft.grid_w = 16; /* R = 4 */
    if (edit) edit(&cfg);
    return qvc_choose_kernel(&cfg, d, 1, why, len);
}

static void warmup_step(qva_config *c) { c->draft.dense_warmup_steps = 2, c->step = 1; }
static void warmup_vc8(qva_config *c) { warmup_step(c), c->draft.warmup_method = QVA_METHOD_VC8; }
static void warmup_sage4(qva_config *c) { warmup_step(c), c->draft.warmup_method = QVA_METHOD_SAGE4; }
static void warmup_exact(qva_config *c) { warmup_step(c), c->draft.warmup_method = QVA_METHOD_EXACT; }
static void warmup_draft(qva_config *c) { warmup_step(c), c->draft.warmup_method = QVA_METHOD_DRAFT; }
static void routed_vc8(qva_config *c) { warmup_vc8(c), c->step = 2; }
static void routed_bad(qva_config *c) { warmup_draft(c), c->step = 2; }
static void mass_warmup_vc8(qva_config *c) { warmup_vc8(c), c->draft.budget = QVA_DRAFT_BUDGET_MASS; }
static void mass_cap0(qva_config *c) { c->draft.min_keep = 0.0f, c->draft.max_keep = 0.0f; }
static void mass_bad(qva_config *c) { c->draft.budget = 2; }

int main(void) {
    static const struct {
        const char *method;
        int64_t d;
        void (*edit)(qva_config *);
        qvc_kernel want;
        const char *why; /* a word of the reason (QVC_KERNEL_NONE) */
    } C[] = {
        {"bf16", 128, NULL, QVC_KERNEL_ATTN_BF16_MMA_64X128, NULL},
        {"sage8", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+expcast", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"fp8", 64, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc4", 128, NULL, QVC_KERNEL_ATTN_FP4_SIMT_64X128, NULL},
        {"exact", 128, NULL, QVC_KERNEL_NONE, "CPU"},
        {"vc8+expcast-centred", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+expcast-centred", 64, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"draft@85/0/7.5/7.5+expcast-centred", 128, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"sage8", 96, NULL, QVC_KERNEL_NONE, "zero-pad"},
        /* the row sum of the decoded P codes: the ones row, as ExpCast's */
        {"sage8", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL}, /* sums its codes by default */
        {"sage8+fp32sum", 64, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+codesum", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"fp8+codesum", 64, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        /* V in two E4M3 digits: the Hopper kernel (head dim 128) only */
        {"sage8+v2", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+expcast+v2", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+expcast+v2", 64, NULL, QVC_KERNEL_NONE, "+v2"},
        {"vc8+expcast-e5m2", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"sage8+expcast-e5m2", 64, NULL, QVC_KERNEL_NONE, "+expcast-e5m2"},
        {"fp8+expcast-e5m2", 128, NULL, QVC_KERNEL_NONE, "fp8"},
        {"vc8+expcast-e5m2+v2", 128, NULL, QVC_KERNEL_NONE, "another V code"},
        {"sage8+i8pv", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"sage8+i8pv", 64, NULL, QVC_KERNEL_NONE, "+i8pv"},
        {"vc8+i8pv", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+hadamard+i8pv", 64, NULL, QVC_KERNEL_NONE, "+i8pv"},
        {"vc8+fp32sum+i8pv", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"sage8+fp32sum+i8pv", 64, NULL, QVC_KERNEL_NONE, "+i8pv"},
        {"vc8+expcast+floormass", 128, NULL, QVC_KERNEL_NONE, "+floormass"},
        {"vc8+expcast-centred+pblock", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"sage8+pblock", 128, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"sage8+pblock", 64, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+expcast-centred+pblock", 64, NULL, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"vc8+v2+pblock", 64, NULL, QVC_KERNEL_NONE, "another V code"},
        {"vc8+v2+pblock", 128, NULL, QVC_KERNEL_NONE, "another V code"},
        {"vc8+expcast-e5m2+pblock", 128, NULL, QVC_KERNEL_NONE, "+expcast-e5m2"},
        {"sage8+expcast-centred+floormass", 64, NULL, QVC_KERNEL_NONE, "CPU reference only"},
        {"draft@85/0/0/15", 128, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@85/0/7.5/7.5+expcast+pblock", 128, NULL, QVC_KERNEL_NONE, "CPU reference only"},
        {"draft@85/0/7.5/7.5+pblock", 128, warmup_vc8, QVC_KERNEL_NONE, "+pblock"},
        {"draft@85/0/0/15+pooled", 128, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@85/0/0/15+pooled", 64, warmup_vc8, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"draft@p95+pooled", 64, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@85/0/0/15", 64, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@85/0/7.5/7.5+expcast", 64, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@50/20/15/15", 64, NULL, QVC_KERNEL_ATTN_DRAFT_MMA_64X128, NULL},
        {"draft@50/20/15/15", 128, NULL, QVC_KERNEL_ATTN_DRAFT_MMA_64X128, NULL},
        /* the adaptive budget: NVFP4 blocks when its split gives 4 bits a
         * share and some head may keep pairs (the plan's with4) */
        {"draft@p95", 128, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@p95", 64, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@p90/20/30/50", 64, NULL, QVC_KERNEL_ATTN_DRAFT_MMA_64X128, NULL},
        {"draft@p90/0/50/50", 128, NULL, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@p90/20/30/50", 128, NULL, QVC_KERNEL_ATTN_DRAFT_MMA_64X128, NULL},
        {"draft@p90/20/30/50", 128, mass_cap0, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        {"draft@p95", 128, mass_bad, QVC_KERNEL_NONE, "budget"},
        /* dense warm-up steps: bf16, or the warm-up method's own kernel */
        {"draft@85/0/0/15", 128, warmup_step, QVC_KERNEL_ATTN_BF16_MMA_64X128, NULL},
        {"draft@85/0/0/15", 128, warmup_vc8, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"draft@85/0/0/15+expcast", 64, warmup_vc8, QVC_KERNEL_ATTN8_WS_128X128, NULL},
        {"draft@85/0/0/15", 128, warmup_sage4, QVC_KERNEL_ATTN_FP4_SIMT_64X128, NULL},
        {"draft@85/0/0/15", 128, warmup_exact, QVC_KERNEL_NONE, "CPU"},
        {"draft@85/0/0/15", 128, routed_vc8, QVC_KERNEL_ATTN_DRAFT_WS_128X128, NULL},
        /* refused at every step, so one answer holds for the schedule */
        {"draft@85/0/0/15", 128, warmup_draft, QVC_KERNEL_NONE, "warmup_method"},
        {"draft@85/0/0/15", 128, routed_bad, QVC_KERNEL_NONE, "warmup_method"},
        {"draft@p95", 128, mass_warmup_vc8, QVC_KERNEL_ATTN8_WS_128X128, NULL},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; ++i) {
        char why[512] = "";
        const qvc_kernel k = pick(C[i].method, C[i].d, C[i].edit, why, sizeof why);
        CHECK(k == C[i].want, "case %zu %s d %lld: kernel %d, want %d (%s)", i, C[i].method,
              (long long)C[i].d, (int)k, (int)C[i].want, why);
        if (C[i].why)
            CHECK(strstr(why, C[i].why) != NULL, "case %zu %s: reason '%s' lacks '%s'", i,
                  C[i].method, why, C[i].why);
        else
            CHECK(!strncmp(why, "cuda: ", 6), "case %zu %s: '%s' names the kernel", i,
                  C[i].method, why);
    }
    return check_summary("cuda_test_choose");
}
