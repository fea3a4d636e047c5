#!/usr/bin/env bash
# netlab.sh: a "network lab" of peers on bandwidth-limited links, for tests and benchmarks.
#
# A lab NAME with N peers is N network namespaces NAME-0 .. NAME-(N-1) plus a hub namespace
# NAME-hub that holds a Linux bridge br0. Every peer namespace has loopback up and one interface
# eth0, a veth whose other end (p<i>) is a port of br0 in the hub. So the peers form a star, like
# machines behind their own access links meeting at a switch, and each access link is shaped in
# BOTH directions with a token bucket (tc tbf) at RATE:
#   upload   = egress of eth0 in NAME-i      (peer -> hub)
#   download = egress of p<i> in NAME-hub    (hub -> peer)
# so a peer that sends to several others at once shares its upload, and several senders to one
# peer share its download, as on real links.
#
# Addresses: peer i is 10.X.Y.(i+1)/24 on eth0, where X.Y are the two low bytes of the POSIX
# `cksum` of NAME (deterministic, so addresses can be predicted from the name and two labs are
# usually told apart in logs). A collision is harmless: every lab lives in namespaces of its own
# and nothing routes between labs or to the host.
#
# Interface names are fixed (eth0 in a peer, br0 and p<i> in the hub) and veths are created
# inside the hub, never in the root namespace, so NAME is not bound by the 15-character limit on
# interface names and labs never clash on them.
#
# tbf parameters (shaping_params below has the numbers and why): burst is ~1 ms of traffic (at
# least 4 full frames), so a link that has been idle hands out no free burst big enough to
# distort a benchmark; limit holds ~50 ms of traffic, a typical access-link buffer. GSO: veth
# sends TCP super-packets of up to 64 KB; tbf (kernel >= 3.14) splits one larger than the burst
# into segments, but a 44-segment burst landing on a 10mbit queue of 32 frames is mostly dropped
# (measured: 7000 drops in 3 s, goodput down to 0.90x in one run of three). So each shaped veth
# gets gso_max_size = burst/2: super-packets always fit the bucket and the queue, while 1gbit
# links keep ~60 KB super-packets and stay cheap on CPU. Measured TCP goodput (python, 3 s,
# median of 3): 0.958x at 10mbit, 0.956x at 100mbit, 0.955x at 1gbit; the ceiling is
# 1448/1514 = 0.956 since tbf counts Ethernet+IP+TCP headers.
#
# Lab state lives in $NETLAB_STATE_DIR (default /run/starling-netlab)/NAME/: `pid` holds the
# owner's pid and its start time (from /proc/PID/stat, so a reused pid is not mistaken for the
# owner); `gc` removes every lab whose owner is gone. The owner is $NETLAB_OWNER_PID if set, else
# the process that ran `netlab.sh up` (its parent pid).
#
# Usage (root, or CAP_NET_ADMIN + CAP_SYS_ADMIN):
#   netlab.sh up NAME N RATE      build the lab; RATE is a tc rate (10mbit, 100mbit, 1gbit, 500kbit,
#                                 12mbps = bytes/s, ...) or `unlimited` (no qdisc); on failure the
#                                 partial lab is removed. Fails if NAME exists.
#   netlab.sh shape NAME I R0 R1 ...
#                                 per-destination rates for peer I's upload, one per peer of the
#                                 lab (Rj = rate of the link I -> j; `-` or `unlimited` = not
#                                 shaped; R_I is ignored). Replaces peer I's upload qdisc (eth0;
#                                 a download tbf from `up` stays): an htb qdisc with one class per
#                                 shaped destination, chosen by destination address, so each pair
#                                 of peers has a link of its own (a lab built `up ... unlimited`
#                                 then shaped peer by peer is a full rate matrix). Traffic to
#                                 other addresses is not shaped.
#   netlab.sh rate NAME I RATE    reshape peer I's access link, both directions, to RATE as `up`
#                                 shapes it (`unlimited` removes the shaping); replaces a
#                                 `shape` of its upload. A running lab's link changes at once:
#                                 a benchmark slows one peer while the others keep their rate.
#   netlab.sh cut NAME I J        cut the link between peers I and J: each drops what it sends to
#                                 the other (a blackhole route to the other's address), as when a
#                                 route between two sites fails; open TCP connections stay open
#                                 and their segments are lost until `mend`. Idempotent.
#   netlab.sh mend NAME I J       undo `cut` (idempotent): retransmissions get through again
#   netlab.sh unbridge NAME       take every p<i> out of br0, so that frames between peers no
#                                 longer cross the hub by themselves: a relay that reads and
#                                 writes p<i> (net/lab_delay_relay.h: the delays between peers)
#                                 carries them instead. Shaping stays as it is. Idempotent.
#   netlab.sh down NAME           remove the lab (idempotent; quiet if absent)
#   netlab.sh exec NAME I CMD...  run CMD in peer namespace I (I may also be `hub`)
#   netlab.sh ip NAME I           print peer I's address
#   netlab.sh ns NAME I           print peer I's namespace name
#   netlab.sh list                list labs: name, peers, rate, owner pid, alive/dead
#   netlab.sh gc                  remove labs whose owner process is dead
#   netlab.sh check               exit 0 if labs can be built here, else print why and exit 1
#   netlab.sh bench NAME FROM TO [SECONDS]
#                                 TCP throughput FROM -> TO (needs /usr/bin/python3); prints
#                                 "<mbit/s> Mbit/s"
# Overrides for experiments: NETLAB_BURST, NETLAB_LIMIT and NETLAB_GSO (bytes) replace the
# computed tbf burst, tbf limit and veth gso_max_size.
set -euo pipefail

