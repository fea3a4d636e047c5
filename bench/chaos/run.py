#!/usr/bin/env python3
"""Chaos harness: a local swarm trains while a seeded monkey kills, stops and restarts its peers,
then the harness checks what must hold and prints one summary line per strategy.

    /usr/bin/python3 bench/chaos/run.py --starling build/starling              # 5 strategies x 120 s
    /usr/bin/python3 bench/chaos/run.py --strategies ddp --seconds 30          # quick look
    /usr/bin/python3 bench/chaos/run.py --seconds 300 --seed 7 --out /tmp/chaos
    sudo /usr/bin/python3 bench/chaos/run.py --lab                             # with link cuts

For each strategy of --strategies it starts --peers `starling peer` processes on loopback (a
one-layer gpt2-tiny, so a step takes milliseconds and the run is about the swarm, not the math)
and lets them train for --seconds. Meanwhile the monkey, drawing from --seed, acts every
--act-every seconds on average (uniform in half to one and a half times that):

  kill      SIGKILL a random running peer (probability --kill-share); after 0.5-2 s it starts again
            as a new process that joins through the live members (`--join`, every running
            member's endpoint) with a fresh run directory, as a machine that died and came back
            would;
  straggle  SIGSTOP a random running peer for 0.5 to 3 times net.peer_timeout_ms, then SIGCONT;
  cut       (with --lab, probability --cut-share) split the swarm: the links between a random
            minority of the running peers and the others are cut for 0.5 to 15 times
            net.peer_timeout_ms (past ten timeouts the sides stop writing to each other and must
            find each other again), then mended. Both sides train on; once mended, the swarm
            must become one again, the state with more training in it winning.

With --lab every peer slot runs in a network namespace of its own (scripts/netlab.sh, unshaped
links; needs root), which is what lets the monkey cut links. It acts only while a majority of
--peers stays running (neither killed, stopped nor cut off) afterwards.
At the end every process gets SIGTERM (stopped ones SIGCONT first): each writes a checkpoint and
exits. Then it checks:

  stall     the swarm's progress (any peer's step event) never pauses for longer than
            2 x net.peer_timeout_ms after the last of the monkey's acts that fell in the pause (a
            majority is always running; faults one after the other each take up to a timeout to
            notice, so a pause is held against its last one);
  state     at every round of a history, the peers that report one hold the same shared state:
            the CRC-32C of strategy.fingerprint, compared for every (round, lineage) that at least
            two peers reported (the two sides of a cut count the same rounds in two lineages);
  heal      after the last mend, every running peer reports one lineage again;
  crashes   no process exits other than the monkey's kills (exit 0 after SIGTERM; a restart still
            starting when the run ends may die of the SIGTERM, having nothing to save);
  steps     within one process, steps go up one at a time except across an adoption of the
            swarm's state (logged), and no adopted state is older than the step the swarm had
            reached (less a round's local steps, or one failed step): progress is never lost, and
            a step is never counted twice (the progress a cut-off side made apart is dropped when
            it adopts the other's state, as the partition rule says: those steps do not count, nor
            do those of a cut-off peer killed before it adopted; and once the run ends, a peer the
            others left alone keeps and saves what it holds);
  resume    the furthest survivor's final checkpoint loads: it trains 3 more steps alone with
            --resume.

The summary line ends in PASS or FAIL; the exit status is 1 if any strategy failed, and 77 when
--lab was asked for where network labs cannot be built. --out keeps
every process's log and metrics (default: a temporary directory, removed on success).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
STRATEGIES = ["ddp", "localsgd", "diloco", "co2", "atom"]
# Asked for by name only: co2 applying each average inside the next round (overlap_steps), co2
# with its outer state sharded (zero, the fingerprint taken from the gathered anchor), and
# every strategy with every peer swapped (two layers through a 600 KB budget of their 836 KB of
# training state, on the disk tier in the peer's run directory): the exchanges go a node's
# gradients at a time (ddp, atom) or in pieces of 4 KB (localsgd's average, diloco's outer
# step); co2 keeps its outer state in the tier and updates it a tensor at a time. atom-target:
# atom with a fixed target of 48 samples a step (the default shrinks with the swarm), so a peer
# killed while it accumulates leaves the survivors short, and they make the step up.
SWAPPED = {"ddp-swapped", "localsgd-swapped", "diloco-swapped", "co2-swapped", "atom-swapped"}
EXTRA_STRATEGIES = ["co2-early", "co2-zero", "atom-target"] + sorted(SWAPPED)
KINDS = dict({"co2-early": "co2", "co2-zero": "co2", "atom-target": "atom"},
             **{s: s[:-len("-swapped")] for s in SWAPPED})
# What a harness strategy writes into [strategy], past its kind; rounds of 4 steps.
STRATEGY_LINES = {"localsgd": "local_steps = 4\n", "diloco": "local_steps = 4\n",
                  "co2": "local_steps = 4\n", "co2-early": "local_steps = 4\noverlap_steps = 2\n",
                  "co2-zero": "local_steps = 4\nzero = true\n",
                  "atom-target": "target_batch = 48\n",
                  "localsgd-swapped": "local_steps = 4\ntransfer_piece = \"4KB\"\n",
                  "diloco-swapped": "local_steps = 4\ntransfer_piece = \"4KB\"\n",
                  "co2-swapped": "local_steps = 4\ntransfer_piece = \"4KB\"\n"}
# A peer's log line (stamped by the harness) saying it took the swarm's state.
ADOPTED = re.compile(r"\s*(-?[0-9.]+) \[\w+\] adopting the swarm's state from peer .* \(step (\d+),"
                     r"(.*held another history)?")
NETLAB = os.path.join(ROOT, "scripts", "netlab.sh")
WORDS = ["the", "jury", "said", "city", "election", "was", "of", "and", "report", "county",
         "that", "it", "new", "court", "judge"]


def write_corpus(directory, seed):
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    for d in range(16):
        with open(os.path.join(directory, f"doc{d}.txt"), "w") as f:
            for _ in range(80):
                f.write(" ".join(rng.choice(WORDS) for _ in range(12)) + ".\n")


def prepare_corpus(starling, root, seed):
    """The harness's corpus, tokenized under `root` (once): its data directory."""
    text, data = os.path.join(root, "text"), os.path.join(root, "data")
    if not os.path.isdir(data):
        write_corpus(text, seed)
        subprocess.run([starling, "data", "prepare", text, "--out", data,
                        "--val-fraction", "0.2"], check=True, stdout=subprocess.DEVNULL)
    return data


