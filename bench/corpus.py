"""The byte-level Brown corpus that bench/atom and bench/strategies train on (data/brown/byte).

`make demo` prepares it; a benchmark run without it prepares it here from data/brown/text
(scripts/fetch-brown.sh) instead of letting every peer fail on a missing directory."""
import os
import subprocess
import sys
import tomllib

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BYTE = os.path.join(ROOT, "data", "brown", "byte")
TEXT = os.path.join(ROOT, "data", "brown", "text")


def ensure_byte_corpus(starling, config):
    """When `config` trains on data/brown/byte and it is missing, prepares it with `starling data
    prepare --tokenizer byte`; exits with what to run when the text it is made from is missing
    too. A config that trains on other data is left alone."""
    with open(config, "rb") as f:
        data_dir = tomllib.load(f).get("data", {}).get("dir", "")
    if os.path.normpath(os.path.join(ROOT, data_dir)) != BYTE:
        return
    if os.path.isfile(os.path.join(BYTE, "meta.json")):
        return
    if not os.path.isdir(TEXT):
        sys.exit(f"{BYTE} is missing and so is {TEXT}: run `make demo`, or "
                 "scripts/fetch-brown.sh and then this benchmark again")
    print(f"preparing {BYTE} from {TEXT}", file=sys.stderr, flush=True)
    subprocess.run([starling, "data", "prepare", TEXT, "--out", BYTE, "--tokenizer", "byte"],
                   check=True, cwd=ROOT)