STATE_ROOT="${NETLAB_STATE_DIR:-/run/starling-netlab}"
MTU_FRAME=1514  # bytes tbf accounts for a full Ethernet frame (1500 MTU + 14 header)

die() {
  echo "netlab: $*" >&2
  exit 1
}

usage() {
  sed -n '/^# Usage/,/^# Overrides/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

check_name() {
  [[ "$1" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$ ]] ||
    die "bad lab name '$1' (1-32 chars of [A-Za-z0-9_.-], not starting with '.' or '-')"
}

# Echoes "X Y" for the 10.X.Y.0/24 subnet of lab $1.
subnet_of() {
  local h
  h=$(printf '%s' "$1" | cksum)
  h=${h%% *}
  echo "$(((h >> 8) & 255)) $((h & 255))"
}

# Echoes the rate of a tc rate string in bits/s (integer), or fails.
rate_bits() {
  local s=${1,,} n unit
  [[ "$s" =~ ^([0-9]+)([a-z]*)$ ]] || die "bad rate '$1' (e.g. 10mbit, 1gbit, unlimited)"
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case "$unit" in
    "" | bit) echo "$n" ;;
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
    tbit) echo $((n * 1000000000000)) ;;
    bps) echo $((n * 8)) ;;
    kbps) echo $((n * 8000)) ;;
    mbps) echo $((n * 8000000)) ;;
    gbps) echo $((n * 8000000000)) ;;
    *) die "bad rate unit in '$1' (bit, kbit, mbit, gbit, tbit, bps, kbps, mbps, gbps)" ;;
  esac
}