def finish(root, keep, failed):
    """Ends a harness run: the logs stay in `root` on failure or where asked for (`keep`), and
    the exit status says whether anything failed."""
    if failed:
        print(f"logs kept in {root}")
    elif not keep:
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


def write_config(path, data, strategy, timeout_ms):
    local = STRATEGY_LINES.get(strategy, "")
    with open(path, "w") as f:
        f.write(f"""[model]
preset = "gpt2-tiny"
n_layer = {2 if strategy in SWAPPED else 1}
d_model = 32
n_head = 2
seq_len = 32

[data]
dir = "{data}"

[train]
steps = 1000000           # the harness stops the swarm with SIGTERM
batch_size = 4
threads = 1
log_every = 1
eval_every = 0
checkpoint_every = 200
keep_checkpoints = 1
sample_at_end = false

[optim]
lr = 1e-2
warmup_steps = 2

[strategy]
kind = "{KINDS.get(strategy, strategy)}"
{local}fingerprint = true

{'[swap]' + chr(10) + 'budget = "600KB"' + chr(10) + 'tier = "disk"' + chr(10) if strategy in SWAPPED else ""}
[net]
heartbeat_ms = {max(50, timeout_ms // 10)}
peer_timeout_ms = {timeout_ms}
""")


def stalls(times, faults, limit):
    """The longest pause in `times` (the swarm's progress) as (seconds, seconds after the last
    fault within it), and the pauses that outlast their last fault by more than `limit`, as
    (seconds, start, seconds after the last fault). Faults that strike one after the other add
    up (each costs up to a timeout to notice), so a pause is held against its last fault."""
    longest, late = (0.0, 0.0), []
    for a, b in zip(times, times[1:]):
        hits = [t for t in faults if a - 0.05 <= t <= b]  # a fault just before the last step too
        recovery = b - max(hits) if hits else b - a
        if b - a > longest[0]:
            longest = (b - a, recovery)
        if recovery > limit:
            late.append((b - a, a, recovery))
    return longest, late


