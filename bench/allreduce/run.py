#!/usr/bin/env python3
"""All-reduce benchmark: bus bandwidth of Starling's ring all-reduce against c10d's Gloo, 4 peers.

    /usr/bin/python3 bench/allreduce/run.py              # what `make bench-allreduce` runs
    /usr/bin/python3 bench/allreduce/run.py --quick      # fewer sizes, 2 repetitions (~1.5 min)
    /usr/bin/python3 bench/allreduce/run.py --links loopback --json out.json

For each link it starts 4 build/starling_allreduce_peer processes per configuration: on loopback
all in this network namespace, on a shaped link each in its own namespace of a netlab
(scripts/netlab.sh up NAME 4 RATE; always taken down again) bound to its lab address. Links and
configurations:

    loopback   starling secure and insecure, each on direct links and through ZeroMQ, gloo
               x 1, 16, 64, 256 MB
    100mbit    starling secure fp32 (direct, zmq), int8, gloo  x 1, 16, 64 MB
    10mbit     starling secure fp32 (direct, zmq), int8, gloo  x 1, 8 MB

(10mbit stops at 8 MB: one fp32 all-reduce of 8 MB moves 12 MB over every peer's link, ~10 s;
64 MB would take ~80 s per repetition.) Every peer times each repetition after a barrier; per
repetition the slowest peer's time counts (the all-reduce is done when the last peer is), and
the table shows the median (and min) over repetitions. busbw = bytes * 2(n-1)/n / t with bytes
the fp32 payload, so for int8 it is the *effective* bandwidth (fp32 bytes delivered per second).
Labs need root, iproute2 and sch_tbf; without them only loopback runs. See README.md.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))  # bench/, for netlab.py
from netlab import NETLAB, labs_unavailable, netlab  # noqa: E402  (bench/netlab.py)
PEERS = 4
# tbf counts Ethernet + IP + TCP headers: TCP goodput tops out at 1448/1514 of the rate.
TBF_CEILING = 1448 / 1514

LINKS = {
    # name: (tc rate or None for loopback, rate in MB/s or None, configs, sizes, quick sizes)
    "loopback": (None, None,
                 [("starling secure", "starling", False, "fp32"),
                  ("starling secure zmq", "starling", "secure-zmq", "fp32"),
                  ("starling insecure", "starling", True, "fp32"),
                  ("starling insecure zmq", "starling", "zmq", "fp32"),
                  ("gloo", "gloo", False, "fp32")],
                 [1, 16, 64, 256], [1, 16]),
    "100mbit": ("100mbit", 12.5,
                [("starling secure fp32", "starling", False, "fp32"),
                 ("starling secure zmq fp32", "starling", "secure-zmq", "fp32"),
                 ("starling secure int8", "starling", False, "int8"),
                 ("gloo", "gloo", False, "fp32")],
                [1, 16, 64], [1, 16]),
    "10mbit": ("10mbit", 1.25,
               [("starling secure fp32", "starling", False, "fp32"),
                ("starling secure zmq fp32", "starling", "secure-zmq", "fp32"),
                ("starling secure int8", "starling", False, "int8"),
                ("gloo", "gloo", False, "fp32")],
               [1, 8], [1]),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def expected_seconds(sizes, reps, rate_mbps):
    """A generous bound on one configuration's run time, for its timeout."""
    bw = rate_mbps * 0.5 if rate_mbps else 20.0  # MB/s; loopback on a busy 2-core box is slow
    per_rep = sum(2 * (PEERS - 1) / PEERS * mb / bw + 2 for mb in sizes)
    return 90 + 3 * per_rep * reps


def collect(procs, timeout):
    """Waits for every peer; returns (their JSON results, the first failure or None). A peer that
    fails makes the others wait for it until their timeouts, so the rest are killed soon after."""
    deadline = time.monotonic() + timeout
    failure = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if now > deadline:
            failure = f"timed out after {timeout:.0f} s"
            break
        if failure is None and any(p.returncode not in (None, 0) for p in procs):
            bad = next(i for i, p in enumerate(procs) if p.returncode not in (None, 0))
            failure = f"rank {bad} exited with status {procs[bad].returncode}"
            deadline = min(deadline, now + 10)
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    outputs = []
    for rank, p in enumerate(procs):
        out = p.stdout.read()
        line = next((x for x in reversed(out.strip().splitlines()) if x.startswith("{")), None)
        try:
            result = json.loads(line) if line else {"error": f"no output (exit {p.returncode})"}
        except json.JSONDecodeError:
            result = {"error": f"unreadable output: {line[:200]}"}
        if "error" in result:
            failure = f"rank {rank}: {result['error']}" if failure is None else failure
        outputs.append(result)
    return outputs, failure


