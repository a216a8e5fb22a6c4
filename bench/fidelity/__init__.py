"""End-to-end fidelity harness (issue 14): a small video DiT trained here on
procedural clips, and every qvattn method judged by the clips it generates
against torch's bf16 SDPA from the same noise.  Run it as a script:

    python3 bench/fidelity/run.py --help

Modules: config (the frozen settings), data (the procedural dataset), model
(the DiT), train (flow matching), sample (Euler sampler, attentions),
metrics (PSNR, SSIM, statistics), report (markdown, PNG), run (the CLI).
"""
