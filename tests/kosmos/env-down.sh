#!/usr/bin/env bash
# env-down.sh RUN_DIR: undoes tests/kosmos/env-up.sh (also a partial one):
# Kosmos first (so it mirrors nothing more), then the member kubelet node
# (drained, so the CSI calls unwind), member2, the fake node's taint. Every
# process by its recorded PID. The two-cluster environment stays up.
set -uo pipefail
RUN=${1:?usage: env-down.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
[[ -d $RUN ]] || exit 0
rc=0
"$HERE/demo-down.sh" "$RUN" || rc=1
stop_all() { # stop_all LAB: every process recorded in LAB/pids, newest first
  local lab=$1 f
  for f in $(ls -t "$lab"/pids/*.pid 2>/dev/null); do
    ( LAB=$lab; source "$KL/kl-lib.sh"; kl_stop "$(basename "$f" .pid)" 15 ) || rc=1
  done
}
if kh get --raw /readyz > /dev/null 2>&1; then
  # While cluster-manager runs, it removes its finalizer from a deleted
  # Cluster (and the Cluster's virtual node); a Cluster left behind would
  # block the next env-up's.
  kh delete clusters.kosmos.io member1 member2 --ignore-not-found --timeout=30s > /dev/null 2>&1
  for c in member1 member2; do
    kh patch clusters.kosmos.io $c --type=merge -p '{"metadata":{"finalizers":null}}' > /dev/null 2>&1 || true
  done
  kh delete node kosmos-member1 kosmos-member2 --ignore-not-found > /dev/null 2>&1
fi
stop_all "$RUN/hostlab"
if [[ -d $RUN/lab ]]; then
  "$KL/kubelet-node-down.sh" "$RUN/lab" "$MEMBER_KUBECONFIG" $KL_NODE > "$RUN/logs/kubelet-node-down.log" 2>&1 || rc=1
fi
km taint node member-node-1 "${FAKE_TAINT%%=*}-" > /dev/null 2>&1 || true
km delete storageclass $KL_CLASS $KL_CLASS-wffc --ignore-not-found > /dev/null 2>&1 || true
SPARE_MEMBER=member2 "$E2E_ENV/spare-member-down.sh" "$RUN" || rc=1
# The members' pod network, once no kubelet puts pods on it.
if [[ -s $RUN/podnet ]]; then
  ip netns del "$(cat "$RUN/podnet")" 2>/dev/null || true
  rm -f "$RUN/podnet"
fi
left=$(awk '{print $5}' /proc/self/mountinfo | grep -F "$RUN" || true)
[[ -z $left ]] || { echo "mounts left under $RUN: $left" >&2; rc=1; }
exit $rc