class Life:
    """One process of one peer slot: from its start to its exit."""

    def __init__(self, harness, slot, number, join):
        self.slot, self.number = slot, number
        self.dir = os.path.join(harness.work, f"peer-{slot}-life-{number}")
        self.log_path = self.dir + ".log"
        argv = harness.lab_prefix(slot) + [
                harness.args.starling, "peer", "--json", "-q", "--insecure",
                "--config", harness.config, "--data-rank", str(slot),
                "--data-world", str(harness.args.peers), "--name", f"peer-{slot}",
                "--set", f'train.out_dir="{self.dir}"',
                "--set", f"net.min_peers={harness.args.peers if join is None else 1}"]
        if harness.lab:
            argv += ["--set", f'net.listen="tcp://{harness.lab_ip(slot)}:0"']
        if join is not None:
            argv += ["--join", *join]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.endpoint = None
        self.steps = []          # (time, step) of every step event
        self.fingerprints = {}   # (round, lineage) -> CRC
        self.killed = False
        self.stopped_until = None
        self.seen = {}           # (round, lineage) -> when first reported
        self.harness = harness
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.log_reader = threading.Thread(target=self._read_log, daemon=True)
        self.log_reader.start()

    def _read_log(self):
        """The peer's log, each line stamped with the harness's clock (seconds into the run)."""
        for line in self.proc.stderr:
            self.log.write(f"{time.monotonic() - self.harness.t0:8.3f} {line}")
            self.log.flush()

    def _read(self):
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("event")
            now = time.monotonic()
            if kind == "listening":
                self.endpoint = event["endpoint"]
            elif kind == "step":
                self.steps.append((now, event["step"]))
                self.harness.progress(now, event["step"], self)
                net = event.get("net") or {}
                if "fingerprint_round" in net:
                    key = (int(net["fingerprint_round"]), int(net.get("fingerprint_lineage", 0)))
                    self.fingerprints[key] = int(net["fingerprint"])
                    self.seen.setdefault(key, now)

    def running(self):
        return (self.proc.poll() is None and not self.killed and self.stopped_until is None
                and self.slot not in self.harness.cut_off)


