#!/usr/bin/env bash
# shared-down.sh RUN_DIR: undoes shared-up.sh RUN_DIR (also a partial one,
# and twice), in reverse order: member2's kubelet node drained and stopped
# with its scheduler (kubelet-node-down.sh), member2-node-1's taint lifted;
# the claims of class shared-local-path deleted while the provisioner and
# member-kl-1 still run (so its teardown removes their directories), the
# provisioner stopped, its class and namespace deleted; then the GlusterFS
# clients, brick and glusterd (glusterfs-down.sh). Every process by its
# recorded PID. Keeps the logs. The Kosmos environment stays up.
set -uo pipefail
RUN=${1:?usage: shared-down.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
# shellcheck disable=SC1091 # written by e2e-env/env-up.sh
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
[[ -d $RUN/shared ]] || exit 0
RUN=$(cd "$RUN" && pwd)
S=$RUN/shared
source "$HERE/../env-lib.sh"
# As shared-up.sh.
SHARED_CLASS=shared-local-path
SHARED_NS=relay-shared-storage
M2_KL_NODE=member2-kl-1
M2KC=$E2E_HOME/run/member2.kubeconfig
km2() { kubectl --kubeconfig "$M2KC" "$@"; }
mkdir -p "$S/logs"
rc=0

# ---- member2: its own class's volumes, torn down while its node and provisioner run
# (its hostpath driver's too: their loop devices go with them).
if [[ -d $S/m2lab ]] && km2 get --raw /readyz > /dev/null 2>&1; then
  own() { # own KIND CLASS
    km2 get "$1" -A -o jsonpath='{range .items[?(@.spec.storageClassName=="'"$2"'")]}{.metadata.namespace}{"/"}{.metadata.name}{"\n"}{end}' 2>/dev/null
  }
  for class in m2-local-path m2-hostpath m2-hostpath-wffc; do
    for c in $(own pvc $class); do km2 -n "${c%/*}" delete pvc "${c#*/}" --wait=false > /dev/null 2>&1; done
    # shellcheck disable=SC2317 # called by waitfor
    no_own_pvs() { [[ -z "$(own pv "$class")" ]]; }
    waitfor 60 "member2's PVs of class $class deleted" no_own_pvs || rc=1
    km2 delete storageclass $class --ignore-not-found > /dev/null 2>&1
  done
  km2 delete csidriver hostpath.m2.csi.k8s.io --ignore-not-found > /dev/null 2>&1
  km2 delete namespace relay-m2-local --wait=false --ignore-not-found > /dev/null 2>&1
fi

# ---- member2: the kubelet node (drained first), its scheduler
if [[ -d $S/m2lab ]]; then
  "$KL/kubelet-node-down.sh" "$S/m2lab" "$M2KC" $M2_KL_NODE > "$S/logs/kubelet-node-down.log" 2>&1 ||
    { rc=1; tail -5 "$S/logs/kubelet-node-down.log" >&2; }
  # kubelet-node-up.sh (POD_LOG_DIR) binds the lab onto itself here; when it
  # failed, its own rollback ran in the kubelet's mount namespace and left
  # that bind in this one (with its record gone).
  m2=$(awk -v d="$S/m2lab" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo)
  if [[ $m2 == "$S/m2lab" ]]; then umount "$S/m2lab" || rc=1; fi
  ts "member2: node $M2_KL_NODE and its scheduler down"
fi
if km2 get --raw /readyz > /dev/null 2>&1; then
  km2 taint node member2-node-1 "${FAKE_TAINT%%=*}-" > /dev/null 2>&1 || true
fi

# ---- member1: the class's volumes, torn down by the provisioner while it runs
if km get --raw /readyz > /dev/null 2>&1; then
  cls() { # cls KIND: KIND objects of the class, as NAMESPACE/NAME or NAME
    km get "$1" -A -o jsonpath='{range .items[?(@.spec.storageClassName=="'$SHARED_CLASS'")]}{.metadata.namespace}{"/"}{.metadata.name}{"\n"}{end}' 2>/dev/null
  }
  claims=$(cls pvc)
  # Pods still using them would keep the claims (pvc-protection): they go first.
  pods=$(km get pods -A -o json 2>/dev/null | python3 -c '
import json, sys
claims = set(sys.argv[1].split())
for p in json.load(sys.stdin)["items"]:
    ns = p["metadata"]["namespace"]
    if any(ns + "/" + v["persistentVolumeClaim"]["claimName"] in claims
           for v in p["spec"].get("volumes") or [] if "persistentVolumeClaim" in v):
        print(ns + "/" + p["metadata"]["name"])' "$claims" || true)
  for p in $pods; do
    echo "pod $p still uses a claim of class $SHARED_CLASS; deleting it" >&2
    km -n "${p%/*}" delete pod "${p#*/}" --wait=false > /dev/null 2>&1
  done
  for p in $pods; do km -n "${p%/*}" wait --for=delete pod "${p#*/}" --timeout=60s > /dev/null 2>&1 || rc=1; done
  for c in $claims; do km -n "${c%/*}" delete pvc "${c#*/}" --wait=false > /dev/null 2>&1; done
  if [[ -n "$(cls pv)" ]]; then
    # shellcheck disable=SC2317 # called by waitfor
    no_pvs() { [[ -z "$(cls pv)" ]]; }
    waitfor 60 "PVs of class $SHARED_CLASS deleted (the provisioner's teardown)" no_pvs || rc=1
    for v in $(cls pv); do
      echo "PV ${v#/} left (its claim still in use?); deleted without its teardown" >&2
      km patch pv "${v#/}" --type=merge -p '{"metadata":{"finalizers":null}}' > /dev/null 2>&1
      km delete pv "${v#/}" --wait=false > /dev/null 2>&1
    done
  fi
fi
for f in "$S"/pids/*.pid; do
  [[ -e $f ]] || continue
  # shellcheck disable=SC2034,SC1091 # kl-lib.sh: run-time path; it keeps its processes in $LAB/pids
  ( LAB=$S; source "$KL/kl-lib.sh"; kl_stop "$(basename "$f" .pid)" 15 ) || rc=1
done
if km get --raw /readyz > /dev/null 2>&1; then
  km delete storageclass $SHARED_CLASS --ignore-not-found > /dev/null 2>&1 || true
  km delete namespace $SHARED_NS --ignore-not-found --wait=false > /dev/null 2>&1 || true
fi
ts "member1: local-path-provisioner stopped, class $SHARED_CLASS and namespace $SHARED_NS deleted"

# ---- the shared filesystem
"$E2E_ENV/glusterfs-down.sh" "$S/gluster" > "$S/logs/glusterfs-down.log" 2>&1 ||
  { rc=1; tail -5 "$S/logs/glusterfs-down.log" >&2; }
ts "GlusterFS down"
rm -rf -- "$S/env.sh" "$S/local-path" "$S/manifests" "$S/pids"
rmdir -- "$S/m2-var-log" 2>/dev/null || true
left=$(awk '{print $5}' /proc/self/mountinfo | grep -F "$S" || true)
[[ -z $left ]] || { echo "mounts left under $S: $left" >&2; rc=1; }
exit $rc
