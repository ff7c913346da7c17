#!/usr/bin/env bash
# A real distributed file system on one machine, for tests and benchmarks:
# MooseFS (Debian's moosefs-master, -chunkserver, -client) with its master and
# one chunk server in a network namespace of their own, and the FUSE client
# mounted in the host's namespace over a veth pair, as on a cluster where the
# storage servers are other hosts. (The chunk server refuses a master on a
# loopback address, so they cannot simply share 127.0.0.1.)
#
#   scripts/moosefs.sh start [--cache-mode MODE] [--read-bps N] [--read-iops N]
#   scripts/moosefs.sh stop        unmount, stop both servers, drop the namespace
#   scripts/moosefs.sh status      prints the mount point; exit 0 when mounted
#   scripts/moosefs.sh drop-cache  evict the dataset from every cache between
#                                  a reader and the chunk server's disk
#   scripts/moosefs.sh bytes       bytes the chunk server sent the client so far
#   scripts/moosefs.sh stats       the client's counters since the last reset,
#                                  as JSON in the PFS emulator's shape:
#                                  {"counters": {"bytes_read", "reads", "opens",
#                                  "metadata_ops"}} (bytes: the veth pair's;
#                                  the rest: mfsmount's .stats)
#   scripts/moosefs.sh reset       zero what stats reports
#   (stats, reset and stop take and ignore a mount point argument, so that a
#   benchmark can call this script where it calls tools/pfs_emulator's.)
#
# start is idempotent: what runs is kept, a mount with other options is
# mounted again, and the throttle is set to what this call asks (none by
# default). It prints the mount point on its last line.
#   --cache-mode   the client's mfscachemode (AUTO, the default, lets the
#                  kernel keep file pages; DIRECT bypasses every cache and
#                  models a dataset larger than the client's memory)
#   --read-bps/--read-iops  a busy PFS: the chunk server's reads from its disk
#                  throttled by the cgroup v1 blkio controller
#                  (blkio.throttle.read_bps_device / read_iops_device)
#
# The state lives in MONARCH_MOOSEFS_DIR (default /var/tmp/monarch-moosefs):
# metadata, chunks, logs and the mount point <dir>/mnt, so data written there
# survives stop/start. Needs root, /dev/fuse, network namespaces; exits 77
# (a skip for ctest) with the reason when this machine cannot run it.
set -euo pipefail

dir="${MONARCH_MOOSEFS_DIR:-/var/tmp/monarch-moosefs}"
ns=monarch-mfs
host_if=mfs-host
ns_if=mfs-ns
host_ip=10.78.0.1
ns_ip=10.78.0.2
mnt="$dir/mnt"
cgroup=/sys/fs/cgroup/blkio/monarch-moosefs

die() { echo "moosefs: $*" >&2; exit 1; }
cannot() { echo "moosefs: cannot run here: $*" >&2; exit 77; }

