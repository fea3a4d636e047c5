#!/usr/bin/env python3
"""The scheduler on heterogeneous labs: for each lab, tokens/s of a swarm of local peers trained as
  uniform      the even split by node count, one stage per peer in peer order, whole tensors
               (the SWARM/GPipe-style baseline);
  opfence-1    pipeline.stages = "auto" with no strategy: one pipeline over every peer, OP-Fence's
               chain order and cut, whole tensors;
  opfence-1+ada  the same with pipeline.compression = "adatopk" (not run unless named);
  opfence      pipeline.stages = "auto": OP-Fence's stage count, cut and placement for the lab,
               replicas averaged by --strategy where it chooses them, whole tensors, planned
               from the speeds profiled in the lab's CPU quotas (pipeline.lab_speeds =
               "profiled", pipeline.calibrate_steps = 0);
  opfence+ada  the same plan with pipeline.compression = "adatopk" (int8 activations);
  opfence-peers, opfence-1-peers  as opfence and opfence-1, but planned by the peers from their
               own measurements (pipeline.planner = "peers"; not run unless named); with -cal
               too (opfence-peers-cal), the peers calibrate their plan by trials,
  opfence-cal, opfence-1-cal  as opfence and opfence-1, but planned again from the speeds a
               trial of --calibrate-steps steps measured (pipeline.calibrate_steps; not run
               unless named; the plan from the assumed speeds is reported beside it),
  opfence-shares, opfence-1-shares  as opfence and opfence-1, but planned from the quotas'
               shares of a core (pipeline.lab_speeds = "quotas"; not run unless named),
  opfence-default, opfence-1-default  as opfence and opfence-1 with pipeline.calibrate_steps
               left at its default, which calibrates a run of --steps >= 20 trials (not run
               unless named),
each as a ratio against the uniform run of the same repetition, plus OP-Fence's predicted step
time against the measured one.

    sudo /usr/bin/python3 bench/pipeline/labs.py --starling build/starling           # ~40 min
    sudo /usr/bin/python3 bench/pipeline/labs.py --reps 1 --steps 8                  # a quick look
    sudo /usr/bin/python3 bench/pipeline/labs.py --labs configs/labs/chain-8mbit.toml

Every run is `starling train --peers N --lab LAB` (network namespaces with a link per pair of
peers and a CPU quota per peer: needs root). The model is --preset (gpt2-mini) on a byte-level
Brown corpus, --batch sequences of --seq tokens per micro-batch, --accum micro-batches per step,
1F1B, one thread per peer. The profile the plan weighs is taken once, first, with one thread
(`starling plan profile`). Tokens/s is the steady rate (the swarm's metric windows after
--skip steps and before the last, which drains averaging still in flight; each pipeline counted
once). The measured step is a replica's tokens per step over
its share of that rate. Results go to --json (default build/bench/pipeline-labs.json); --plot
draws docs/img/pipeline-labs.png from that file without running anything.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/
from netlab import labs_unavailable  # noqa: E402
from records import peer_dirs, read_jsonl, steady_tokens_per_s  # noqa: E402
from bench_run import prepare, run  # noqa: E402


def swarm_rate(out, stages, skip, steps):
    """The swarm's steady tokens/s: every peer's steady rate over the stage count (each stage
    of a pipeline reports the pipeline's tokens), from the steps after `skip` to the one before
    the last (the last waits for averaging still in flight)."""
    total = 0.0
    for d in peer_dirs(out):
        rate, _ = steady_tokens_per_s(read_jsonl(os.path.join(d, "metrics.jsonl")), skip, steps - 1)
        total += rate or 0.0
    return total / stages


def assumed_prediction(out):
    """A calibrated plan's step predicted from the assumed speeds (its report says it), else 0.
    The launcher keeps its plan in the run's directory; peers that plan keep theirs in their own."""
    report = ""
    for where in ("auto_pipeline.json", os.path.join("peer-0", "auto_pipeline.json")):
        try:
            with open(os.path.join(out, where)) as f:
                report = json.load(f).get("report", "")
            break
        except (OSError, ValueError):
            continue
    m = re.search(r"the plan from the assumed speeds predicted ([0-9.]+) s", report)
    return float(m.group(1)) if m else 0.0


def keep_ratio(out):
    keeps = []
    for d in peer_dirs(out):
        recs = [r for r in read_jsonl(os.path.join(d, "metrics.jsonl")) if "net" in r]
        if recs:
            keeps.append(recs[-1]["net"].get("keep_ratio", 1.0))
    return min(keeps) if keeps else 1.0


def lab_peers(lab):
    """The `peers = N` of a lab file."""
    with open(lab) as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() == "peers":
                return int(value.split("#")[0])
    sys.exit(f"{lab}: no peers = N")


def plot(rows, path):
    """Tokens/s against the uniform split, per lab and configuration, as grouped bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labs = list(dict.fromkeys(r["lab"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, ax = plt.subplots(figsize=(9.5, 4))
    width = 0.8 / len(configs)
    for k, c in enumerate(configs):
        xs, ys, notes = [], [], []
        for i, lab in enumerate(labs):
            row = next((r for r in rows if r["lab"] == lab and r["config"] == c), None)
            if row and row["ratio"] is not None:  # a run without the uniform split has no bar
                xs.append(i + (k - (len(configs) - 1) / 2) * width)
                ys.append(row["ratio"])
                notes.append(f"{row['ratio']:.2f}x\n{row['stages']}x{row['replicas']}")
        bars = ax.bar(xs, ys, width, label=c)
        for b, note in zip(bars, notes):
            ax.annotate(note, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=8)
    ax.set_xticks(range(len(labs)), labs)
    ax.set_ylabel("tokens/s against the uniform split")
    ax.axhline(1, color="gray", lw=0.8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_ylim(0, max(r["ratio"] for r in rows if r["ratio"] is not None) * 1.25)
    ax.set_title("gpt2-mini on 4 local peers; labels: ratio, stages x replicas")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starling", default=os.path.join(ROOT, "build/starling"))
    ap.add_argument("--text", default=os.path.join(ROOT, "data/brown/text"))
    ap.add_argument("--labs", nargs="+", default=[os.path.join(ROOT, "configs/labs/chain-8mbit.toml"),
                                                  os.path.join(ROOT, "configs/labs/two-clusters.toml")])
    ap.add_argument("--configs", nargs="+", default=["uniform", "opfence-1", "opfence", "opfence+ada"])
    ap.add_argument("--preset", default="gpt2-mini")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip", type=int, default=2, help="steps left out of the steady rate")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--accum", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--strategy", default="co2", help="how OP-Fence's replicas average")
    ap.add_argument("--local-steps", type=int, default=4, help="strategy.local_steps")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calibrate-steps", type=int, default=None,
                    help="pipeline.calibrate_steps of the -cal configurations (default: two "
                         "rounds of --strategy, 2 x --local-steps, as the launcher's default; 3 "
                         "with no rounds)")
    ap.add_argument("--json", default=os.path.join(ROOT, "build/bench/pipeline-labs.json"))
    ap.add_argument("--plot", action="store_true", help="only draw docs/img/pipeline-labs.png from --json")
    args = ap.parse_args()
    if args.calibrate_steps is None:
        rounds = args.strategy in ("localsgd", "diloco", "co2")
        args.calibrate_steps = 2 * args.local_steps if rounds else 3
    # Every ratio is against the uniform run of the same repetition: it runs first.
    if "uniform" in args.configs:
        args.configs = ["uniform"] + [c for c in args.configs if c != "uniform"]
    figure = os.path.join(ROOT, "docs/img/pipeline-labs.png")
    if args.plot:
        with open(args.json) as f:
            plot(json.load(f), figure)
        return
    if why := labs_unavailable():
        sys.exit(f"labs unavailable here: {why}")

    work, cfg = prepare(args.starling, args.text, "starling_bench_labs_",
                        f'preset = "{args.preset}"\nseq_len = {args.seq}\n',
                        f"steps = {args.steps}\nbatch_size = {args.batch}\ngrad_accum = {args.accum}\n",
                        f'[strategy]\nkind = "{args.strategy}"\nlocal_steps = {args.local_steps}\n')
    profile = os.path.join(work, "profile.json")
    run([args.starling, "plan", "profile", "-c", cfg, "-o", profile], os.path.join(work, "profile.log"))
    tokens_per_step = args.batch * args.seq * args.accum

    rows = []
    n = 0
    for lab in args.labs:
        name = os.path.splitext(os.path.basename(lab))[0]
        results = {c: dict(tps=[], ratio=[], predicted=[], assumed=[], measured=[], keep=[], stages=0,
                           replicas=1)
                   for c in args.configs}
        for rep in range(args.reps):
            base = None
            for c in args.configs:
                n += 1
                out = os.path.join(work, f"run{n}")
                cmd = [args.starling, "train", "-q", "--config", cfg, "--lab", lab,
                       "--set", f'train.out_dir="{out}"']
                if c == "uniform":
                    cmd += ["--set", 'strategy.kind="none"', "--set", f"pipeline.num_stages={lab_peers(lab)}"]
                else:
                    cmd += ["--set", 'pipeline.stages="auto"', "--set", f'pipeline.profile="{profile}"']
                    if c.startswith("opfence-1"):
                        cmd += ["--set", 'strategy.kind="none"']
                    if "-peers" in c:
                        cmd += ["--set", 'pipeline.planner="peers"']
                    # Planned from the assumed speeds unless named -cal, however long the run
                    # (pipeline.calibrate_steps = -1 would try a long run's plan first); -default
                    # leaves the run's default.
                    steps = args.calibrate_steps if "-cal" in c else 0
                    if "-default" not in c:
                        cmd += ["--set", f"pipeline.calibrate_steps={steps}"]
                    if "-shares" in c:
                        cmd += ["--set", 'pipeline.lab_speeds="quotas"']
                    if "+ada" in c:
                        cmd += ["--set", 'pipeline.compression="adatopk"']
                run(cmd, out + ".log")
                with open(os.path.join(out, "swarm.json")) as f:
                    swarm = json.load(f)
                stages = swarm["stages"]
                replicas = swarm["peers"] // stages
                tps = swarm_rate(out, stages, args.skip, args.steps)
                r = results[c]
                r["stages"], r["replicas"] = stages, replicas
                r["tps"].append(tps)
                if c == "uniform":
                    base = tps
                r["ratio"].append(tps / base if base else float("nan"))
                r["measured"].append(replicas * tokens_per_step / tps if tps > 0 else float("nan"))
                r["predicted"].append(swarm.get("predicted_step_s", 0.0))
                r["assumed"].append(assumed_prediction(out))
                r["keep"].append(keep_ratio(out))
                print(f"{name} rep {rep + 1} {c:12}: {tps:8.0f} tok/s, {stages} stages x {replicas}"
                      f" replica(s), measured step {r['measured'][-1]:.2f} s"
                      + (f", predicted {r['predicted'][-1]:.2f} s" if r["predicted"][-1] else "")
                      + (f" (from the assumed speeds {r['assumed'][-1]:.2f} s)" if r["assumed"][-1] else ""),
                      flush=True)
        for c in args.configs:
            r = results[c]
            row = dict(lab=name, config=c, stages=r["stages"], replicas=r["replicas"],
                       tokens_per_s=statistics.median(r["tps"]), ratio=statistics.median(r["ratio"]),
                       measured_step_s=statistics.median(r["measured"]),
                       predicted_step_s=statistics.median(r["predicted"]),
                       assumed_predicted_step_s=statistics.median(r["assumed"]),
                       keep_ratio=statistics.median(r["keep"]), reps=args.reps)
            # Each run's prediction against its own measured step (the medians of the two above
            # may come from different runs).
            accuracy = [p / m for p, m in zip(r["predicted"], r["measured"]) if p and m > 0]
            row["predicted_over_measured"] = accuracy
            if math.isnan(row["ratio"]):
                row["ratio"] = None  # no uniform run to compare with
            rows.append(row)
            pred = (f", predicted step {row['predicted_step_s']:.2f} s; predicted / measured "
                    + ", ".join(f"{a:.2f}" for a in accuracy)
                    + (f" (median {statistics.median(accuracy):.2f})" if len(accuracy) > 1 else "")
                    if accuracy else "")
            versus = f"{row['ratio']:.2f}x uniform" if row["ratio"] is not None else "(no uniform run)"
            print(f"{name:14} {c:12}: {versus} ({row['tokens_per_s']:.0f} tok/s; "
                  f"{row['stages']} stages x {row['replicas']}; measured step {row['measured_step_s']:.2f} s"
                  f"{pred}; keeping {100 * row['keep_ratio']:.0f}% of entries)", flush=True)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(rows, f, indent=2)
    print("results in", args.json)


if __name__ == "__main__":
    main()