def run_config(a, link, lab, rate_mbps, label, backend, insecure, precision, sizes, port, reps,
               workdir):
    ips = [netlab("ip", lab, str(i)) for i in range(PEERS)] if lab else ["127.0.0.1"] * PEERS
    procs, logs = [], []
    timeout = expected_seconds(sizes, reps + a.warmup, rate_mbps)
    try:
        for rank in range(PEERS):
            cmd = [a.peer, "--backend", backend, "--rank", str(rank), "--world", str(PEERS),
                   "--ip", ips[rank], "--root-ip", ips[0], "--root-port", str(port),
                   "--precision", precision, "--sizes", ",".join(str(s) for s in sizes),
                   "--reps", str(reps), "--warmup", str(a.warmup),
                   "--timeout-s", str(int(timeout))]
            if backend == "starling":
                # insecure: True (plain direct data links), "zmq" (plain, chunks through
                # ZeroMQ), False (CURVE, sealed direct links) or "secure-zmq" (CURVE, ZeroMQ)
                secure = insecure in (False, "secure-zmq")
                cmd += ["--keys", os.path.join(workdir, "keys")] if secure else ["--insecure"]
                if insecure in ("zmq", "secure-zmq"):
                    cmd += ["--zmq-data"]
                if a.chunk_bytes:
                    cmd += ["--chunk-bytes", str(a.chunk_bytes)]
            if lab:
                cmd = ["ip", "netns", "exec", netlab("ns", lab, str(rank))] + cmd
            err_path = os.path.join(workdir, f"{link}-{label.replace(' ', '_')}-{rank}.log")
            logs.append(err_path)
            with open(err_path, "w") as err:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                              env=dict(os.environ, OMP_NUM_THREADS="1")))
        outputs, failure = collect(procs, timeout)
    finally:
        for p in procs:  # Ctrl-C or a bug here: no peer outlives the run
            if p.poll() is None:
                p.kill()
                p.wait()
    if failure:
        tails = []
        for path in logs:
            with open(path) as f:
                tails.append(f"--- {os.path.basename(path)}\n" + "".join(f.readlines()[-8:]))
        log(f"  FAILED {link} {label}: {failure}\n" + "\n".join(tails))
        return {"error": failure}

    rows = []
    for i, mb in enumerate(sizes):
        per_rank = [o["results"][i] for o in outputs]
        # The collective is done when the slowest peer is: per repetition, the max over peers.
        times = [max(r["seconds"][k] for r in per_rank) for k in range(len(per_rank[0]["seconds"]))]
        med, best = statistics.median(times), min(times)
        nbytes = per_rank[0]["bytes"]
        busbw = nbytes * 2 * (PEERS - 1) / PEERS / med / 1e6
        secure = backend == "starling" and insecure in (False, "secure-zmq")
        row = {"link": link, "config": label, "backend": backend, "precision": precision,
               "secure": secure, "mb": mb, "bytes": nbytes,
               "times_s": times, "median_s": med, "min_s": best,
               "algbw_MBps": nbytes / med / 1e6, "busbw_MBps": busbw,
               "busbw_over_rate": busbw / rate_mbps if rate_mbps else None,
               "max_err": max(r["max_err"] for r in per_rank)}
        if "sent_bytes_per_rep" in per_rank[0]:
            sent = statistics.mean(r["sent_bytes_per_rep"] for r in per_rank)
            row["wire_MB_per_peer"] = sent / 1e6
        rows.append(row)
    return {"rows": rows, "peers": outputs}


def add_ratios(rows):
    """starling/gloo per link and size; int8 effective / fp32 per link and size."""
    by = {(r["link"], r["mb"], r["config"]): r for r in rows}
    for r in rows:
        gloo = by.get((r["link"], r["mb"], "gloo"))
        r["vs_gloo"] = (r["busbw_MBps"] / gloo["busbw_MBps"]
                        if gloo and r["backend"] == "starling" else None)
        r["int8_over_fp32"] = None
        if r["precision"] == "int8":
            fp32 = by.get((r["link"], r["mb"], r["config"].replace("int8", "fp32")))
            if fp32:
                r["int8_over_fp32"] = r["busbw_MBps"] / fp32["busbw_MBps"]


def fmt(x, spec, width):
    return f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"


def print_table(rows):
    head = (f"{'link':<9}{'config':<26}{'MB':>5} | {'median s':>9}{'min s':>9} | "
            f"{'busbw MB/s':>11}{'/rate':>7} | {'vs gloo':>8}{'int8/fp32':>10} | {'max err':>8}")
    print(head)
    print("-" * len(head))
    last = None
    for r in rows:
        if last and last != r["link"]:
            print()
        last = r["link"]
        print(f"{r['link']:<9}{r['config']:<26}{r['mb']:>5g} | {r['median_s']:>9.3f}"
              f"{r['min_s']:>9.3f} | {r['busbw_MBps']:>11.2f}{fmt(r['busbw_over_rate'], '.3f', 7)}"
              f" | {fmt(r['vs_gloo'], '.2f', 8)}{fmt(r['int8_over_fp32'], '.2f', 10)} | "
              f"{r['max_err']:>8.3g}")
    print(f"busbw = fp32 bytes * 2(n-1)/n / median time, n = {PEERS}, MB = 1e6 bytes (int8: "
          "effective); /rate = busbw over the link rate (tbf caps TCP goodput at "
          f"{TBF_CEILING:.3f}x); vs gloo = busbw / gloo's busbw, same link and size; "
          "int8/fp32 = effective bandwidth of int8 over fp32, both secure")


