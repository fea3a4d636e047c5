#!/usr/bin/env python3
"""Full replicas against pipelines on slow links (the comparison ATOM's paper makes): the same
model on 4 peers as 4 replicas averaged by co2, 4 replicas under atom, one pipeline of 4 stages,
and 2 pipelines of 2 stages averaged by co2. Tokens/s on shaped links, and validation loss
against tokens trained.

    /usr/bin/python3 bench/pipeline/compare.py --starling build/starling      # ~35 min
    /usr/bin/python3 bench/pipeline/compare.py --parts throughput --links 10mbit --reps 1

The model, data and optimizer are bench/strategies/config.toml's (gpt2-tiny, Brown corpus in
bytes, 16 sequences of 128 tokens per replica or pipeline step; co2 with tau = 16). A pipeline
takes its 16 sequences as 4 micro-batches of 4 (1F1B). Each configuration is `starling train
--peers 4`, on shaped links with --link-rate (a tbf qdisc per peer's namespace; needs root).

  throughput  --steps-replicas steps (64) for the replica runs and --steps-pipeline (24) for the
              pipeline of 4, per link; the swarm's tokens/s is the sum over replicas (over the
              last stage of each pipeline) of the steady rate after the first round (16 steps;
              4 for the pipeline of 4), evaluations excluded. The median over --reps runs.
  loss        on loopback, each configuration trains --tokens tokens (3.28M, the strategies
              benchmark's) and evaluates at the same token counts; what a configuration computes
              does not depend on the link, so loss is measured once. Step-based schedules (warmup,
              evaluation) are scaled so that every configuration sees them at the same tokens.

Results go to --json (default build/bench/pipeline-compare.json); --plot writes the figures
(docs/img/pipeline-vs-replicas-*.png) from that file without running anything.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for records.py
from records import read_jsonl, steady_tokens_per_s  # noqa: E402  (bench/records.py)

PEERS = 4
SEQS, SEQ_LEN = 16, 128  # sequences per replica (or pipeline) step, tokens per sequence
# name -> (stages per pipeline, strategy, label)
CONFIGS = {
    "co2": (1, "co2", "4 replicas, co2"),
    "atom": (1, "atom", "4 replicas, atom"),
    "pipeline4": (4, "none", "1 pipeline of 4 stages"),
    "hybrid2x2": (2, "co2", "2 pipelines of 2 stages, co2"),
}


def replicas(name):
    return PEERS // CONFIGS[name][0]


def command(args, name, out, steps, link):
    stages, strategy, _ = CONFIGS[name]
    r = replicas(name)
    # Per replica: steps x 16 x 128 tokens; schedules scale with the replica count so that every
    # configuration warms up and evaluates at the same swarm token counts.
    scale = PEERS // r
    cmd = [args.starling, "train", "-q", "--config", args.config, "--peers", str(PEERS),
           "--set", f'train.out_dir="{out}"', "--set", f"train.steps={steps}",
           "--set", f'strategy.kind="{strategy}"',
           "--set", f"optim.warmup_steps={50 * scale}", "--set", f"train.eval_every={64 * scale}"]
    if stages > 1:
        cmd += ["--set", f"pipeline.num_stages={stages}", "--set", "train.batch_size=4",
                "--set", "train.grad_accum=4", "--set", 'pipeline.schedule="1f1b"']
    if strategy == "atom":
        cmd += ["--set", f"strategy.target_batch={PEERS * SEQS}"]
    if link != "loopback":
        cmd += ["--link-rate", link]
    return cmd


def train(args, name, steps, link, tag):
    out = os.path.join(args.work, f"{name}_{link}_{tag}")
    log = out + ".log"
    with open(log, "w") as f:
        p = subprocess.run(command(args, name, out, steps, link), stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit(f"{name} on {link} failed; see {log}:\n" + open(log).read()[-3000:])
    return out


def rate_peers(name):
    """The peers whose records carry a replica's tokens: every peer, or each pipeline's last stage."""
    stages = CONFIGS[name][0]
    return [r * stages + stages - 1 for r in range(replicas(name))]


def swarm_rate(name, out, skip, steps):
    total = 0.0
    for p in rate_peers(name):
        rate, _ = steady_tokens_per_s(read_jsonl(os.path.join(out, f"peer-{p}", "metrics.jsonl")),
                                      skip, steps)
        if rate is None:
            sys.exit(f"{out}: peer {p} has no steady window")
        total += rate
    return total


def val_curve(name, out):
    """(swarm tokens, val loss) of the first rate peer's evaluations."""
    recs = read_jsonl(os.path.join(out, f"peer-{rate_peers(name)[0]}", "metrics.jsonl"))
    return [(r["tokens"] * replicas(name), r["val_loss"]) for r in recs if "val_loss" in r]