# Echoes "BURST LIMIT GSO" in bytes for a rate in bits/s.
#  burst: ~1 ms of traffic, at least 4 full frames. tbf's watchdog is an hrtimer, so the bucket
#    need not cover a jiffy; it must cover timer/scheduling latency (tens of microseconds on a
#    busy VM) or the link idles while tokens are lost. 4 frames is ~5 ms at 10mbit, which keeps
#    the free burst a link gives after an idle period small compared to any real message.
#  limit: burst + ~50 ms of traffic (at least 32 frames): enough for TCP to keep the link busy
#    through its own bursts and for incast to queue like a real access link, without unbounded
#    bufferbloat.
#  gso: gso_max_size of the shaped veths, burst/2 (at most 64 KB): see the header.
shaping_params() {
  local bits=$1 bytes_per_s burst limit gso
  bytes_per_s=$((bits / 8))
  burst=$((bytes_per_s / 1000))
  ((burst >= 4 * MTU_FRAME)) || burst=$((4 * MTU_FRAME))
  limit=$((burst + bytes_per_s / 20))
  ((limit >= 32 * MTU_FRAME)) || limit=$((32 * MTU_FRAME))
  # tc keeps both in 32 bits (and refuses more): from about 700gbit up, the most it takes.
  ((burst <= 4294967295)) || burst=4294967295
  ((limit <= 4294967295)) || limit=4294967295
  burst=${NETLAB_BURST:-$burst}
  limit=${NETLAB_LIMIT:-$limit}
  gso=$((burst / 2))
  ((gso <= 65536)) || gso=65536
  echo "$burst $limit ${NETLAB_GSO:-$gso}"
}

# Start time (clock ticks since boot) of pid $1, or empty if it does not exist or is a zombie
# (a killed owner whose parent has not reaped it yet is dead for our purposes).
proc_start() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }  # drop "pid (comm) "; comm may contain spaces
  # Fields 3 (state) and 22 (start time) overall are 1 and 20 after dropping the first two.
  awk '$1 != "Z" && $1 != "X" {print $20}' <<<"$stat"
}

owner_alive() {
  local file=$1 pid start now
  [[ -r "$file" ]] || return 1
  read -r pid start <"$file" || return 1
  [[ -n "${pid:-}" ]] || return 1
  now=$(proc_start "$pid")
  [[ -n "$now" && "$now" == "${start:-}" ]]
}

# Removes a half-built lab when `up` fails (set -e) or dies on a signal.
BUILDING=""
on_exit_while_building() {
  local rc=$?
  if [[ -n "$BUILDING" ]]; then
    echo "netlab: building lab '$BUILDING' failed; removing it" >&2
    cmd_down "$BUILDING"
  fi
  exit "$rc"
}
trap 'exit 130' INT TERM

ns_exists() { [[ -e "/run/netns/$1" ]]; }

cmd_down() {
  local name=$1 ns
  check_name "$name"
  # Peers first (deleting a namespace destroys its veth end, and with it the hub's end), then the
  # hub. Match NAME-<digits> exactly so lab "a" never touches lab "a-1"'s namespaces.
  for ns in /run/netns/"$name"-*; do
    ns=${ns##*/}
    if [[ "$ns" =~ ^"$name"-([0-9]+|hub)$ ]]; then
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  rm -rf "${STATE_ROOT:?}/$name"
}

cmd_up() {
  local name=$1 n=$2 rate=$3
  check_name "$name"
  if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1 || n > 254)); then
    die "peer count must be 1..254, got '$n'"
  fi
  local bits=""
  if [[ "${rate,,}" != unlimited ]]; then
    bits=$(rate_bits "$rate")
    ((bits > 0)) || die "rate must be positive, got '$rate'"
  fi
  [[ -e "$STATE_ROOT/$name" ]] && die "lab '$name' exists (netlab.sh down $name first)"
  ns_exists "$name-hub" && die "namespace $name-hub exists (netlab.sh down $name first)"

  # Record the owner first, atomically, so gc can reclaim even a half-built lab.
  local owner=${NETLAB_OWNER_PID:-$PPID} tmp
  mkdir -p "$STATE_ROOT"
  tmp=$(mktemp -d "$STATE_ROOT/.$name.XXXXXX")
  local start
  start=$(proc_start "$owner")
  echo "$owner ${start:-dead}" >"$tmp/pid"  # an owner already gone: the lab is garbage at once
  echo "$n" >"$tmp/peers"
  echo "$rate" >"$tmp/rate"
  mv -T "$tmp" "$STATE_ROOT/$name" 2>/dev/null || {
    rm -rf "$tmp"
    die "lab '$name' exists"
  }
  BUILDING="$name"
  trap on_exit_while_building EXIT

  local x y hub="$name-hub" i ns
  read -r x y < <(subnet_of "$name")
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add name br0 type bridge stp_state 0 forward_delay 0
  ip -n "$hub" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns="$name-$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Created inside the hub with the peer end moved straight into its namespace, so interface
    # names never meet in the root namespace and need not be unique there.
    ip -n "$hub" link add name "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "p$i" master br0
    ip -n "$hub" link set "p$i" up
    ip -n "$ns" addr add "10.$x.$y.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    [[ -z "$bits" ]] || tbf_link "$name" "$i" "$bits"
  done
  BUILDING=""
}