def check_targets(rows):
    """The README's targets, on limited links only; returns printable lines."""
    out = []
    for r in rows:
        # The targets are for the default data path; "zmq" rows are there for comparison.
        if r["busbw_over_rate"] is None or r["backend"] != "starling" or "zmq" in r["config"]:
            continue
        where = f"{r['link']} {r['mb']:g} MB {r['config']}"
        if r["precision"] == "fp32" and r["secure"]:
            ok = r["busbw_over_rate"] >= 0.95
            out.append(f"{'ok  ' if ok else 'MISS'} busbw/rate >= 0.95: {where}: "
                       f"{r['busbw_over_rate']:.3f}")
            if r["vs_gloo"] is not None:
                ok = r["vs_gloo"] >= 1.0
                out.append(f"{'ok  ' if ok else 'MISS'} >= 1.0x gloo: {where}: {r['vs_gloo']:.2f}")
        if r["int8_over_fp32"] is not None:
            ok = r["int8_over_fp32"] >= 3.5
            out.append(f"{'ok  ' if ok else 'MISS'} int8 >= 3.5x fp32 effective: {where}: "
                       f"{r['int8_over_fp32']:.2f}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    ap.add_argument("--links", default="loopback,100mbit,10mbit", help="comma-separated subset")
    ap.add_argument("--reps", type=int, default=0, help="timed repetitions (default 5; quick 2)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions per size")
    ap.add_argument("--peer", default=os.path.join(ROOT, "build", "starling_allreduce_peer"),
                    help="the peer binary (default: build/starling_allreduce_peer)")
    ap.add_argument("--json", dest="json_out", default="",
                    help="also write every peer's output and the table here (JSON)")
    ap.add_argument("--base-port", type=int, default=29700, help="rank 0 listens from here up")
    ap.add_argument("--chunk-bytes", type=int, default=0,
                    help="Starling's pipelined chunk size (default: the Node's, 512 KB)")
    ap.add_argument("--configs", default="",
                    help="comma-separated substrings; run only configurations whose name has one")
    a = ap.parse_args(argv)
    reps = a.reps or (2 if a.quick else 5)
    links = [x for x in a.links.split(",") if x]
    for name in links:
        if name not in LINKS:
            ap.error(f"unknown link '{name}' (known: {', '.join(LINKS)})")
    if not os.access(a.peer, os.X_OK):
        ap.error(f"no peer binary at {a.peer}: build it (make build) or pass --peer PATH")
    why = labs_unavailable() if any(LINKS[n][0] for n in links) else ""
    if why:
        log(f"run.py: shaped links skipped: {why}")
        links = [n for n in links if not LINKS[n][0]]

    workdir = tempfile.mkdtemp(prefix="starling-allreduce-")
    subprocess.run([a.peer, "--keygen", os.path.join(workdir, "keys"), "--world", str(PEERS)],
                   check=True)
    rows, raw, failures = [], [], []
    port = a.base_port
    started = time.monotonic()
    try:
        for link in links:
            rate, rate_mbps, configs, sizes, quick_sizes = LINKS[link]
            sizes = quick_sizes if a.quick else sizes
            lab = None
            try:
                if rate:
                    lab = f"ar{os.getpid()}-{link}"
                    netlab("up", lab, str(PEERS), rate)
                for label, backend, insecure, precision in configs:
                    if a.configs and not any(c in label for c in a.configs.split(",")):
                        continue
                    port += 1
                    t0 = time.monotonic()
                    log(f"{link}: {label} x {sizes} MB, {reps} reps ...")
                    res = run_config(a, link, lab, rate_mbps, label, backend, insecure, precision,
                                     sizes, port, reps, workdir)
                    raw.append({"link": link, "config": label, **res})
                    if "error" in res:
                        failures.append(f"{link} {label}: {res['error']}")
                        continue
                    rows += res["rows"]
                    log(f"  {time.monotonic() - t0:.0f} s: " + ", ".join(
                        f"{r['mb']:g} MB {r['busbw_MBps']:.1f} MB/s" for r in res["rows"]))
            finally:
                if lab:
                    netlab("down", lab, check=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    add_ratios(rows)
    print_table(rows)
    targets = check_targets(rows)
    if targets:
        print("\ntargets (limited links):")
        print("\n".join(targets))
    for f in failures:
        print(f"FAILED: {f}")
    print(f"total {time.monotonic() - started:.0f} s")
    if a.json_out:
        report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                  "host": platform.node(), "cpus": len(os.sched_getaffinity(0)),
                  "settings": dict(vars(a), reps=reps), "rows": rows, "targets": targets,
                  "failures": failures, "runs": raw}
        os.makedirs(os.path.dirname(os.path.abspath(a.json_out)), exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"wrote {a.json_out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
