#!/usr/bin/env python3
"""Chaos at the run's end: short swarm runs that train to their last step while one fault
strikes in their last rounds, then checks that the peers still end together on one model.

    /usr/bin/python3 bench/chaos/ends.py --starling build/starling               # 7 strategies x 6
    /usr/bin/python3 bench/chaos/ends.py --strategies co2 --reps 20 --seed 3      # one, longer
    /usr/bin/python3 bench/chaos/ends.py --out /tmp/ends                          # keep the logs

The chaos harness (run.py) stops its swarms with SIGTERM, so it never reaches a last round. A
run's end has paths of its own: every strategy closes with one more agreement, the last round of
localsgd and diloco runs again where it went through on no peer, co2 drains its last average, a
peer that joins in the last round ends it with the others. Here each run (--rounds rounds of
--local-steps steps; ddp and atom: --steps steps, a round each) starts --peers `starling peer`
processes on loopback, and once the swarm reaches a step drawn from its last two rounds (the
last --window steps for ddp and atom), the harness strikes once, drawing from --seed:

  kill          SIGKILL a random peer, which stays dead;
  kill-restart  SIGKILL a random peer and start it again 0.2-1.5 s later: a new process that
                joins through the live members with a fresh run directory;
  straggle      SIGSTOP a random peer for 0.5 to 3 times net.peer_timeout_ms, then SIGCONT;
  join          a new peer joins through the live members, started --start-seconds before the
                drawn step (at the swarm's pace) so that it lands near it.

Then it waits for every process to exit, and checks:

  hang      every process exits within --limit seconds of the run's start;
  exit      every process exits 0, except the one killed, and a late one (restart or joiner)
            whose swarm had ended before it could join: it fails saying it could not join;
  step      every process that exits 0 ends at the run's last step, with its checkpoint there;
  one model the final checkpoints of all of them hold the same weights (the bytes of the
            checkpoint's model file), whichever peers were there at the end; except the stopped
            peer where it says it closed the run alone (stopped past the peer timeout while the
            others ended it, it finds them gone): its model is its own.

One line per run, a summary line per strategy ending in PASS or FAIL (it counts the runs whose
fault came after the run's end, which checked a plain end only); exit status 1 if any run
failed. --out keeps every process's log (default: a temporary directory, removed on success).
"""
import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import ROOT, finish, prepare_corpus  # noqa: E402  (the chaos harness's helpers)

# What each strategy writes into [strategy] past its kind; ROUNDS marks those with local steps.
STRATEGIES = {
    "ddp": "",
    "atom": "",
    "localsgd": "local_steps = {L}\ntransfer_piece = \"4KB\"\n",
    "diloco": "local_steps = {L}\n",
    "co2": "local_steps = {L}\noverlap_steps = 0\n",
    "co2-early": "local_steps = {L}\noverlap_steps = 2\n",
    "co2-zero": "local_steps = {L}\nzero = true\n",
}
ROUNDS = {"localsgd", "diloco", "co2", "co2-early", "co2-zero"}
FAULTS = ["kill", "kill-restart", "straggle", "join"]
COULD_NOT_JOIN = "could not join the swarm through"
ENDED_ALONE = "this peer closes the run alone"


def write_config(path, data, strategy, steps, local_steps, timeout_ms):
    lines = STRATEGIES[strategy].format(L=local_steps)
    with open(path, "w") as f:
        f.write(f"""[model]
preset = "gpt2-tiny"
n_layer = 1
d_model = 32
n_head = 2
seq_len = 32

[data]
dir = "{data}"

[train]
steps = {steps}
batch_size = 4
threads = 1
log_every = 1
eval_every = 0
checkpoint_every = {steps}
sample_at_end = false

[optim]
lr = 1e-2
warmup_steps = 2

[strategy]
kind = "{strategy.split('-')[0]}"
{lines}
[net]
heartbeat_ms = {max(50, timeout_ms // 10)}
peer_timeout_ms = {timeout_ms}
join_timeout_s = 5
""")