cmd_unbridge() {
  local name=$1 n i
  check_name "$name"
  [[ -d "$STATE_ROOT/$name" ]] || die "no lab '$name'"
  n=$(<"$STATE_ROOT/$name/peers")
  for ((i = 0; i < n; i++)); do
    ip -n "$name-hub" link set "p$i" nomaster
  done
}

# Per-destination shaping of peer $2's upload: htb on eth0, one class per shaped destination
# (classid 1:<16+j in hex>) with the burst and a bfifo queue of shaping_params for its rate, picked
# by a u32 match on the destination address; unclassified traffic (default 0) leaves unshaped.
# Each class is a root of the htb tree, so no class borrows from another: a pair's link runs at
# its own rate whatever the others do. gso_max_size follows the slowest class, as in `up`.
cmd_shape() {
  local name=$1 i=$2
  shift 2
  check_name "$name"
  peer_index "$name" "$i"
  [[ "$i" != hub ]] || die "shape a peer, not the hub"
  local n x y ns="$name-$i" j rate bits burst limit gso min_gso=65536
  n=$(<"$STATE_ROOT/$name/peers")
  (($# == n)) || die "shape $name $i: expected $n rates (one per peer), got $#"
  read -r x y < <(subnet_of "$name")
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$ns" qdisc add dev eth0 root handle 1: htb default 0
  for ((j = 0; j < n; j++)); do
    rate=$1
    shift
    [[ $j != "$i" && "$rate" != - && "${rate,,}" != unlimited ]] || continue
    bits=$(rate_bits "$rate")
    ((bits > 0)) || die "rate must be positive, got '$rate'"
    read -r burst limit gso < <(shaping_params "$bits")
    ((gso < min_gso)) && min_gso=$gso
    local cls
    cls=$(printf '%x' $((16 + j)))
    tc -n "$ns" class add dev eth0 parent 1: classid "1:$cls" htb rate "${bits}bit" \
      ceil "${bits}bit" burst "$burst" cburst "$burst" quantum "$MTU_FRAME"
    tc -n "$ns" qdisc add dev eth0 parent "1:$cls" handle "$cls:" bfifo limit "$limit"
    tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 \
      match ip dst "10.$x.$y.$((j + 1))/32" flowid "1:$cls"
  done
  ip -n "$ns" link set dev eth0 gso_max_size "$min_gso"
  echo "shaped" >"$STATE_ROOT/$name/rate"
}

# Shapes peer $2's link in lab $1 both ways at $3 bits/s: a tbf on its eth0 (upload) and on the
# hub's p<i> (download), with shaping_params' burst, limit and GSO.
tbf_link() {
  local name=$1 i=$2 bits=$3 burst limit gso
  read -r burst limit gso < <(shaping_params "$bits")
  ip -n "$name-$i" link set dev eth0 gso_max_size "$gso"
  ip -n "$name-hub" link set dev "p$i" gso_max_size "$gso"
  tc -n "$name-$i" qdisc replace dev eth0 root tbf rate "${bits}bit" burst "$burst" limit "$limit"
  tc -n "$name-hub" qdisc replace dev "p$i" root tbf rate "${bits}bit" burst "$burst" limit "$limit"
}

# rate: the tbf pair `up` gives every link, on peer $2's link alone, or no qdisc for `unlimited`.
cmd_rate() {
  local name=$1 i=$2 rate=$3
  check_name "$name"
  peer_index "$name" "$i"
  [[ "$i" != hub ]] || die "rate: a peer, not the hub"
  local ns="$name-$i" hub="$name-hub" bits
  if [[ "${rate,,}" == unlimited ]]; then
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    tc -n "$hub" qdisc del dev "p$i" root 2>/dev/null || true
    ip -n "$ns" link set dev eth0 gso_max_size 65536
    ip -n "$hub" link set dev "p$i" gso_max_size 65536
    echo "reshaped" >"$STATE_ROOT/$name/rate"
    return 0
  fi
  bits=$(rate_bits "$rate")
  ((bits > 0)) || die "rate must be positive, got '$rate'"
  tbf_link "$name" "$i" "$bits"
  echo "reshaped" >"$STATE_ROOT/$name/rate"
}

peer_index() {
  local name=$1 i=$2 n
  [[ -r "$STATE_ROOT/$name/peers" ]] || die "no lab '$name'"
  [[ "$i" == hub ]] && return 0
  n=$(<"$STATE_ROOT/$name/peers")
  if ! [[ "$i" =~ ^[0-9]+$ ]] || ((i >= n)); then
    die "lab '$name' has peers 0..$((n - 1)), not '$i'"
  fi
}

# cut/mend: a blackhole route in each of the two namespaces to the other's address. Routes
# rather than firewall rules, because iproute2 is all a lab needs.
cmd_link() {
  local action=$1 name=$2 i=$3 j=$4 ip_i ip_j
  check_name "$name"
  peer_index "$name" "$i"
  peer_index "$name" "$j"
  [[ "$i" != hub && "$j" != hub && "$i" != "$j" ]] || die "$action: two different peers, not the hub"
  ip_i=$(cmd_ip "$name" "$i")
  ip_j=$(cmd_ip "$name" "$j")
  if [[ "$action" == cut ]]; then
    ip -n "$name-$i" route replace blackhole "$ip_j/32"
    ip -n "$name-$j" route replace blackhole "$ip_i/32"
  else
    ip -n "$name-$i" route del blackhole "$ip_j/32" 2>/dev/null || true
    ip -n "$name-$j" route del blackhole "$ip_i/32" 2>/dev/null || true
  fi
}

cmd_ip() {
  local name=$1 i=$2 x y
  check_name "$name"
  peer_index "$name" "$i"
  [[ "$i" != hub ]] || die "the hub has no address"
  read -r x y < <(subnet_of "$name")
  echo "10.$x.$y.$((i + 1))"
}

cmd_gc() {
  local dir name
  [[ -d "$STATE_ROOT" ]] || return 0
  for dir in "$STATE_ROOT"/*/; do
    [[ -d "$dir" ]] || continue
    name=$(basename "$dir")
    if ! owner_alive "$dir/pid"; then
      echo "netlab: removing stale lab '$name'" >&2
      cmd_down "$name"
    fi
  done
  # Half-created state directories of dead `up` runs (older than a minute).
  find "$STATE_ROOT" -maxdepth 1 -name '.*.*' -type d -mmin +1 -exec rm -rf {} + 2>/dev/null ||
    true
}

cmd_list() {
  local dir name pid start
  [[ -d "$STATE_ROOT" ]] || return 0
  for dir in "$STATE_ROOT"/*/; do
    [[ -d "$dir" ]] || continue
    name=$(basename "$dir")
    read -r pid start <"$dir/pid" || true
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$(cat "$dir/peers" 2>/dev/null)" \
      "$(cat "$dir/rate" 2>/dev/null)" "${pid:-?}" \
      "$(owner_alive "$dir/pid" && echo alive || echo dead)"
  done
}

cmd_check() {
  [[ $(id -u) == 0 ]] || die "needs root (network namespaces, veth, tc)"
  command -v ip >/dev/null || die "'ip' (iproute2) not found"
  command -v tc >/dev/null || die "'tc' (iproute2) not found"
  PROBE_NS="nlchk$$"
  trap 'ip netns del "$PROBE_NS" 2>/dev/null || true' EXIT
  ip netns add "$PROBE_NS" 2>/dev/null || die "cannot create a network namespace (ip netns add)"
  ip -n "$PROBE_NS" link add name ve0 type veth peer name ve1 2>/dev/null || die "cannot create a veth pair"
  ip -n "$PROBE_NS" link add name br0 type bridge 2>/dev/null || die "cannot create a bridge"
  tc -n "$PROBE_NS" qdisc add dev ve0 root tbf rate 10mbit burst 6056 limit 48448 2>/dev/null ||
    die "cannot add a tbf qdisc (sch_tbf missing?)"
  echo ok
}

cmd_bench() {
  local name=$1 from=$2 to=$3 secs=${4:-3} dst
  dst=$(cmd_ip "$name" "$to")
  cmd_ip "$name" "$from" >/dev/null
  [[ -x /usr/bin/python3 ]] || die "bench needs /usr/bin/python3"
  local server='
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5599)); s.listen(1); s.settimeout(10)
c, _ = s.accept(); c.settimeout(10)
buf = bytearray(1 << 20); n = 0; t0 = None
while True:
    k = c.recv_into(buf)
    if not k: break
    if t0 is None: t0 = time.monotonic()
    n += k
t1 = time.monotonic()
print("%.2f Mbit/s" % (n * 8 / (t1 - t0) / 1e6 if t0 and t1 > t0 else 0))'
  local client='
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection((sys.argv[1], 5599), timeout=10); break
    except OSError: time.sleep(0.05)
buf = b"\0" * (1 << 18); end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end: s.sendall(buf)
s.close()'
  timeout $((secs + 30)) ip netns exec "$name-$to" /usr/bin/python3 -c "$server" "$dst" &
  local spid=$!
  timeout $((secs + 30)) ip netns exec "$name-$from" /usr/bin/python3 -c "$client" "$dst" "$secs"
  wait "$spid"
}

