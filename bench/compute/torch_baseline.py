#!/usr/bin/env python3
"""PyTorch-eager baseline for `starling bench compute`: the same training step, timed the same way.

    /usr/bin/python3 bench/compute/torch_baseline.py --preset gpt2-mini --batch 8 --threads 2 \\
        [--steps 10 --warmup 3 --seq-len 0]

Trains python/reference_model.py (same architecture, parameter shapes and init scheme as the C++
model) on one fixed batch of random tokens: each step zeroes the gradients, runs forward and
backward, clips the global gradient norm to 1.0 and takes a torch.optim.AdamW step (lr 1e-4,
betas 0.9/0.95, weight decay 0.1 on matrices and embeddings only), which is what
src/starling/train/compute_bench.cpp does. The `--warmup` steps are untimed; the `--steps` after
them are timed together.

Output: one JSON line with the keys `starling bench compute --json` prints (impl "torch",
preset, batch, seq_len, threads, tokens_per_s, step_ms, mfu, peak_gflops) plus steps, warmup,
flops_per_token, params, the last loss and the torch version. Where:
  tokens_per_s  batch * seq_len * steps / time of the timed steps
  step_ms       time of the timed steps / steps
  peak_gflops   the process's sustained fp32 matmul rate: a 1024x1024 @ 1024x1024 torch.mm
                (2*1024^3 FLOPs) repeated for 0.3 s after the training steps, with the same
                thread setting, best single repetition kept. CPUs publish no usable peak, so
                "peak" means the best this process's BLAS can do; it is the probe that
                compute_bench.cpp runs too.
  mfu           tokens_per_s * flops_per_token / (peak_gflops * 1e9), flops_per_token being
                ModelConfig::train_flops_per_token (config.cpp), mirrored in reference_model.py.
"""

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Tests run these scripts from the source tree; keep it free of __pycache__.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import reference_model as rm  # noqa: E402

MODEL_SEED, BATCH_SEED = 1337, 1  # the seeds compute_bench.cpp uses
LR, GRAD_CLIP = 1e-4, 1.0


def measure_peak_gflops(n=1024, seconds=0.3):
    """Best fp32 GFLOP/s of one n x n x n torch.mm over a `seconds`-long loop (see module doc)."""
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        c = torch.empty(n, n)
        torch.mm(a, b, out=c)  # warm up the BLAS thread pool
        best, start = 0.0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


def run(cfg, batch, steps, warmup):
    model = rm.ReferenceModel(cfg, seed=MODEL_SEED)
    opt = rm.make_adamw(model, lr=LR)
    g = torch.Generator().manual_seed(BATCH_SEED)
    seq = torch.randint(cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    loss = None
    for _ in range(warmup):
        loss = rm.train_step(model, opt, tokens, targets, grad_clip=GRAD_CLIP)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = rm.train_step(model, opt, tokens, targets, grad_clip=GRAD_CLIP)
    dt = (time.perf_counter() - t0) / max(steps, 1)
    return dt, loss


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="gpt2-mini", help="model preset (as starling's)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads (torch.set_num_threads); 0 = CPUs this process may use")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--seq-len", type=int, default=0, help="override the preset's seq_len")
    a = ap.parse_args(argv)

    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)  # as starling: one executor runs nodes in order
    try:
        cfg = rm.preset(a.preset)
        if a.seq_len:
            cfg = dataclasses.replace(cfg, seq_len=a.seq_len)
        cfg.validate()
    except ValueError as e:
        ap.error(str(e))

    dt, loss = run(cfg, a.batch, a.steps, a.warmup)
    peak = measure_peak_gflops()
    tokens_per_s = a.batch * cfg.seq_len / dt
    flops = cfg.train_flops_per_token()
    r = {
        "impl": "torch", "preset": a.preset, "batch": a.batch, "seq_len": cfg.seq_len,
        "threads": threads, "tokens_per_s": round(tokens_per_s, 1), "step_ms": round(dt * 1e3, 2),
        "mfu": round(tokens_per_s * flops / (peak * 1e9), 4), "peak_gflops": round(peak, 1),
        "steps": a.steps, "warmup": a.warmup, "flops_per_token": flops,
        "params": cfg.num_params(), "loss": round(loss, 4), "torch": torch.__version__,
    }
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
