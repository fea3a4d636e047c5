#!/usr/bin/env python3
"""atom benchmark: a swarm of 4 peers of unequal speed, atom against ddp's lockstep.

    /usr/bin/python3 bench/atom/run.py --starling build/starling          # ~15 min on 2 cores
    /usr/bin/python3 bench/atom/run.py --steps 20 --targets 128           # quick look
    /usr/bin/python3 bench/atom/run.py --targets 512 --steps 80 --plot docs/img/atom-loss.png
    /usr/bin/python3 bench/atom/run.py --targets 64 --batch 8 --whole   # smaller last micro-batches

The peers get unequal speeds through CPU quotas (`starling train --peers 4 --peer-cpus
0.6,0.6,0.3,0.3`: two peers with twice the compute of the other two; cgroups, so it needs root).
Every run trains bench/atom/config.toml (gpt2-tiny, micro-batches of --batch sequences of 128
tokens, default 4):

  solo   each of the 4 peers training alone on its quota (`--peers 1`), its steady tokens/s;
         the four solo runs go at once, each with steps in proportion to its quota so that
         they end together: a peer's machine is as busy as in the swarms. (Alone on this
         2-core virtual machine, a 0.3 CPU peer ran 10-20% slower per CPU-second than beside
         the others: the idle CPU's wake-ups cost it. Solo rates measured that way are no
         bound, and the swarms came out above them.) They run before and after each
         repetition's swarms, and each quota's rate is the median of all its solo runs. The
         quotas add up to 1.8 CPUs: on a machine with fewer, the solos share cores and the
         ideal comes out low.
  ddp    the 4 peers in lockstep, each computing target / (4 x --batch) micro-batches per
         step (the target's sequences per swarm step), so every step waits for the slowest;
  atom   the 4 peers accumulating at their own pace until the swarm holds target_batch
         sequences, then averaging sample-weighted gradients; a peer's last micro-batch of a
         step may be smaller, so that the peers end together. With --whole, also atom with
         whole micro-batches only (strategy.partial_micro_batches = false).

for each target of --targets (sequences per swarm step, default 128 and 512).

It prints each swarm's tokens/s against the sum of its peers' solo tokens/s (the ideal: no peer
ever idle) and against ddp, atom's busy share (the median peer's step time spent in
micro-batches; the rest is waiting for the others, the exchange and the update), and the
validation loss at equal swarm tokens (atom's curve interpolated at ddp's final token count).
Medians of --reps runs (loss: ddp's first run). With --plot PNG it also draws the validation
loss of the first repetition's ddp and atom swarms against swarm tokens and against wall time
(matplotlib; skipped with a note without it).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for records.py
from records import read_jsonl  # noqa: E402  (bench/records.py)
from corpus import ensure_byte_corpus  # noqa: E402  (bench/corpus.py)
CPUS = [0.6, 0.6, 0.3, 0.3]


def start(args, work, tag, kind, peers, cpus, extra=(), steps=None):
    """Starts one `starling train` swarm (or a swarm of one); returns its process and out dir."""
    out = os.path.join(work, tag)
    cmd = [args.starling, "train", "-q", "--config", args.config, "--peers", str(peers),
           "--peer-cpus", ",".join(str(c) for c in cpus),
           "--set", f"train.out_dir=\"{out}\"", "--set", f"train.steps={steps or args.steps}",
           "--set", f"strategy.kind=\"{kind}\""]
    for s in [f"train.batch_size={args.batch}", *extra]:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    return proc, out


def run(args, work, tag, kind, peers, cpus, extra=(), steps=None):
    return finish(tag, *start(args, work, tag, kind, peers, cpus, extra, steps), peers)


def finish(tag, proc, out, peers):
    """Waits for a run of start() and reads its figures."""
    output, _ = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"{tag} failed:\n{output}")
    per_peer = [read_jsonl(os.path.join(out, f"peer-{i}", "metrics.jsonl")) for i in range(peers)]
    # Steady rate: swarm tokens between the first logged step and the last, over that time
    # (evaluations excluded: their time is in elapsed_s but not in step time, so use step times).
    tokens = 0.0
    seconds = 0.0
    busy = []  # atom: each peer's share of its step time spent in micro-batches
    for recs in per_peer:
        steps = [r for r in recs if "tokens_per_s" in r]
        first, last = steps[0], steps[-1]
        tokens += last["tokens"] - first["tokens"]
        seconds = max(seconds, sum_step_seconds(steps))
        if "compute_s" in last.get("net", {}):
            busy.append((last["net"]["compute_s"] - first["net"]["compute_s"]) /
                        sum_step_seconds(steps))
    evals = {}
    for recs in per_peer:
        for r in recs:
            if "val_loss" in r:
                e = evals.setdefault(r["step"], {"tokens": 0, "val_loss": r["val_loss"],
                                                 "elapsed_s": 0.0})
                e["tokens"] += r["tokens"]
                e["elapsed_s"] = max(e["elapsed_s"], r.get("elapsed_s", 0.0))
    samples = [r["net"].get("swarm_samples", 0) for r in per_peer[0] if "net" in r]
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens_per_s": tokens / seconds, "evals": [evals[s] for s in sorted(evals)],
            "swarm_samples": statistics.median(samples) if samples else 0,
            "busy": statistics.median(busy) if busy else 0}


def sum_step_seconds(steps):
    """Wall time covered by the step records after the first (whose window holds the start-up):
    each record holds its window's tokens/s and the tokens so far."""
    total = 0.0
    prev = None
    for r in steps:
        if prev is not None:
            total += (r["tokens"] - prev["tokens"]) / r["tokens_per_s"]
        prev = r
    return total