def plot(results, img_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(img_dir, exist_ok=True)
    if results.get("loss"):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, curve in results["loss"].items():
            xs = [t / 1e6 for t, _ in curve["val"]]
            ax.plot(xs, [v for _, v in curve["val"]], marker="o", label=CONFIGS[name][2])
        ax.set_xlabel("tokens trained by the swarm (millions)")
        ax.set_ylabel("validation loss")
        ax.set_title("gpt2-tiny on 4 peers: loss at equal tokens")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(img_dir, "pipeline-vs-replicas-loss.png"), dpi=110)
    if results.get("throughput"):
        links = sorted({row["link"] for row in results["throughput"]}, key=lambda l: -LINK_ORDER.get(l, 0))
        fig, ax = plt.subplots(figsize=(9, 4.2))
        width = 0.8 / len(CONFIGS)
        for i, name in enumerate(CONFIGS):
            ys = [next((r["tokens_per_s"] for r in results["throughput"]
                        if r["config"] == name and r["link"] == l), 0) for l in links]
            ax.bar([j + i * width for j in range(len(links))], ys, width, label=CONFIGS[name][2])
        ax.set_xticks([j + width * (len(CONFIGS) - 1) / 2 for j in range(len(links))], links)
        ax.set_ylabel("swarm tokens/s")
        ax.set_yscale("log")
        ax.set_title("gpt2-tiny on 4 peers: throughput by link")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(img_dir, "pipeline-vs-replicas-throughput.png"), dpi=110)


LINK_ORDER = {"loopback": 4, "1gbit": 3, "100mbit": 2, "10mbit": 1}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    ap.add_argument("--config", default=os.path.join(ROOT, "bench", "strategies", "config.toml"))
    ap.add_argument("--parts", nargs="+", default=["throughput", "loss"], choices=["throughput", "loss"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--links", nargs="+", default=["100mbit", "10mbit"])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--steps-replicas", type=int, default=64)
    ap.add_argument("--steps-pipeline", type=int, default=24)
    ap.add_argument("--tokens", type=float, default=PEERS * 400 * SEQS * SEQ_LEN)
    ap.add_argument("--json", default=os.path.join(ROOT, "build", "bench", "pipeline-compare.json"))
    ap.add_argument("--plot", action="store_true", help="only draw the figures from --json")
    args = ap.parse_args()
    img_dir = os.path.join(ROOT, "docs", "img")
    if args.plot:
        with open(args.json) as f:
            plot(json.load(f), img_dir)
        return 0
    args.work = tempfile.mkdtemp(prefix="starling_bench_compare_")
    results = {"throughput": [], "loss": {}}
    if "throughput" in args.parts:
        if os.geteuid() != 0:
            print("throughput on shaped links needs root (network namespaces): skipped")
        for link in ([] if os.geteuid() != 0 else args.links):
            for name in args.configs:
                pipeline4 = CONFIGS[name][0] == PEERS
                steps = args.steps_pipeline if pipeline4 else args.steps_replicas
                skip = 4 if pipeline4 else 16
                rates = [swarm_rate(name, train(args, name, steps, link, f"t{rep}"), skip, steps)
                         for rep in range(args.reps)]
                row = {"config": name, "link": link, "tokens_per_s": statistics.median(rates),
                       "reps": rates}
                results["throughput"].append(row)
                print(f"{link:8} {CONFIGS[name][2]:30} {row['tokens_per_s']:8.0f} tokens/s", flush=True)
        for link in {r["link"] for r in results["throughput"]}:
            rows = {r["config"]: r["tokens_per_s"] for r in results["throughput"] if r["link"] == link}
            if "pipeline4" in rows:
                for name, v in rows.items():
                    print(f"{link:8} {CONFIGS[name][2]:30} {v / rows['pipeline4']:6.1f}x the pipeline of 4")
    if "loss" in args.parts:
        for name in args.configs:
            steps = int(args.tokens // (replicas(name) * SEQS * SEQ_LEN))
            out = train(args, name, steps, "loopback", "loss")
            curve = val_curve(name, out)
            summary = json.load(open(os.path.join(out, "swarm.json")))
            results["loss"][name] = {"steps": steps, "val": curve, "elapsed_s": summary["elapsed_s"]}
            print(f"loss     {CONFIGS[name][2]:30} val {curve[-1][1]:.3f} after {curve[-1][0] / 1e6:.2f}M "
                  f"tokens ({summary['elapsed_s']:.0f} s)", flush=True)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    print("results in", args.json, "; runs in", args.work)
    try:
        plot(results, img_dir)
    except ImportError:
        print("matplotlib is missing: no figures (apt install python3-matplotlib)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