install_packages() {
  local want=()
  for p in moosefs-master moosefs-chunkserver moosefs-client moosefs-cli fuse3 iproute2; do
      [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || want+=("$p")
  done
  if [ ${#want[@]} -gt 0 ]; then
    echo "moosefs: installing ${want[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${want[@]}" >/dev/null
  fi
}

mounted() { [[ "$(cat /proc/mounts)" == *" $mnt fuse"* ]]; }
in_ns() { ip netns exec "$ns" "$@"; }
ns_exists() { [ -e "/run/netns/$ns" ]; }
# The pid a MooseFS daemon wrote to its lock file, if that process lives.
daemon_pid() {
  local lock="$dir/$1/.$2.lock" pid
  [ -s "$lock" ] || return 1
  pid=$(tr -dc 0-9 <"$lock")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

write_configs() {
  mkdir -p "$dir/master" "$dir/chunks" "$dir/chunkserver" "$dir/etc" "$mnt"
  # A fresh master needs an empty metadata file to start from.
  [ -e "$dir/master/metadata.mfs" ] || [ -e "$dir/master/metadata.mfs.back" ] ||
    echo -n "MFSM NEW" >"$dir/master/metadata.mfs"
  chown -R mfs:mfs "$dir/master" "$dir/chunks" "$dir/chunkserver"
  cat >"$dir/etc/mfsmaster.cfg" <<EOF
WORKING_USER = mfs
WORKING_GROUP = mfs
DATA_PATH = $dir/master
EXPORTS_FILENAME = $dir/etc/mfsexports.cfg
TOPOLOGY_FILENAME = $dir/etc/mfstopology.cfg
MATOCS_LISTEN_HOST = $ns_ip
MATOCL_LISTEN_HOST = $ns_ip
MATOML_LISTEN_HOST = $ns_ip
NICE_LEVEL = 0
EOF
  # One chunk server holds one copy of every chunk (goal 1, set at start).
  echo "*  /  rw,alldirs,admin,maproot=0:0" >"$dir/etc/mfsexports.cfg"
  : >"$dir/etc/mfstopology.cfg"
  cat >"$dir/etc/mfschunkserver.cfg" <<EOF
WORKING_USER = mfs
WORKING_GROUP = mfs
DATA_PATH = $dir/chunkserver
HDD_CONF_FILENAME = $dir/etc/mfshdd.cfg
MASTER_HOST = $ns_ip
BIND_HOST = $ns_ip
CSSERV_LISTEN_HOST = $ns_ip
HDD_LEAVE_SPACE_DEFAULT = 1GiB
NICE_LEVEL = 0
EOF
  echo "$dir/chunks" >"$dir/etc/mfshdd.cfg"
}

start_network() {
  ns_exists || ip netns add "$ns"
  if ! ip link show "$host_if" >/dev/null 2>&1; then
    ip link add "$host_if" type veth peer name "$ns_if"
    ip link set "$ns_if" netns "$ns"
  fi
  # (Captured first: grep -q closing the pipe early would fail it under pipefail.)
  local addrs
  addrs=$(ip addr show dev "$host_if")
  [[ "$addrs" == *"$host_ip/"* ]] || ip addr add "$host_ip/30" dev "$host_if"
  ip link set "$host_if" up
  addrs=$(in_ns ip addr show dev "$ns_if")
  [[ "$addrs" == *"$ns_ip/"* ]] || in_ns ip addr add "$ns_ip/30" dev "$ns_if"
  in_ns ip link set "$ns_if" up
  in_ns ip link set lo up
}

# Waits until `check` succeeds, for at most `seconds`.
wait_for() {
  local seconds=$1 what=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what not ready after ${seconds}s (logs: $dir/*.log)"
    sleep 0.2
  done
}

chunkserver_registered() {
  [[ "$(mfscli -H "$ns_ip" -SCS 2>/dev/null)" == *"$ns_ip"* ]]
}

start_servers() {
  if ! daemon_pid master mfsmaster >/dev/null; then
    in_ns mfsmaster -c "$dir/etc/mfsmaster.cfg" -a start >>"$dir/master.log" 2>&1 ||
      die "mfsmaster did not start (log: $dir/master.log)"
  fi
  if ! daemon_pid chunkserver mfschunkserver >/dev/null; then
    in_ns mfschunkserver -c "$dir/etc/mfschunkserver.cfg" start >>"$dir/chunkserver.log" 2>&1 ||
      die "mfschunkserver did not start (log: $dir/chunkserver.log)"
  fi
  wait_for 60 "the chunk server's registration" chunkserver_registered
}

# A client that died (killed with its session) leaves its mount behind,
# answering ENOTCONN to everything: let it go.
drop_dead_mount() {
  if mounted && ! stat -t "$mnt" >/dev/null 2>&1; then
    umount -l "$mnt" || die "cannot unmount the dead mount at $mnt"
  fi
}

mount_client() {
  local opts="mfsmaster=$ns_ip,mfscachemode=$cache_mode"
  if mounted; then
    [ "$(cat "$dir/mount.opts" 2>/dev/null)" = "$opts" ] && return 0
    umount "$mnt" || die "$mnt is busy: another mount mode was asked for while it is in use"
  fi
  mfsmount "$mnt" -o "$opts" >>"$dir/client.log" 2>&1 || die "mfsmount failed (log: $dir/client.log)"
  echo "$opts" >"$dir/mount.opts"
  wait_for 30 "the mount" mountpoint -q "$mnt"
  # mfsmount's counters start again with a mount; the veth pair's do not.
  counters_now >"$dir/baseline.json"
  # One copy of each chunk (there is one chunk server); new files inherit it.
  mfssetgoal 1 "$mnt" >/dev/null
  # Deleted files free their chunks at once (the default keeps them a day in
  # the trash, and re-made benchmark data then fills the disk); inherited too.
  mfssettrashtime 0 "$mnt" >/dev/null
  # Files land with the writer's umask; keep the tree world-readable so that
  # a test's second user reads what it is allowed to.
  chmod 755 "$mnt"
}

# The block device that holds the chunks, as MAJ:MIN for blkio.
chunk_device() {
  local dev
  dev=$(stat -c '%d' "$dir/chunks")
  echo "$((dev >> 8)):$((dev & 255))"
}

set_throttle() {
  local pid device
  if [ "$read_bps" = 0 ] && [ "$read_iops" = 0 ] && [ ! -d "$cgroup" ]; then
    return 0
  fi
  [ -d /sys/fs/cgroup/blkio ] || die "--read-bps/--read-iops need the cgroup v1 blkio controller"
  mkdir -p "$cgroup"
  device=$(chunk_device)
  # 0 removes a limit. The block layer may refuse a partition, so the
  # whole-disk number is tried when the partition's is refused.
  echo "$device $read_bps" >"$cgroup/blkio.throttle.read_bps_device"
  echo "$device $read_iops" >"$cgroup/blkio.throttle.read_iops_device"
  pid=$(daemon_pid chunkserver mfschunkserver) || die "no chunk server to throttle"
  for task in /proc/"$pid"/task/*; do
    echo "${task##*/}" >"$cgroup/tasks"
  done
}

# Evicts the chunk files from the page cache (so the throttle and the disk
# are met again) and the dataset's pages from the client's kernel cache.
drop_cache() {
  python3 - "$dir/chunks" "$mnt" <<'PY'
import os, sys
for root in sys.argv[1:]:
    for base, _, names in os.walk(root):
        for name in names:
            try:
                fd = os.open(os.path.join(base, name), os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
PY
}

# Bytes that crossed the veth pair towards the client: every chunk read the
# client made, plus protocol headers.
bytes_sent() {
  cat "/sys/class/net/$host_if/statistics/rx_bytes"
}

# The client's counters now: the veth pair's bytes, and mfsmount's own
# operation counts (its hidden .stats file), as one JSON object.
counters_now() {
  python3 - "$mnt/.stats" "$(bytes_sent)" <<'PY'
import json, sys
ops = {}
with open(sys.argv[1]) as f:
    for line in f:
        key, _, value = line.partition(":")
        value = value.strip()
        if value.isdigit():
            ops[key.strip()] = int(value)
meta = ("lookup", "getattr", "access", "statfs", "open", "opendir", "readdir", "readdirplus",
        "readlink", "getxattr", "listxattr")
print(json.dumps({"bytes_read": int(sys.argv[2]), "reads": ops.get("fuse_ops.read", 0),
                  "opens": ops.get("fuse_ops.open", 0),
                  "metadata_ops": sum(ops.get("fuse_ops." + k, 0) for k in meta)}))
PY
}

stats() {
  local now
  now=$(counters_now)
  python3 - "$now" "$dir/baseline.json" <<'PY'
import json, sys
now = json.loads(sys.argv[1])
try:
    with open(sys.argv[2]) as f:
        base = json.load(f)
except (OSError, ValueError):
    base = {}
# Reading .stats is itself 1 open, 2 reads and 2 metadata operations; the
# difference holds exactly one such read (this one's), which is not the job's.
own = {"reads": 2, "opens": 1, "metadata_ops": 2}
print(json.dumps({"counters": {k: max(0, v - base.get(k, 0) - own.get(k, 0))
                               for k, v in now.items()}}))
PY
}

stop_all() {
  if mounted; then umount "$mnt" || umount -l "$mnt"; fi
  if ns_exists; then
    daemon_pid chunkserver mfschunkserver >/dev/null &&
      in_ns mfschunkserver -c "$dir/etc/mfschunkserver.cfg" stop >>"$dir/chunkserver.log" 2>&1 || true
    daemon_pid master mfsmaster >/dev/null &&
      in_ns mfsmaster -c "$dir/etc/mfsmaster.cfg" stop >>"$dir/master.log" 2>&1 || true
    ip netns del "$ns"
  fi
  ip link del "$host_if" 2>/dev/null || true
  [ -d "$cgroup" ] && rmdir "$cgroup" 2>/dev/null || true
  rm -f "$dir/mount.opts" "$dir/baseline.json"
}

command=${1:-}
shift || true
cache_mode=AUTO
read_bps=0
read_iops=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cache-mode) cache_mode=$2; shift 2 ;;
    --read-bps) read_bps=$2; shift 2 ;;
    --read-iops) read_iops=$2; shift 2 ;;
    -*) die "unknown option '$1' (see the top of $0)" ;;
    *) [ "$command" != start ] || die "start takes no mount point (it prints its own)"; shift ;;
  esac
done
case "$cache_mode" in AUTO|DIRECT|NO|YES) ;; *) die "--cache-mode: expected AUTO, DIRECT, NO or YES, got '$cache_mode'" ;; esac

case "$command" in
  start)
    [ "$(id -u)" = 0 ] || cannot "needs root (network namespaces, mount)"
    [ -c /dev/fuse ] || cannot "no /dev/fuse"
    install_packages
    ns_exists || { ip netns add monarch-mfs-probe 2>/dev/null && ip netns del monarch-mfs-probe; } ||
      cannot "network namespaces cannot be made"
    drop_dead_mount
    write_configs
    start_network
    start_servers
    mount_client
    set_throttle
    echo "$mnt"
    ;;
  stop) stop_all ;;
  status) mounted && echo "$mnt" ;;
  drop-cache) mounted || die "not mounted"; drop_cache ;;
  bytes) bytes_sent ;;
  stats) mounted || die "not mounted"; stats ;;
  reset) mounted || die "not mounted"; counters_now >"$dir/baseline.json.tmp" &&
           mv "$dir/baseline.json.tmp" "$dir/baseline.json" ;;
  *) die "usage: $0 start|stop|status|drop-cache|bytes|stats|reset (see the top of the script)" ;;
esac