class Harness:
    def __init__(self, args, strategy, work):
        self.args, self.strategy, self.work = args, strategy, work
        self.rng = random.Random(f"{args.seed}-{strategy}")
        self.timeout_s = args.peer_timeout_ms / 1000.0
        self.config = os.path.join(work, "run.toml")
        self.lock = threading.Lock()
        self.progress_times = []   # times of step events (any peer), for stalls
        self.swarm_step = 0        # the highest step any peer reported
        self.lives = []
        self.slots = {}
        self.kills = self.straggles = self.cuts = 0
        self.lab = None          # the netlab's name (--lab)
        self.cut_off = set()     # slots cut off from the others now
        self.cut_times = {}      # slot -> times it was cut off
        self.cut_spans = []      # (start, end, side) of every cut
        self.last_mend = None
        self.counting = False
        self.t0 = time.monotonic()
        self.actions = open(os.path.join(work, "monkey.log"), "w")  # what the monkey did, when
        self.action_times = []

    def note(self, what):
        now = time.monotonic()
        self.action_times.append(now)
        self.actions.write(f"{now - self.t0:8.2f} {what}\n")
        self.actions.flush()

    def progress(self, now, step, life):
        with self.lock:
            if self.counting:
                self.progress_times.append(now)
            self.swarm_step = max(self.swarm_step, step)

    def start(self, slot, join):
        number = sum(1 for life in self.lives if life.slot == slot)
        life = Life(self, slot, number, join)
        self.lives.append(life)
        self.slots[slot] = life
        return life

    def lab_prefix(self, slot):
        return ["ip", "netns", "exec", f"{self.lab}-{slot}"] if self.lab else []

    def lab_ip(self, slot):
        return subprocess.run([NETLAB, "ip", self.lab, str(slot)], check=True, text=True,
                              stdout=subprocess.PIPE).stdout.strip()

    def links(self, action, side):
        for a in sorted(side):
            for b in range(self.args.peers):
                if b not in side:
                    subprocess.run([NETLAB, action, self.lab, str(a), str(b)], check=True)

    def live_endpoints(self):
        """Every running member's endpoint, shuffled: a restart is given them all, as a real
        deployment lists several entry points, since any one may die while it starts."""
        out = [life.endpoint for life in self.slots.values() if life.running() and life.endpoint]
        self.rng.shuffle(out)
        return out

    def running_count(self):
        return sum(1 for life in self.slots.values() if life.running())

    def run(self):
        args = self.args
        write_config(self.config, os.path.join(self.work, "..", "data"), self.strategy,
                     args.peer_timeout_ms)
        if args.lab:
            self.lab = f"chaos{os.getpid()}{self.strategy[:2]}"
            subprocess.run([NETLAB, "up", self.lab, str(args.peers), "unlimited"], check=True,
                           stdout=subprocess.DEVNULL, env=dict(os.environ,
                                                              NETLAB_OWNER_PID=str(os.getpid())))
        try:
            return self._run()
        finally:
            if self.lab:
                subprocess.run([NETLAB, "down", self.lab])

    def _run(self):
        args = self.args
        first = self.start(0, None)
        deadline = time.monotonic() + 60
        while first.endpoint is None and time.monotonic() < deadline and first.proc.poll() is None:
            time.sleep(0.05)
        if first.endpoint is None:
            raise SystemExit(f"peer 0 did not start listening: see {first.log_path}")
        for slot in range(1, args.peers):
            self.start(slot, [first.endpoint])
        # The clock starts at the swarm's first step.
        deadline = time.monotonic() + 120
        while not any(life.steps for life in self.lives) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(life.steps for life in self.lives):
            raise SystemExit(f"the swarm never took a step: see the logs in {self.work}")
        with self.lock:
            self.counting = True
            self.progress_times.append(time.monotonic())
        start = time.monotonic()
        end = start + args.seconds
        restarts = []  # (time, slot)
        mend_at = None
        next_act = start + self.rng.uniform(0.5, 1.5) * args.act_every
        majority = args.peers // 2 + 1
        while time.monotonic() < end:
            now = time.monotonic()
            for life in list(self.slots.values()):
                if life.stopped_until is not None and now >= life.stopped_until:
                    life.proc.send_signal(signal.SIGCONT)
                    life.stopped_until = None
                    self.note(f"SIGCONT peer-{life.slot}")
            if mend_at is not None and now >= mend_at:
                self.links("mend", self.cut_off)
                self.note(f"mend the links of peer(s) {sorted(self.cut_off)}")
                self.cut_spans.append((cut_at, now, self.cut_off))
                self.cut_off, mend_at, self.last_mend = set(), None, now
            for when, slot in list(restarts):
                if now >= when:
                    join = self.live_endpoints()
                    if join:
                        self.start(slot, join)
                        self.note(f"restart peer-{slot} joining {' '.join(join)}")
                        restarts.remove((when, slot))
            if now >= next_act:
                next_act = now + self.rng.uniform(0.5, 1.5) * args.act_every
                running = [life for life in self.slots.values() if life.running()]
                draw = self.rng.random()
                if self.lab and mend_at is None and draw < args.cut_share:
                    # A minority side, cut off while the rest keeps a majority.
                    size = self.rng.randint(1, max(1, (args.peers - 1) // 2))
                    if len(running) - size >= majority:
                        side = {life.slot for life in self.rng.sample(running, size)}
                        self.links("cut", side)
                        self.cut_off = side
                        for slot in side:
                            self.cut_times.setdefault(slot, []).append(now)
                        cut_at = now
                        mend_at = now + self.rng.uniform(0.5, 15.0) * self.timeout_s
                        self.cuts += 1
                        self.note(f"cut the links of peer(s) {sorted(side)} for "
                                  f"{mend_at - now:.1f} s")
                elif len(running) - 1 >= majority:
                    victim = self.rng.choice(running)
                    if self.rng.random() < args.kill_share:
                        victim.killed = True
                        victim.proc.send_signal(signal.SIGKILL)
                        self.kills += 1
                        self.note(f"SIGKILL peer-{victim.slot} (pid {victim.proc.pid})")
                        restarts.append((now + self.rng.uniform(0.5, 2.0), victim.slot))
                    else:
                        victim.proc.send_signal(signal.SIGSTOP)
                        victim.stopped_until = now + self.rng.uniform(0.5, 3.0) * self.timeout_s
                        self.straggles += 1
                        self.note(f"SIGSTOP peer-{victim.slot} for "
                                  f"{victim.stopped_until - now:.1f} s")
            time.sleep(0.02)
        if mend_at is not None:
            self.links("mend", self.cut_off)
            self.note(f"mend the links of peer(s) {sorted(self.cut_off)} (the run ends)")
            self.cut_spans.append((cut_at, time.monotonic(), self.cut_off))
            self.cut_off, self.last_mend = set(), time.monotonic()
        # One swarm again: a round after the last mend that every running peer reports in the
        # same lineage (the losing side of a split never heals without it, and the stall check
        # alone would not see that: the winning side trains on).
        healed = True
        if self.last_mend is not None:
            healed = False
            deadline = time.monotonic() + 12 * self.timeout_s + 10
            while time.monotonic() < deadline and not healed:
                common = None
                for life in self.slots.values():
                    if life.running():
                        keys = {k for k, t in list(life.seen.items()) if t > self.last_mend}
                        common = keys if common is None else common & keys
                healed = bool(common)
                time.sleep(0.2)
        self.healed = healed
        with self.lock:
            self.counting = False
            self.progress_times.append(time.monotonic())
        for life in self.slots.values():
            if life.stopped_until is not None:
                life.proc.send_signal(signal.SIGCONT)
                life.stopped_until = None
        # Restarts still pending were cut short by the end of the run: nothing to wait for.
        self.stopping_at = time.monotonic()
        for life in self.slots.values():
            if life.proc.poll() is None and not life.killed:
                life.proc.send_signal(signal.SIGTERM)
        for life in self.lives:
            try:
                life.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                life.proc.kill()
                life.proc.wait()
            life.reader.join(timeout=10)
            life.log_reader.join(timeout=10)
            life.log.close()
            with open(life.dir + ".steps", "w") as f:  # when each step was seen, for stalls
                f.writelines(f"{t - self.t0:.3f} {step}\n" for t, step in life.steps)
        return self.check()

    def check(self):
        limit = 2 * self.timeout_s
        times = sorted(self.progress_times)
        longest, late = stalls(times, self.action_times, limit)
        problems = []
        for gap, start, recovery in late[:3]:
            problems.append(f"the swarm stalled {gap:.1f} s from {start - self.t0:.1f} s (see "
                            f"monkey.log), {recovery:.1f} s after the last fault in that time "
                            f"(limit {limit:.1f} s)")
        # Shared state, round by round.
        rounds = {}
        for life in self.lives:
            for r, crc in life.fingerprints.items():  # r: (round, lineage)
                rounds.setdefault(r, {}).setdefault(crc, []).append(f"peer-{life.slot}/{life.number}")
        compared = sum(1 for v in rounds.values() if sum(len(x) for x in v.values()) >= 2)
        mismatched = {r: v for r, v in rounds.items() if len(v) > 1}
        for r in sorted(mismatched)[:3]:
            problems.append(f"round {r[0]} of lineage {r[1]}: peers hold different states: "
                            f"{mismatched[r]}")
        if not self.healed:
            problems.append("the swarm did not become one again after the last mend: its "
                            "running peers report different lineages")
        # Crashes.
        crashes = []
        for life in self.lives:
            code = life.proc.returncode
            if life.killed:
                continue
            if code == -signal.SIGTERM and not life.steps:
                continue  # still starting when the run ended: no handler yet, nothing to save
            if code != 0:
                crashes.append(life)
                problems.append(f"peer {life.slot} (life {life.number}) exited with {code}: "
                                f"see {life.log_path}")
        # Steps within each process go up one at a time, except across an adoption of the
        # swarm's state; and an adopted state is never older than what the swarm had reached.
        adoptions = self.adoptions()
        for life in self.lives:
            times = [t for t, _, l, _ in adoptions if l is life]
            for (ta, a), (tb, b) in zip(life.steps, life.steps[1:]):
                if b != a + 1 and not any(ta <= t <= tb for t in times):
                    problems.append(f"peer {life.slot} (life {life.number}) went from step {a} "
                                    f"to {b} without adopting the swarm's state")
                    break
        # Steps a cut-off side took apart, then dropped by adopting the other side's state, are
        # not steps the swarm reached.
        dropped = []
        for t, _, life, other in adoptions:
            cuts = [c for c in self.cut_times.get(life.slot, []) if c <= t]
            if other and cuts:
                dropped.append((life, max(cuts), t))
        # So are those of a cut-off peer killed before it adopted another history: what it
        # trained apart went with it (a restart joins with a fresh run directory), and its slot's
        # next life, joining after the mend, is not measured against it. (Had its side won, a
        # surviving peer of it holds those steps.)
        for cut_start, cut_end, side in self.cut_spans:
            for life in self.lives:
                if (life.slot not in side or not life.killed or not life.steps
                        or life.steps[-1][0] < cut_start or life.steps[0][0] > cut_end):
                    continue
                if any(l is life and other and t >= cut_start for t, _, l, other in adoptions):
                    continue
                dropped.append((life, cut_start, life.steps[-1][0]))
        events = sorted((t, s, life) for life in self.lives for t, s in life.steps
                        if not any(l is life and a <= t <= b for l, a, b in dropped))
        # While split, and until the sides have found each other again (up to ten timeouts
        # after the mend, and a round), each side trains apart: an adoption is measured against
        # the steps of its own side only.
        heal_s = 12 * self.timeout_s

        def same_side(t, x, y):
            for start, end, side in self.cut_spans:
                if start <= t <= end + heal_s and ((x.slot in side) != (y.slot in side)):
                    return False
            return True
        slack = 4 if self.strategy in STRATEGY_LINES else 1  # local steps, a failed one
        lost = 0
        for t, step, life, other in adoptions:
            if t > self.stopping_at:
                continue  # the swarm is leaving: a peer left alone keeps what it holds, to save it
            if other and any(l is life and a <= t <= b for l, a, b in dropped):
                continue  # the losing side of a cut: its own steps since are dropped, by rule
            reached = max((s for te, s, other_life in events
                           if te < t and same_side(te, life, other_life)), default=0)
            if step < reached - slack:
                lost += 1
                if lost <= 3:
                    problems.append(f"peer {life.slot} (life {life.number}) adopted a state of "
                                    f"step {step} {t - self.t0:.1f} s into the run, when the swarm "
                                    f"had reached step {reached}: progress lost")
        resumed = self.resume()
        if resumed is not True:
            problems.append(resumed)
        # Re-deals of the data among a round's peers (strategy.redeal_data), each peer's counted.
        redeals = self.count_log_lines("is dealt again among")
        kills_restarted = sum(1 for life in self.lives if life.number > 0)
        line = (f"chaos {self.strategy}: {self.args.seconds:.0f} s, {self.args.peers} peers, "
                f"{self.kills} kills ({kills_restarted} restarts), {self.straggles} stragglers"
                f"{f', {self.cuts} cuts' if self.lab else ''}; "
                f"longest stall {longest[0]:.1f} s, {longest[1]:.1f} s after its last fault "
                f"(limit {limit:.1f}); step {self.swarm_step}; "
                f"{compared} rounds compared, {len(mismatched)} differ; "
                f"{redeals} data re-deals; "
                f"{len(crashes)} crashes; resume {'ok' if resumed is True else 'FAILED'} -> "
                f"{'PASS' if not problems else 'FAIL'}")
        return line, problems, {"kills": self.kills, "stragglers": self.straggles,
                                "cuts": self.cuts,
                                "stall_s": longest[0], "recovery_s": longest[1],
                                "rounds": compared,
                                "mismatched": len(mismatched), "crashes": len(crashes),
                                "redeals": redeals,
                                "steps": self.swarm_step}

    def count_log_lines(self, text):
        """How many lines of all the processes' logs hold `text`."""
        n = 0
        for life in self.lives:
            try:
                with open(life.log_path) as f:
                    n += sum(1 for line in f if text in line)
            except OSError:
                pass
        return n

    def adoptions(self):
        """(time, step, life) of every adoption of the swarm's state, from the stamped logs."""
        out = []
        for life in self.lives:
            try:
                with open(life.log_path) as f:
                    for line in f:
                        m = ADOPTED.match(line)
                        if m:
                            out.append((self.t0 + float(m.group(1)), int(m.group(2)), life,
                                        m.group(3) is not None))
            except OSError:
                pass
        return out

    def resume(self):
        """The furthest survivor's checkpoint trains 3 more steps alone."""
        survivors = [life for life in self.slots.values()
                     if not life.killed and life.proc.returncode == 0 and life.steps]
        if not survivors:
            return "no survivor to resume"
        life = max(survivors, key=lambda x: x.steps[-1][1])
        ckpts = os.path.join(life.dir, "checkpoints")
        if not os.path.isdir(ckpts) or not os.listdir(ckpts):
            return f"peer {life.slot} (life {life.number}) left no checkpoint in {life.dir}"
        step = life.steps[-1][1]
        log_path = life.dir + ".resume.log"
        with open(log_path, "w") as log:
            r = subprocess.run([self.args.starling, "peer", "--json", "-q", "--insecure",
                                "--config", self.config, "--resume",
                                "--set", f'train.out_dir="{life.dir}"',
                                "--set", f"train.steps={step + 3}", "--set", "net.min_peers=1"],
                               stdout=subprocess.PIPE, stderr=log, text=True, timeout=180)
        text = open(log_path).read()
        if r.returncode != 0 or "resumed from" not in text:
            return f"--resume of peer {life.slot}'s checkpoint failed (exit {r.returncode}): see {log_path}"
        return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    ap.add_argument("--strategies", nargs="+", default=STRATEGIES,
                    choices=STRATEGIES + EXTRA_STRATEGIES,
                    help="co2-early: co2 with overlap_steps = 2 of 4; co2-zero: co2 with zero = "
                         "true; atom-target: atom with a fixed target of 48 samples a step; "
                         "KIND-swapped: that strategy "
                         "with every peer swapped through a budget on disk (none of these in the "
                         "default list)")
    ap.add_argument("--peers", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--act-every", type=float, default=4.0,
                    help="mean seconds between the monkey's acts")
    ap.add_argument("--kill-share", type=float, default=0.7,
                    help="share of acts that are kills (the rest are stragglers)")
    ap.add_argument("--peer-timeout-ms", type=int, default=1500)
    ap.add_argument("--lab", action="store_true",
                    help="run every peer in a network namespace of its own, so the monkey can "
                         "cut links (needs root: scripts/netlab.sh)")
    ap.add_argument("--cut-share", type=float, default=0.25,
                    help="with --lab: share of acts that are link cuts")
    ap.add_argument("--out", default="", help="keep every log here (default: a temporary directory)")
    args = ap.parse_args()
    if args.peers < 3:
        ap.error("--peers: at least 3, so that a majority survives a kill")
    if args.lab:
        why = subprocess.run([NETLAB, "check"], text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
        if why.returncode != 0:
            # 77: "skipped" to CTest (ChaosTest.QuickRunWithCuts), a clear no to a user.
            print(f"--lab: network labs cannot be built here, so no run: {why.stdout.strip()}",
                  file=sys.stderr)
            sys.exit(77)
    if not os.access(args.starling, os.X_OK):
        ap.error(f"--starling {args.starling}: not an executable (build it with `make build`)")
    root = args.out or tempfile.mkdtemp(prefix="starling-chaos-")
    os.makedirs(root, exist_ok=True)
    prepare_corpus(args.starling, root, args.seed)
    failed = False
    totals = {"kills": 0, "stragglers": 0, "cuts": 0, "rounds": 0}
    for strategy in args.strategies:
        work = os.path.join(root, strategy)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        line, problems, figures = Harness(args, strategy, work).run()
        print(line, flush=True)
        for p in problems:
            print("  " + p, flush=True)
        failed = failed or bool(problems)
        for k in totals:
            totals[k] += figures[k]
    print(f"chaos total: {len(args.strategies)} strategies, {totals['kills']} kills, "
          f"{totals['stragglers']} stragglers, {totals['cuts']} cuts, "
          f"{totals['rounds']} rounds compared -> "
          f"{'FAIL' if failed else 'PASS'}")
    finish(root, args.out, failed)


if __name__ == "__main__":
    main()