def loss_at(evals, tokens):
    """Validation loss at `tokens` swarm tokens, linearly interpolated between evaluations."""
    pts = [(e["tokens"], e["val_loss"]) for e in evals]
    for (t0, l0), (t1, l1) in zip(pts, pts[1:]):
        if t0 <= tokens <= t1:
            return l0 + (l1 - l0) * (tokens - t0) / (t1 - t0)
    return pts[-1][1] if tokens >= pts[-1][0] else pts[0][1]


def plot(path, runs, targets):
    """Validation loss of each target's first ddp and atom run, against swarm tokens and time."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is missing (apt install python3-matplotlib)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colors = {"ddp": "#1f77b4", "atom": "#d62728"}
    styles = ["-", "--", ":", "-."]
    for i, t in enumerate(targets):
        for kind in ("ddp", "atom"):
            evals = runs[(kind, t)][0]["evals"]
            label = f"{kind}, {t} sequences/step"
            kw = dict(color=colors[kind], linestyle=styles[i % len(styles)], marker="o", ms=3,
                      label=label)
            axes[0].plot([e["tokens"] / 1e6 for e in evals], [e["val_loss"] for e in evals], **kw)
            axes[1].plot([e["elapsed_s"] for e in evals], [e["val_loss"] for e in evals], **kw)
    axes[0].set_xlabel("swarm tokens (millions)")
    axes[1].set_xlabel("wall time of the run (s)")
    axes[0].set_ylabel("validation loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"4 peers with CPU quotas {CPUS}: atom against ddp's lockstep")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    ap.add_argument("--config", default=os.path.join(HERE, "config.toml"))
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--solo-steps", type=int, default=20,
                    help="steps of the slowest peer's solo run (the others' in proportion)")
    ap.add_argument("--targets", type=int, nargs="+", default=[128, 512],
                    help="sequences per swarm step (multiples of 4 x --batch)")
    ap.add_argument("--batch", type=int, default=4,
                    help="sequences per micro-batch (train.batch_size); ddp's peers each take "
                         "target / (4 x batch) of them per step")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--whole", action="store_true",
                    help="also run atom with whole micro-batches only "
                         "(strategy.partial_micro_batches = false), against the same ideal")
    ap.add_argument("--plot", metavar="PNG", help="also draw the loss curves into PNG")
    args = ap.parse_args()
    for t in args.targets:
        if t % (4 * args.batch) != 0:
            ap.error(f"--targets {t}: not a multiple of 4 peers x --batch {args.batch}")
    ensure_byte_corpus(args.starling, args.config)
    work = tempfile.mkdtemp(prefix="starling_atom_bench_")
    solo_runs = {}
    kinds = ("ddp", "atom", "whole") if args.whole else ("ddp", "atom")
    runs = {(k, t): [] for k in kinds for t in args.targets}
    evals = f"train.eval_every={max(1, args.steps // 8)}"

    def measure_solos(tag):
        # Each peer alone, all four at once: ddp with a swarm of one is plain training plus a
        # trivial agreement. Steps in proportion to the quota, so that none runs on alone.
        solos = [(c, start(args, work, f"{tag}_{i}", "ddp", 1, [c], ["train.grad_accum=8"],
                           steps=max(4, round(args.solo_steps * c / min(CPUS)))))
                 for i, c in enumerate(CPUS)]
        try:
            for i, (c, (proc, out)) in enumerate(solos):
                r = finish(f"{tag}_{i}", proc, out, 1)
                solo_runs.setdefault(c, []).append(r["tokens_per_s"])
        finally:  # one failed: stop the others rather than leave them running
            for _, (proc, _) in solos:
                if proc.poll() is None:
                    proc.terminate()

    for rep in range(args.reps):
        # Before and after the swarms: this machine's speed drifts by several percent over the
        # minutes a repetition takes, and the ideal is the median of both sides.
        measure_solos(f"solo_before{rep}")
        for t in args.targets:
            runs[("ddp", t)].append(run(args, work, f"ddp{t}_{rep}", "ddp", 4, CPUS,
                                        [f"train.grad_accum={t // (4 * args.batch)}", evals]))
            runs[("atom", t)].append(run(args, work, f"atom{t}_{rep}", "atom", 4, CPUS,
                                         [f"strategy.target_batch={t}", evals]))
            if args.whole:
                runs[("whole", t)].append(run(
                    args, work, f"whole{t}_{rep}", "atom", 4, CPUS,
                    [f"strategy.target_batch={t}", "strategy.partial_micro_batches=false", evals]))
        measure_solos(f"solo_after{rep}")
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    solo = {c: statistics.median(v) for c, v in solo_runs.items()}
    ideal = sum(solo[c] for c in CPUS)
    print(f"atom benchmark: 4 peers with CPU quotas {CPUS}, gpt2-tiny, micro-batches of "
          f"{args.batch} x 128 "
          f"tokens, {args.steps} steps, median of {args.reps}")
    print("solo tokens/s: " + ", ".join(f"{c} CPU {solo[c]:.0f}" for c in sorted(solo)) +
          f"; sum over the 4 peers {ideal:.0f}")
    print(f"{'target':>6} {'ddp tok/s':>10} {'/ ideal':>8} {'atom tok/s':>11} {'/ ideal':>8} "
          f"{'atom/ddp':>9} {'busy':>5} {'batch':>6} {'ddp loss':>9} {'atom loss':>10}")
    for t in args.targets:
        med = {k: statistics.median(r["tokens_per_s"] for r in runs[(k, t)]) for k in kinds}
        busy = statistics.median(r["busy"] for r in runs[("atom", t)])
        ddp_evals = runs[("ddp", t)][0]["evals"]
        tokens = ddp_evals[-1]["tokens"]
        ddp_loss = ddp_evals[-1]["val_loss"]
        atom_loss = statistics.median(loss_at(r["evals"], tokens) for r in runs[("atom", t)])
        batch = statistics.median(r["swarm_samples"] for r in runs[("atom", t)])
        print(f"{t:>6} {med['ddp']:>10.0f} {med['ddp'] / ideal:>8.2f} {med['atom']:>11.0f} "
              f"{med['atom'] / ideal:>8.2f} {med['atom'] / med['ddp']:>9.2f} {busy:>5.2f} "
              f"{batch:>6.0f} {ddp_loss:>9.4f} {atom_loss:>10.4f} "
              f"({100 * (atom_loss / ddp_loss - 1):+.1f}%)")
        if args.whole:
            whole = runs[("whole", t)]
            print(f"{'':>6} whole micro-batches only: {med['whole']:.0f} tok/s, "
                  f"{med['whole'] / ideal:.2f} of the ideal (partial ones: "
                  f"{med['atom'] / med['whole']:.3f}x that), busy "
                  f"{statistics.median(r['busy'] for r in whole):.2f}, batch "
                  f"{statistics.median(r['swarm_samples'] for r in whole):.0f}")
    print("ideal: the sum of the peers' solo rates (no peer ever idle); busy: the median peer's "
          "share of its step time in micro-batches; batch: atom's median sequences per step; "
          "loss: validation loss at ddp's final swarm tokens (atom's curve interpolated)")
    if args.plot:
        plot(args.plot, runs, args.targets)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
