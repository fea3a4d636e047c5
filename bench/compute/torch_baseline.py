#!/usr/bin/env python3
"""PyTorch baseline for `starling bench compute`: the same training step, timed the same way.

    /usr/bin/python3 bench/compute/torch_baseline.py --preset gpt2-mini --batch 8 --threads 2 \\
        [--steps 10 --warmup 3 --seq-len 0]
    python3 bench/compute/torch_baseline.py --device cuda --mode eager-bf16 --preset gpt2-124m

Trains python/reference_model.py (same architecture, parameter shapes and init scheme as the C++
model) on one fixed batch of random tokens: each step zeroes the gradients, runs forward and
backward, clips the global gradient norm to 1.0 and takes a torch.optim.AdamW step (lr 1e-4,
betas 0.9/0.95, weight decay 0.1 on matrices and embeddings only), which is what
src/starling/train/compute_bench.cpp does. The `--warmup` steps are untimed; the `--steps` after
them are timed together, with one wait for the device at the end (no per-step .item()).

Modes (--mode), the ways people usually run PyTorch:
  eager         fp32, the materialised nanoGPT attention, torch's default AdamW (foreach on GPUs)
  eager-bf16    autocast to bf16, F.scaled_dot_product_attention, AdamW(fused=True) (GPU only)
  compile-bf16  eager-bf16 under torch.compile (GPU only; the first warmup step compiles)
fp32 matrix products may use TF32 on GPUs unless --no-tf32 (as Starling's train.tf32).

Output: one JSON line with the keys `starling bench compute --json` prints (impl "torch-MODE",
preset, batch, seq_len, device, dtype, threads, tokens_per_s, step_ms, tflops, mfu, peak_gflops,
peak_memory_mb) plus steps, warmup, flops_per_token, params, the last loss and the torch version:
  tokens_per_s  batch * seq_len * steps / time of the timed steps
  step_ms       time of the timed steps / steps
  tflops        tokens_per_s * flops_per_token / 1e12
  peak_gflops   the best matmul rate of the device in the mode's dtype: on a CPU a 1024^3 fp32
                torch.mm repeated for 0.3 s with the same thread setting (CPUs publish no usable
                peak); on a GPU 8192^3 (bf16) or 4096^3 (fp32/TF32) products, ten per timing. It is
                the probe that src/starling/train/precision.cpp runs too.
  mfu           tflops * 1e3 / peak_gflops, flops_per_token being
                ModelConfig::train_flops_per_token (config.cpp), mirrored in reference_model.py.
  peak_memory_mb  torch.cuda.max_memory_allocated over the timed steps (0 on a CPU)
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


MODES = {  # mode -> (autocast dtype or None, fused attention, fused AdamW, torch.compile)
    "eager": (None, False, None, False),
    "eager-bf16": (torch.bfloat16, True, True, False),
    "compile-bf16": (torch.bfloat16, True, True, True),
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_gflops(device, dtype=torch.float32, seconds=0.3):
    """Best GFLOP/s of square torch.mm products over a `seconds`-long loop (see module doc)."""
    cuda = device.type == "cuda"
    n = (8192 if dtype != torch.float32 else 4096) if cuda else 1024
    reps = 10 if cuda else 1
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=g).to(device, dtype)
        b = torch.randn(n, n, generator=g).to(device, dtype)
        c = torch.empty(n, n, device=device, dtype=dtype)
        torch.mm(a, b, out=c)  # warm up the BLAS thread pool / GPU kernels
        sync(device)
        best, start = 0.0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b, out=c)
            sync(device)
            best = max(best, 2.0 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def run(cfg, batch, steps, warmup, device, mode, profile=None):
    dtype, sdpa, fused, compiled = MODES[mode]
    model = rm.ReferenceModel(cfg, seed=MODEL_SEED).to(device)
    rm.use_sdpa(model, sdpa)
    opt = rm.make_adamw(model, lr=LR, fused=fused)
    g = torch.Generator().manual_seed(BATCH_SEED)
    seq = torch.randint(cfg.vocab_size, (batch, cfg.seq_len + 1), generator=g)
    tokens, targets = seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)
    forward = torch.compile(model) if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        if dtype is None:
            loss = forward(tokens, targets)
        else:
            with torch.autocast(device_type=device.type, dtype=dtype):
                loss = forward(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        return loss.detach()

    loss = None
    for _ in range(warmup):
        loss = step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trace = None
    if profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        trace = torch.profiler.profile(activities=activities)
        trace.__enter__()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    sync(device)
    dt = (time.perf_counter() - t0) / max(steps, 1)
    if trace is not None:
        trace.__exit__(None, None, None)
        trace.export_chrome_trace(profile)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return dt, loss.item(), peak


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
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--mode", default="eager", choices=sorted(MODES), help="see above")
    ap.add_argument("--no-tf32", action="store_true", help="GPU fp32 matmuls in full fp32")
    ap.add_argument("--profile", metavar="FILE",
                    help="write a Chrome trace of the timed steps (compare with trace_summary.py)")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {a.device}: this torch has no CUDA or no GPU is visible")
    if device.type == "cpu" and a.mode != "eager":
        ap.error(f"--mode {a.mode} is for GPUs; on a CPU use --mode eager")
    torch.backends.cuda.matmul.allow_tf32 = not a.no_tf32

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

    dt, loss, peak_memory = run(cfg, a.batch, a.steps, a.warmup, device, a.mode, a.profile)
    dtype = MODES[a.mode][0] or torch.float32
    peak = measure_peak_gflops(device, dtype)
    tokens_per_s = a.batch * cfg.seq_len / dt
    flops = cfg.train_flops_per_token()
    tflops = tokens_per_s * flops / 1e12
    r = {
        "impl": "torch" if a.mode == "eager" else f"torch-{a.mode}", "preset": a.preset,
        "batch": a.batch, "seq_len": cfg.seq_len, "device": a.device,
        "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
        "threads": threads, "tokens_per_s": round(tokens_per_s, 1), "step_ms": round(dt * 1e3, 2),
        "tflops": round(tflops, 3), "mfu": round(tflops * 1e3 / peak, 4),
        "peak_gflops": round(peak, 1), "peak_memory_mb": round(peak_memory / 1e6, 1),
        "steps": a.steps, "warmup": a.warmup, "flops_per_token": flops,
        "params": cfg.num_params(), "loss": round(loss, 4), "torch": torch.__version__,
    }
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
