#!/usr/bin/env bash
# glusterfs-up.sh DIR VOLUME MOUNT_DIR...: one GlusterFS volume on loopback,
# fully userspace (Debian glusterfs-server, glusterfs-client), and a FUSE
# client of its own for each MOUNT_DIR:
#   - glusterd with all its state under DIR (DIR/glusterd.vol, working dir
#     DIR/work, run dir DIR/run, logs DIR/logs, CLI socket
#     DIR/run/glusterd.socket), bound to 127.0.0.1. Its management port is
#     24007, gluster's own: glusterd starts its bricks with no port option,
#     and a brick always asks 127.0.0.1:24007 for its volfile;
#   - the volume VOLUME, one brick DIR/brick on host 127.1 (the gluster CLI
#     refuses 127.0.0.1 and localhost; `force`: the brick is on the root
#     filesystem), started; glusterd starts the brick detached, on a port of
#     GLUSTER_BASE_PORT..GLUSTER_MAX_PORT [19491..19499];
#   - for each MOUNT_DIR a separate `glusterfs -N` client process (foreground,
#     its own FUSE connection), waited for until findmnt shows MOUNT_DIR as
#     fuse.glusterfs.
# Processes recorded in DIR/pids (kubelet/kl-lib.sh: by PID, binary and start
# time), the brick's PID read from the pidfile glusterd writes under DIR/run.
# gluster still writes a few files under /var/lib/glusterd and /var/run/gluster
# whatever its volfile says: what was there before is listed in
# DIR/state/var-before, and glusterfs-down.sh removes only what was not.
# Refuses to start when anything of a previous run is there (processes,
# mounts, state, the ports). Undo with glusterfs-down.sh DIR (run on any
# failure here too).
# Knobs: GLUSTER_BASE_PORT [19491], GLUSTER_MAX_PORT [19499],
#   GLUSTER_CLIENT_OPTS [--entry-timeout=0 --attribute-timeout=0
#   --negative-timeout=0: a client sees what another one changed at once,
#   not after the kernel's 1 s caches].
set -Eeuo pipefail
DIR=${1:?usage: glusterfs-up.sh DIR VOLUME MOUNT_DIR...}
VOL=${2:?usage: glusterfs-up.sh DIR VOLUME MOUNT_DIR...}
shift 2
(($# >= 1)) || { echo "usage: glusterfs-up.sh DIR VOLUME MOUNT_DIR..." >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/../env-lib.sh"
[[ $VOL =~ ^[A-Za-z0-9_-]{1,64}$ ]] || { echo "bad VOLUME '$VOL'" >&2; exit 2; }
for c in glusterd gluster glusterfs findmnt ss; do
  command -v $c > /dev/null || { echo "need $c (apt-get install -y --no-install-recommends glusterfs-server glusterfs-client)" >&2; exit 2; }
done
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
MOUNTS=()
for m in "$@"; do mkdir -p "$m"; MOUNTS+=("$(cd "$m" && pwd)"); done
BASE_PORT=${GLUSTER_BASE_PORT:-19491} MAX_PORT=${GLUSTER_MAX_PORT:-19499}
MGMT_PORT=24007
read -r -a CLIENT_OPTS <<< "${GLUSTER_CLIENT_OPTS:---entry-timeout=0 --attribute-timeout=0 --negative-timeout=0}"
# shellcheck disable=SC2034 # kl-lib.sh's processes live in $LAB/pids
LAB=$DIR
source "$HERE/kubelet/kl-lib.sh"
VAR_DIRS=(/var/lib/glusterd /var/run/gluster /var/log/glusterfs)

# ---- refuse if (partly) up
busy=()
for f in "$DIR"/pids/*.pid; do
  [[ -e $f ]] || continue; n=$(basename "$f" .pid)
  kl_alive "$n" && busy+=("process $n (pid $(cat "$f"))")
done
[[ -e $DIR/state ]] && busy+=("$DIR/state (a previous run's record)")
[[ -e $DIR/work/vols ]] && busy+=("$DIR/work/vols (a previous run's volumes)")
[[ -S $DIR/run/glusterd.socket ]] && busy+=("socket $DIR/run/glusterd.socket")
for p in $MGMT_PORT $(seq "$BASE_PORT" "$MAX_PORT"); do
  ss -Hltn "sport = :$p" | grep -q . && busy+=("tcp port $p in use")
done
for m in "$DIR" "${MOUNTS[@]}"; do
  l=$(kl_mounts_under "$m"); [[ -n $l ]] && busy+=("mounts at/under $m: ${l//$'\n'/ }")
done
if ((${#busy[@]})); then
  echo "glusterfs-up: a previous run (or part of it) is there; run $HERE/glusterfs-down.sh $DIR first:" >&2
  printf '  - %s\n' "${busy[@]}" >&2
  exit 1
fi
rm -rf "$DIR"/{pids,work,run,brick} "$DIR/glusterd.vol"
mkdir -p "$DIR"/{pids,logs,work,run,brick} "$DIR/state.new"
# What is under /var before glusterd first runs; written whole before it is
# trusted (down removes only paths missing from it, and nothing without it).
find "${VAR_DIRS[@]}" 2>/dev/null | LC_ALL=C sort > "$DIR/state.new/var-before"
for m in "${MOUNTS[@]}"; do echo "$m"; done > "$DIR/state.new/mounts"
mv "$DIR/state.new" "$DIR/state"

# shellcheck disable=SC2154 # rc is the trap's own
trap 'rc=$?; echo "glusterfs-up failed (rc=$rc) at line $LINENO; see $DIR/logs" >&2; "$HERE/glusterfs-down.sh" "$DIR" >&2 || true; exit $rc' ERR

# ---- glusterd
cat > "$DIR/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $DIR/work
    option run-directory $DIR/run
    option logging-directory $DIR/logs
    option glusterd-sockfile $DIR/run/glusterd.socket
    option transport-type socket
    option transport.socket.bind-address 127.0.0.1
    option transport.socket.listen-port $MGMT_PORT
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option base-port $BASE_PORT
    option max-port $MAX_PORT
end-volume
EOF
gl() { gluster --glusterd-sock="$DIR/run/glusterd.socket" --log-file="$DIR/logs/cli.log" --mode=script "$@"; }
kl_start glusterd "$DIR/logs/glusterd.out" "$(command -v glusterd)" -N -f "$DIR/glusterd.vol" \
  -p "$DIR/run/glusterd.pid" -l "$DIR/logs/glusterd.log" ||
  { echo "glusterd exited at once; see $DIR/logs/glusterd.{out,log}" >&2; tail -3 "$DIR/logs/glusterd.out" >&2; false; }
waitfor 30 "glusterd on $DIR/run/glusterd.socket" gl volume list
ts "glusterd up (pid $(cat "$DIR/pids/glusterd.pid")), 127.0.0.1:$MGMT_PORT, state in $DIR"

# ---- the volume
gl volume create "$VOL" "127.1:$DIR/brick" force > "$DIR/logs/volume-create.log" 2>&1 ||
  { cat "$DIR/logs/volume-create.log" >&2; false; }
gl volume start "$VOL" > "$DIR/logs/volume-start.log" 2>&1 || { cat "$DIR/logs/volume-start.log" >&2; false; }
brick_pid() { # the brick's PID from glusterd's pidfile, if it runs glusterfsd for our brick
  local f p
  for f in "$DIR/run/vols/$VOL"/*.pid; do
    [[ -s $f ]] || continue; p=$(cat "$f")
    [[ $p =~ ^[0-9]+$ && "$(readlink -f /proc/"$p"/exe 2>/dev/null)" == */glusterfsd ]] || continue
    tr '\0' '\n' < /proc/"$p"/cmdline 2>/dev/null | grep -qxF "$f" && { echo "$p"; return 0; }
  done
  return 1
}
waitfor 30 "the brick's pidfile under $DIR/run/vols/$VOL" brick_pid
kl_track brick "$(brick_pid)"
online() { gl volume status "$VOL" "127.1:$DIR/brick" --xml 2>/dev/null | grep -q '<status>1</status>'; }
waitfor 30 "brick 127.1:$DIR/brick online" online
port=$(gl volume status "$VOL" "127.1:$DIR/brick" --xml 2>/dev/null | sed -n 's:.*<port>\([0-9]*\)</port>.*:\1:p' | head -1)
ts "volume $VOL started: brick 127.1:$DIR/brick (pid $(cat "$DIR/pids/brick.pid"), port ${port:-?})"

