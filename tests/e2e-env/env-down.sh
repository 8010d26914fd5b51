#!/bin/bash
# env-down.sh - tear down what env-up.sh (and tests registered via lib.sh e2e_track/e2e_start) started.
#   1. stops every process tracked in ${E2E_HOME}/run/env/pids (newest first), only if the PID still runs
#      the recorded binary with the recorded start time
#   2. cluster-down.sh member --wipe ; cluster-down.sh host --wipe
#   3. unmounts everything under ${E2E_HOME}/run/env (deepest first), detaches loop devices backed by files
#      under ${E2E_HOME}/run/env/state, removes state/, sock/, pids/* and env.sh
# Keeps: manifests/ (last generated), logs/ (overwritten by the next env-up).
# Safe to run repeatedly / on a half-started environment. Exit 1 if something could not be cleaned.
set -uo pipefail
trap "" PIPE   # keep cleaning even if our stdout goes away (e.g. piped into head)
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
H=${E2E_HOME:?set E2E_HOME} E=${E2E_HOME}/run/env
source "$HERE/lib.sh"
T0=$(date +%s.%N)
rc=0
el() { awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{printf "%.1f", a-b}'; }

# ---------- 1. tracked processes, newest first ----------
names=()
for f in "$E2E_PIDS_DIR"/*.pid; do
  [[ -e $f ]] || continue
  n=$(basename "$f" .pid)
  st=$(cat "$E2E_PIDS_DIR/$n.start" 2>/dev/null || echo 0)
  names+=("$st $n")
done
# everything tracked is stopped together (TERM to all, then wait); the order (newest first) only affects
# who gets the signal first: the driver under test / sidecars before hostpathplugin
if ((${#names[@]})); then
  mapfile -t ordered < <(printf '%s\n' "${names[@]}" | sort -rn | cut -d' ' -f2)
  e2e_stop "${ordered[@]}"
  echo "[$(el)s] tracked processes stopped"
fi
rm -f "$E2E_PIDS_DIR"/*.exe "$E2E_PIDS_DIR"/*.start
mkdir -p "$E2E_LOG_DIR"; rm -f "$E2E_LOG_DIR"/cluster-down-*.log

# ---------- 2. clusters ----------
# (in parallel: kube-apiserver's graceful shutdown takes several seconds each)
cpids=()
for c in member host; do
  if [[ -d $H/run/$c/pids ]]; then "$HERE/cluster-down.sh" $c --wipe >"$E2E_LOG_DIR/cluster-down-$c.log" 2>&1 & cpids+=($!); fi
done
for p in "${cpids[@]}"; do wait "$p" || rc=1; done
for c in member host; do [[ -f $E2E_LOG_DIR/cluster-down-$c.log ]] && sed "s/^/[$c] /" "$E2E_LOG_DIR/cluster-down-$c.log"; done
echo "[$(el)s] clusters down"

# ---------- 3. mounts, loop devices, state ----------
for attempt in 1 2 3; do
  mapfile -t mnts < <(e2e_mounts_under $E)
  ((${#mnts[@]})) || break
  for m in "${mnts[@]}"; do
    if umount "$m" 2>/dev/null; then echo "unmounted $m"
    elif ((attempt == 3)) && umount -l "$m"; then echo "lazily unmounted $m"
    fi
  done
done
for l in $(e2e_loops_under $E/state); do
  losetup -d "$l" && echo "detached loop device $l"
done
left_m=$(e2e_mounts_under $E); left_l=$(e2e_loops_under $E/state)
if [[ -n $left_m || -n $left_l ]]; then
  echo "env-down: could NOT clean: mounts=[$left_m] loops=[$left_l]; state left in place" >&2; rc=1
else
  rm -rf $E/state $E/sock
fi
rm -f $E/env.sh; rm -rf $H/run/member-relay.kubeconfig $H/run/member-relay-node.kubeconfig $H/run/member-relay.kubeconfig.kustomize

# ---------- 4. verify ----------
for f in "$E2E_PIDS_DIR"/*.pid $H/run/host/pids/*.pid $H/run/member/pids/*.pid; do
  [[ -e $f ]] && { echo "env-down: pid file still present: $f (pid $(cat "$f"))" >&2; rc=1; }
done
echo "env-down done in $(el)s (rc=$rc)"
exit $rc
