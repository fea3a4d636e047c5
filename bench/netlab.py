"""scripts/netlab.sh from the benchmark drivers: run its subcommands and ask whether labs work."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETLAB = os.path.join(ROOT, "scripts", "netlab.sh")


def netlab(*args, check=True):
    """Runs `netlab.sh ARGS...`; its stdout, stripped. RuntimeError with stderr on failure."""
    p = subprocess.run([NETLAB, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"netlab.sh {' '.join(args)} failed: {p.stderr.strip()}")
    return p.stdout.strip()


def labs_unavailable():
    """Empty if labs can be built here, else why not (one line)."""
    if not os.access(NETLAB, os.X_OK):
        return f"{NETLAB} is missing or not executable"
    p = subprocess.run([NETLAB, "check"], capture_output=True, text=True)
    return "" if p.returncode == 0 else (p.stderr.strip() or p.stdout.strip())