# ---- a client per mount
mounted() { [[ "$(findmnt -n -o FSTYPE --mountpoint "$1")" == fuse.glusterfs ]] && stat -f "$1"; }
i=0
for m in "${MOUNTS[@]}"; do
  i=$((i + 1))
  kl_start "client-$i" "$DIR/logs/client-$i.out" "$(command -v glusterfs)" -N --volfile-server=127.0.0.1 \
    --volfile-id="$VOL" -l "$DIR/logs/client-$i.log" "${CLIENT_OPTS[@]}" "$m" ||
    { echo "client-$i exited at once; see $DIR/logs/client-$i.out" >&2; tail -3 "$DIR/logs/client-$i.out" >&2; false; }
  for ((t = 0; t < 150; t++)); do
    mounted "$m" > /dev/null 2>&1 && break
    kl_alive "client-$i" || { echo "client-$i exited; see $DIR/logs/client-$i{.out,.log}" >&2; tail -3 "$DIR/logs/client-$i.out" >&2; false; }
    sleep 0.2
  done
  mounted "$m" > /dev/null 2>&1 || { echo "client-$i: $m not mounted (fuse.glusterfs) after 30s" >&2; false; }
  ts "client-$i (pid $(cat "$DIR/pids/client-$i.pid")): $VOL on $m"
done
trap - ERR
ts "glusterfs up: volume $VOL, ${#MOUNTS[@]} client mount(s)"