[[ $# -ge 1 ]] || usage
cmd=$1
shift
case "$cmd" in
  up) [[ $# -eq 3 ]] || usage && cmd_up "$@" ;;
  down) [[ $# -eq 1 ]] || usage && cmd_down "$1" ;;
  cut | mend) [[ $# -eq 3 ]] || usage && cmd_link "$cmd" "$@" ;;
  shape) [[ $# -ge 3 ]] || usage && cmd_shape "$@" ;;
  rate) [[ $# -eq 3 ]] || usage && cmd_rate "$@" ;;
  unbridge) [[ $# -eq 1 ]] || usage && cmd_unbridge "$1" ;;
  exec)
    [[ $# -ge 3 ]] || usage
    check_name "$1"
    peer_index "$1" "$2"
    ns="$1-$2"
    shift 2
    exec ip netns exec "$ns" "$@"
    ;;
  ip) [[ $# -eq 2 ]] || usage && cmd_ip "$1" "$2" ;;
  ns)
    [[ $# -eq 2 ]] || usage
    check_name "$1"
    peer_index "$1" "$2"
    echo "$1-$2"
    ;;
  gc) [[ $# -eq 0 ]] || usage && cmd_gc ;;
  list) [[ $# -eq 0 ]] || usage && cmd_list ;;
  check) [[ $# -eq 0 ]] || usage && cmd_check ;;
  bench) [[ $# -ge 3 && $# -le 4 ]] || usage && cmd_bench "$@" ;;
  -h | --help | help) usage ;;
  *) usage ;;
esac