class Process:
    """One `starling peer` process: its step events, exit and log."""

    def __init__(self, run, name, join, min_peers, rank=None):
        self.name = name
        self.dir = os.path.join(run.work, name)
        self.log_path = self.dir + ".log"
        argv = [run.args.starling, "peer", "--json", "-q", "--insecure", "--config", run.config,
                "--name", name, "--set", f'train.out_dir="{self.dir}"',
                "--set", f"net.min_peers={min_peers}"]
        if rank is not None:
            argv += ["--data-rank", str(rank), "--data-world", str(run.args.peers)]
        if join:
            argv += ["--join", *join]
        self.rank = rank
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.endpoint = None
        self.step = 0
        self.killed = False
        self.run = run
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "listening":
                self.endpoint = event["endpoint"]
            elif event.get("event") == "step":
                self.step = max(self.step, int(event["step"]))
                self.run.reached(self.step)

    def live(self):
        return self.proc.poll() is None and not self.killed

    def log_text(self):
        self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def model_digest(self, steps):
        path = os.path.join(self.dir, "checkpoints", f"step_{steps:08d}", "model.safetensors")
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]


class Run:
    def __init__(self, args, strategy, rep, work):
        self.args, self.strategy, self.work = args, strategy, work
        self.rng = random.Random(f"{args.seed}-{strategy}-{rep}")
        self.config = os.path.join(work, "run.toml")
        self.steps = args.rounds * args.local_steps if strategy in ROUNDS else args.steps
        self.swarm_step = 0
        self.lock = threading.Lock()
        self.procs = []
        self.stopped = None  # the peer a straggle stopped
        self.struck = True  # false where the fault found nothing to strike, or a joiner nobody
        # to join (the run had ended)

    def reached(self, step):
        with self.lock:
            self.swarm_step = max(self.swarm_step, step)

    def start(self, name, join, min_peers, rank=None):
        p = Process(self, name, join, min_peers, rank)
        self.procs.append(p)
        return p

    def endpoints(self):
        out = [p.endpoint for p in self.procs if p.live() and p.endpoint]
        self.rng.shuffle(out)
        return out

    def execute(self):
        a = self.args
        steps = self.steps
        window = 2 * a.local_steps if self.strategy in ROUNDS else a.window
        write_config(self.config, os.path.join(self.work, "..", "..", "data"), self.strategy,
                     steps, a.local_steps, a.peer_timeout_ms)
        fault = self.rng.choice(a.faults)
        at = steps - self.rng.randint(0, window)
        t0 = time.monotonic()
        first = self.start("peer-0", None, a.peers, 0)
        while first.endpoint is None and first.proc.poll() is None and time.monotonic() < t0 + 60:
            time.sleep(0.02)
        if first.endpoint is None:
            return f"peer-0 did not start listening: see {first.log_path}", fault, at
        for i in range(1, a.peers):
            self.start(f"peer-{i}", [first.endpoint], a.peers, i)
        # A process that joins takes about --start-seconds to start: it is started that much
        # earlier (at the swarm's pace so far), so that it lands near the drawn step.
        first_step = None
        while any(p.live() for p in self.procs) and time.monotonic() < t0 + a.limit:
            now, step = time.monotonic(), self.swarm_step
            if step > 0 and first_step is None:
                first_step = (now, step)
            lead = 0  # the pace over half a second at least: the first steps come in a burst
            if fault == "join" and first_step and now - first_step[0] >= 0.5:
                lead = (step - first_step[1]) / (now - first_step[0]) * a.start_seconds
            if step >= at - lead and (fault != "join" or lead > 0 or step >= at):
                break
            time.sleep(0.002)
        did = self.strike(fault)
        # Every process exits by itself (the killed one is gone already).
        deadline = t0 + a.limit
        hung = []
        while any(p.proc.poll() is None for p in self.procs):
            if time.monotonic() > deadline:
                for p in self.procs:
                    if p.proc.poll() is None:
                        hung.append(p.name)
                        p.proc.kill()
                break
            time.sleep(0.05)
        for p in self.procs:
            p.proc.wait()
        return self.check(hung, did), fault, at

    def strike(self, fault):
        live = [p for p in self.procs if p.live()]
        victim = self.rng.choice(live) if live else None
        if fault in ("kill", "kill-restart") and victim:
            victim.proc.send_signal(signal.SIGKILL)
            victim.killed = True
            step = self.swarm_step
            if fault == "kill-restart":
                time.sleep(self.rng.uniform(0.2, 1.5))
                join = self.endpoints()
                if not join:  # the others have ended: a process alone would be a new swarm
                    return f"kill {victim.name} at step {step} (too late to restart it)"
                self.start(victim.name + "-again", join, 1, victim.rank)
            return f"{fault} {victim.name} at step {step}"
        if fault == "straggle" and victim:
            self.stopped = victim
            pause = self.rng.uniform(0.5, 3.0) * self.args.peer_timeout_ms / 1000
            victim.proc.send_signal(signal.SIGSTOP)
            time.sleep(pause)
            victim.proc.send_signal(signal.SIGCONT)
            return f"straggle {victim.name} {pause:.1f} s from step {self.swarm_step}"
        if fault == "join" and self.endpoints():
            self.start("joiner", self.endpoints(), 1)
            return f"join at step {self.swarm_step}"
        self.struck = False
        return f"{fault}: nobody left to strike"

    def check(self, hung, did):
        problems = [f"{name} did not exit within {self.args.limit} s" for name in hung]
        finished = []
        for p in self.procs:
            if p.killed or p.name in hung:
                continue
            code = p.proc.returncode
            late = p.name.endswith("-again") or p.name == "joiner"
            if code != 0:
                if late and COULD_NOT_JOIN in p.log_text():
                    if p.name == "joiner":
                        self.struck = False  # the join did not happen: the run ended plainly
                    continue  # the swarm had ended: nobody left to join
                problems.append(f"{p.name} exited {code}: see {p.log_path}")
                continue
            digest = p.model_digest(self.steps)
            if digest is None:
                problems.append(f"{p.name} exited 0 without a checkpoint at step "
                                f"{self.steps} (last step {p.step}): see {p.log_path}")
                continue
            finished.append((p, digest))
        # The stopped peer, out of reach while the others ended the run, closes it alone on its
        # own model and says so; every other peer must agree.
        together = [(p, d) for p, d in finished
                    if p is not self.stopped or ENDED_ALONE not in p.log_text()]
        alone = len(finished) - len(together)
        models = {d for _, d in together}
        if len(models) > 1:
            problems.append("the peers end on different models: " +
                            ", ".join(f"{p.name} {d}" for p, d in finished))
        if not finished:
            problems.append("no peer finished the run")
        self.summary = (f"{did}; {len(together)} ended on one model" +
                        (f", {alone} alone on its own" if alone else "")) if not problems else did
        return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--reps", type=int, default=6, help="runs per strategy")
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300, help="ddp's and atom's steps")
    ap.add_argument("--rounds", type=int, default=6,
                    help="rounds of the strategies with local steps")
    ap.add_argument("--local-steps", type=int, default=150,
                    help="steps per round of the strategies with local steps: long enough that "
                         "a joiner started in the last rounds can land in them")
    ap.add_argument("--window", type=int, default=40,
                    help="ddp and atom: the fault strikes in the run's last this many steps")
    ap.add_argument("--faults", nargs="+", default=FAULTS, choices=FAULTS,
                    help="the faults drawn from (one per run)")
    ap.add_argument("--start-seconds", type=float, default=1.2,
                    help="how long a joining process takes to start: a join is started this "
                         "much before its drawn step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--peer-timeout-ms", type=int, default=1500)
    ap.add_argument("--limit", type=float, default=120,
                    help="seconds a run may take from its start to its last process's exit")
    ap.add_argument("--out", default="", help="keep every log here (default: a temporary directory)")
    args = ap.parse_args()
    if args.peers < 2:
        ap.error("--peers: at least 2, so that one survives a kill")
    if not os.access(args.starling, os.X_OK):
        ap.error(f"--starling {args.starling}: not an executable (build it with `make build`)")
    root = args.out or tempfile.mkdtemp(prefix="starling-ends-")
    os.makedirs(root, exist_ok=True)
    prepare_corpus(args.starling, root, args.seed)
    failed = False
    for strategy in args.strategies:
        bad = missed = 0
        for rep in range(args.reps):
            work = os.path.join(root, strategy, f"run-{rep}")
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            run = Run(args, strategy, rep, work)
            try:
                problems, fault, at = run.execute()
            finally:  # nothing left behind, stopped or running, whatever happened
                for p in run.procs:
                    if p.proc.poll() is None:
                        p.proc.send_signal(signal.SIGCONT)
                        p.proc.kill()
                        p.proc.wait()
            if isinstance(problems, str):
                problems = [problems]
            print(f"  {strategy} run {rep}: {getattr(run, 'summary', fault)} -> "
                  f"{'FAIL' if problems else 'ok'}", flush=True)
            for p in problems:
                print("    " + p, flush=True)
            bad += bool(problems)
            missed += not run.struck
        # A run the fault missed (the swarm ended first) checked only a plain end: say how many.
        print(f"ends {strategy}: {args.reps} runs, {bad} failed" +
              (f", {missed} without their fault (it came after the run's end)" if missed else "") +
              f" -> {'FAIL' if bad else 'PASS'}", flush=True)
        failed = failed or bad > 0
    finish(root, args.out, failed)


if __name__ == "__main__":
    main()
