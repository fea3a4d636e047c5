#!/usr/bin/env python3
"""Device time by kernel in Chrome traces: where two implementations of a step differ.

Reads traces written by `starling bench compute --profile FILE` and
`torch_baseline.py --profile FILE` (both Kineto) and prints, for each, the device time per step
by kernel class (matrix products, attention, normalisation, elementwise, reductions, optimizer,
copies, fills) and the busiest kernels, side by side, plus how much of the traced wall time the
device was idle (host-bound gaps).

  python3 bench/compute/trace_summary.py --steps 10 starling.json torch.json
"""
import argparse
import collections
import json
import re
import sys

CLASSES = [  # first match wins
    ("attention", r"flash|fmha|attention|sdpa|efficient_attention"),
    ("matmul", r"gemm|sm90_xmma|cutlass|cublas|nvjet|matmul|sm80_xmma|wgmma"),
    ("optimizer", r"adam|multi_tensor_apply"),
    ("norm", r"layer_norm|rms_norm|LayerNorm|RMSNorm|norm_kernel"),
    ("softmax/loss", r"softmax|nll_loss|cross_entropy|log_softmax"),
    ("embedding", r"embedding|index_select|indexSelect|gather|scatter_add|index_put"),
    ("reduction", r"reduce_kernel|Reduce|reduction"),
    ("copy/cast", r"copy|cast|Memcpy|memcpy|to_copy"),
    ("fill", r"fill|memset|Memset|zero"),
    ("elementwise", r"elementwise|vectorized|unrolled|launch_kernel|pointwise"),
]


def classify(name):
    for cls, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return "other"


def load(path, wide=False):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in
               ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")]
    if not kernels:
        sys.exit(f"{path}: no device kernels in this trace (was it taken on a GPU?)")
    start = min(e["ts"] for e in kernels)
    end = max(e["ts"] + e["dur"] for e in kernels)
    busy, last = 0.0, start  # union of kernel intervals: overlapping streams count once
    for e in sorted(kernels, key=lambda e: e["ts"]):
        s, t = max(e["ts"], last), e["ts"] + e["dur"]
        if t > s:
            busy += t - s
            last = t
    by_class, by_name = collections.Counter(), collections.Counter()
    counts = collections.Counter()
    for e in kernels:
        name = e["name"]
        by_class[classify(name)] += e["dur"]
        short = name[:240] if wide else re.sub(r"<.*", "<...>", name)[:70]
        by_name[short] += e["dur"]
        counts[short] += 1
    return {"span": end - start, "busy": busy, "total": sum(e["dur"] for e in kernels),
            "launches": len(kernels), "class": by_class, "name": by_name, "count": counts}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="Chrome trace files (JSON)")
    ap.add_argument("--steps", type=int, default=1, help="steps in each trace: figures per step")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per trace")
    ap.add_argument("--wide", action="store_true",
                    help="keep template arguments in kernel names (tells copies from casts)")
    a = ap.parse_args(argv)
    runs = [load(p, a.wide) for p in a.traces]
    per = 1e3 * a.steps  # microseconds per trace -> milliseconds per step
    names = [p.rsplit("/", 1)[-1] for p in a.traces]
    print(f"{'ms per step':<16}" + "".join(f"{n[:14]:>16}" for n in names))
    rows = [("wall (traced)", "span"), ("device busy", "busy"), ("kernel sum", "total")]
    for label, key in rows:
        print(f"{label:<16}" + "".join(f"{r[key] / per:16.2f}" for r in runs))
    print(f"{'launches':<16}" + "".join(f"{r['launches'] / a.steps:16.0f}" for r in runs))
    classes = sorted({c for r in runs for c in r["class"]},
                     key=lambda c: -max(r["class"][c] for r in runs))
    for c in classes:
        print(f"  {c:<14}" + "".join(f"{r['class'][c] / per:16.2f}" for r in runs))
    for n, r in zip(names, runs):
        print(f"\n{n}: top kernels (ms per step, launches per step)")
        for name, dur in r["name"].most_common(a.top):
            print(f"  {dur / per:8.2f} {r['count'][name] / a.steps:6.0f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
