#!/usr/bin/env bash
# env-down.sh RUN_DIR: undoes tests/k8s-e2e/env-up.sh (also a partial one).
# While the CSI processes still run: the volumes' users go (snapshots, the
# kubelet node's pods, the claims of the relay's classes, then their PVs), so
# the driver unwinds its own mounts and loop devices; then the kubelet node
# (drained) with every process recorded under RUN_DIR/lab (csi-relay and the
# sidecars, snapshot-controller, kube-scheduler; by recorded PID), the objects
# env-up made, the fake node's taint; last anything still mounted or attached
# to a loop device under RUN_DIR, and the relay's state. The two-cluster
# environment stays up. Exit status 1 if something was left behind.
set -uo pipefail
RUN=${1:?usage: env-down.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
[[ -d $RUN ]] || exit 0
RUN=$(cd "$RUN" && pwd); LAB=$RUN/lab
mkdir -p "$RUN/logs"
source "$KL/kl-lib.sh"
rc=0
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
DRIVERS="$DRIVER $MEMBER_DRIVER"
if kh get --raw /readyz > /dev/null 2>&1 && kl_alive kubelet; then
  # Snapshots first (their contents are the driver's), then pods, claims, PVs.
  if kh get crd volumesnapshots.snapshot.storage.k8s.io > /dev/null 2>&1; then
    kh delete volumesnapshots -A --all --wait=false > /dev/null 2>&1
  fi
  kh delete pods -A --field-selector "spec.nodeName=$KL_NODE" --wait=false > /dev/null 2>&1
  for ((i = 0; i < 90; i++)); do
    [[ -z $(kh get pods -A --field-selector "spec.nodeName=$KL_NODE" -o name 2>/dev/null) ]] && break; sleep 1
  done
  classes=$(kh get storageclass -o json 2>/dev/null | jq -r --arg d "$DRIVERS" \
    '.items[] | select(.provisioner as $p | ($d | split(" ")) | index($p)) | .metadata.name')
  kh get pvc -A -o json 2>/dev/null | jq -r --arg c "$classes" \
    '.items[] | select(.spec.storageClassName as $s | ($c | split("\n")) | index($s)) | "\(.metadata.namespace) \(.metadata.name)"' |
    while read -r ns name; do kh -n "$ns" delete pvc "$name" --wait=false > /dev/null 2>&1; done
  ours() { kh get pv -o json 2>/dev/null | jq -r --arg d "$DRIVERS" \
    '.items[] | select(.spec.csi.driver as $x | ($d | split(" ")) | index($x)) | .metadata.name'; }
  for ((i = 0; i < 90; i++)); do [[ -z $(ours) ]] && break; sleep 1; done
  left=$(ours); [[ -z $left ]] || { log "PVs of the relay still there after 90 s: $left"; rc=1; }
  if kh get crd volumesnapshotcontents.snapshot.storage.k8s.io > /dev/null 2>&1; then
    for ((i = 0; i < 30; i++)); do
      [[ -z $(kh get volumesnapshotcontents -o name 2>/dev/null) ]] && break; sleep 1
    done
  fi
fi
if [[ -d $LAB ]]; then
  # drains the node (NodeUnpublish/Unstage, detach) and stops every process in $LAB/pids
  "$KL/kubelet-node-down.sh" "$LAB" "$HOST_KUBECONFIG" $KL_NODE > "$RUN/logs/kubelet-node-down.log" 2>&1 || rc=1
fi
# Part (b)'s member node after the host's: the relay's node plugin, drained
# with host-kl-1, unwinds its mounts through this node's hostpath.
if [[ -d $RUN/member-lab ]]; then
  if km get --raw /readyz > /dev/null 2>&1; then
    "$KL/kubelet-node-down.sh" "$RUN/member-lab" "$MEMBER_KUBECONFIG" $M_KL_NODE > "$RUN/logs/member-node-down.log" 2>&1 || rc=1
    km delete storageclass $M_KL_CLASS $M_KL_CLASS-wffc --ignore-not-found > /dev/null 2>&1
    km delete volumesnapshotclass $M_KL_SNAPCLASS --ignore-not-found > /dev/null 2>&1
    km delete volumegroupsnapshotclass $M_KL_GROUPCLASS --ignore-not-found > /dev/null 2>&1
    km delete csidriver $M_KL_DRIVER --ignore-not-found > /dev/null 2>&1
    km taint node "$MEMBER_NODE" "${FAKE_TAINT%%=*}-" > /dev/null 2>&1 || true
  else
    "$KL/kubelet-node-down.sh" "$RUN/member-lab" > "$RUN/logs/member-node-down.log" 2>&1 || rc=1
  fi
fi
if kh get --raw /readyz > /dev/null 2>&1; then
  kh delete volumesnapshotclass $SNAPCLASS $MEMBER_SNAPCLASS --ignore-not-found > /dev/null 2>&1
  kh delete volumegroupsnapshotclass relay-local-group relay-member-group --ignore-not-found > /dev/null 2>&1
  kh delete storageclass $CLASS $CLASS_WFFC $MEMBER_CLASS --ignore-not-found > /dev/null 2>&1
  kh delete csidriver $DRIVER $MEMBER_DRIVER --ignore-not-found > /dev/null 2>&1
  kh taint node "$HOST_REAL_NODE" "${FAKE_TAINT%%=*}-" > /dev/null 2>&1 || true
fi
if [[ -f $RUN/var-lib-kubelet-pods.link && -L /var/lib/kubelet/pods ]]; then
  rm -f /var/lib/kubelet/pods "$RUN/var-lib-kubelet-pods.link"
fi
# Anything still mounted or looped under RUN_DIR (a crashed driver's work).
if [[ -n $(kl_mounts_under "$RUN") ]]; then
  log "unmounting what is left under $RUN: $(kl_mounts_under "$RUN" | tr '\n' ' ')"
  kl_umount_all "$RUN" || { log "mounts remain under $RUN"; rc=1; }
fi
losetup -nl -O NAME,BACK-FILE 2>/dev/null | while read -r dev back; do
  [[ $back == "$RUN"/* ]] || continue
  losetup -d "$dev" && log "detached $dev ($back)"
done
if [[ -n $(losetup -nl -O BACK-FILE 2>/dev/null | grep -F "$RUN/") ]]; then log "loop devices remain under $RUN"; rc=1; fi
if [[ -z $(kl_mounts_under "$RUN") ]]; then
  rm -rf -- "$RUN/relay-state" "$RUN/member-state" "$RUN/env.sh"
else
  log "mounts remain under $RUN; state kept"; rc=1
fi
left=$(ls "$LAB"/pids/*.pid 2>/dev/null)
[[ -z $left ]] || { log "processes still recorded: $left"; rc=1; }
exit $rc
