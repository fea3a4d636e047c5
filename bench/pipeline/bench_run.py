"""What the pipeline benchmarks (run.py, labs.py) share: running a command into a log, and a work
directory with the byte-level corpus prepared and a run.toml that trains on it."""
import os
import subprocess
import sys
import tempfile


def run(cmd, log):
    """Runs `cmd` with its output in `log`; exits with the log's tail if it fails."""
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + open(log).read()[-3000:])


def prepare(starling, text, prefix, model, train, extra=""):
    """A fresh work directory under /tmp: `text` prepared into work/data, and work/run.toml with
    [model] `model`, [data] dir = that corpus, [train] `train` plus the settings every benchmark
    run shares (one thread per peer, no evaluation, checkpoints or sample), then `extra` TOML.
    Returns (work, path of run.toml)."""
    work = tempfile.mkdtemp(prefix=prefix)
    data = os.path.join(work, "data")
    run([starling, "data", "prepare", text, "--out", data], os.path.join(work, "prepare.log"))
    cfg = os.path.join(work, "run.toml")
    with open(cfg, "w") as f:
        f.write(f'[model]\n{model}[data]\ndir = "{data}"\n[train]\n{train}'
                "threads = 1\nlog_every = 1\neval_every = 0\ncheckpoint_every = 0\n"
                f"sample_at_end = false\n{extra}")
    return work, cfg
