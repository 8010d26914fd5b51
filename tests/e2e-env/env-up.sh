#!/bin/bash
# env-up.sh - two local control planes ("host" :16443, "member" :17443) + hostpath CSI on the member.
#   member: hostpathplugin (real CSI driver, node id member-node-1, --enable-attach) + csi-provisioner
#           + csi-attacher; CSIDriver, Node/CSINode member-node-1, StorageClasses member-hostpath(+-wffc)
#   host:   Nodes vnode-member (Kosmos-style virtual node) and host-node-1; NO CSIDriver/CSINode
#           (the multi-cluster CSI driver under test is expected to register those).
# Knobs: HOSTPATH_V (default 5 = log every CSI request/response), SIDECAR_V (default 3).
# Writes ${E2E_HOME}/run/env/env.sh. Refuses to run if anything of the environment is already up.
# Undo with env-down.sh (also called automatically if env-up fails half-way).
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
H=${E2E_HOME:?set E2E_HOME} E=${E2E_HOME}/run/env BIN=${E2E_HOME}/bin
source "$HERE/lib.sh"
T0=$(date +%s.%N)
ts() { printf '[%6.2fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{print a-b}')" "$*"; }

DRIVER=hostpath.csi.k8s.io
MEMBER_NODE=member-node-1
SOCK=$E/sock/member-hostpath.sock
HP_STATE=$E/state/hostpath
HOST_KC=$H/run/host.kubeconfig MEMBER_KC=$H/run/member.kubeconfig
KCM_CONTROLLERS='*,-nodelifecycle'; export KCM_CONTROLLERS

# ---------------- refuse if (partly) up ----------------
busy=()
for f in "$E2E_PIDS_DIR"/*.pid; do
  [[ -e $f ]] || continue; n=$(basename "$f" .pid)
  if e2e_alive "$n"; then busy+=("process $n (pid $(cat "$f"))"); fi
done
for c in host member; do
  for f in $H/run/$c/pids/*.pid; do
    [[ -s $f ]] && [[ -d /proc/$(cat "$f") ]] && busy+=("cluster $c: $(basename "$f" .pid) pid $(cat "$f")")
  done
done
for p in 16443 16444 16445 16446 17443 17444 17445 17446; do
  ss -Hltn "sport = :$p" | grep -q . && busy+=("tcp port $p in use")
done
[[ -S $SOCK ]] && busy+=("socket $SOCK exists")
m=$(e2e_mounts_under $E); [[ -n $m ]] && busy+=("mounts under $E: $m")
l=$(e2e_loops_under $E); [[ -n $l ]] && busy+=("loop devices backed under $E: $l")
if ((${#busy[@]})); then
  echo "env-up: environment (or part of it) is already up / not cleaned; run $HERE/env-down.sh first:" >&2
  printf '  - %s\n' "${busy[@]}" >&2
  exit 1
fi
for b in kube-apiserver kube-controller-manager hostpathplugin csi-provisioner csi-attacher; do
  [[ -x $BIN/$b ]] || { echo "missing $BIN/$b (see $HERE/README.md: binaries you build on this machine)" >&2; exit 1; }
done
rm -f "$E2E_PIDS_DIR"/*.pid "$E2E_PIDS_DIR"/*.exe "$E2E_PIDS_DIR"/*.start $E/env.sh   # stale (dead) entries
rm -rf $E/state $E/sock
mkdir -p "$E2E_PIDS_DIR" "$E2E_LOG_DIR" $HP_STATE $E/sock $E/manifests
rm -f "$E2E_LOG_DIR"/*.log

# from here on, any failure rolls everything back
trap 'rc=$?; echo "env-up FAILED (rc=$rc) at line $LINENO; rolling back with env-down.sh" >&2; "$HERE/env-down.sh" >&2 || true; exit $rc' ERR

# ---------------- 1. clusters (in parallel) ----------------
ts "starting clusters host(16443) member(17443), KCM_CONTROLLERS=$KCM_CONTROLLERS"
"$HERE/cluster-up.sh" host 16443 >"$E2E_LOG_DIR/cluster-up-host.log" 2>&1 & ph=$!
"$HERE/cluster-up.sh" member 17443 >"$E2E_LOG_DIR/cluster-up-member.log" 2>&1 & pm=$!
rch=0; rcm=0; wait $ph || rch=$?; wait $pm || rcm=$?
if ((rch || rcm)); then
  echo "cluster-up failed (host rc=$rch, member rc=$rcm):" >&2; tail -5 "$E2E_LOG_DIR"/cluster-up-*.log >&2; false
fi
ts "clusters up"
kh() { kubectl --kubeconfig $HOST_KC "$@"; }
km() { kubectl --kubeconfig $MEMBER_KC "$@"; }

# ---------------- 2. member: hostpathplugin ----------------
e2e_start member-hostpathplugin $BIN/hostpathplugin \
  --endpoint unix://$SOCK --nodeid $MEMBER_NODE --drivername $DRIVER \
  --statedir $HP_STATE --enable-attach -v=${HOSTPATH_V:-5}   # v5: every CSI request/response is logged
for ((i = 0; i < 100; i++)); do [[ -S $SOCK ]] && break; e2e_alive member-hostpathplugin || break; sleep 0.1; done
[[ -S $SOCK ]] || { echo "hostpathplugin did not create $SOCK" >&2; false; }
# What csi-driver-host-path v1.15 answers in NodeGetInfo: node_id = --nodeid and one topology segment,
# topology.hostpath.csi/node = node id (-> CSINode topologyKeys + Node labels below).
NODE_ID=$MEMBER_NODE
TOPO=("topology.hostpath.csi/node=$MEMBER_NODE")
ts "hostpathplugin up (pid $(cat $E2E_PIDS_DIR/member-hostpathplugin.pid)); node_id=$NODE_ID topology=${TOPO[*]}"

# ---------------- 3. member objects ----------------
topo_labels="" topo_keys=""
for kv in "${TOPO[@]}"; do topo_labels+="    ${kv%%=*}: \"${kv#*=}\""$'\n'; topo_keys+="${kv%%=*},"; done
cat >$E/manifests/member.yaml <<EOF
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $DRIVER}
spec:
  attachRequired: true
  podInfoOnMount: false
  volumeLifecycleModes: [Persistent]
---
apiVersion: v1
kind: Node
metadata:
  name: $MEMBER_NODE
  annotations: {volumes.kubernetes.io/controller-managed-attach-detach: "true"}
  labels:
    kubernetes.io/hostname: $MEMBER_NODE
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
$topo_labels---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: $MEMBER_NODE}
spec:
  drivers:
  - name: $DRIVER
    nodeID: $NODE_ID
    topologyKeys: [${topo_keys%,}]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: member-hostpath}
provisioner: $DRIVER
reclaimPolicy: Delete
volumeBindingMode: Immediate
allowVolumeExpansion: true
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: member-hostpath-wffc}
provisioner: $DRIVER
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
EOF
km apply -f $E/manifests/member.yaml >"$E2E_LOG_DIR/kubectl-member.log" 2>&1
ready_patch='{"status":{"conditions":[{"type":"Ready","status":"True","reason":"E2EFakeNode","message":"fake node (no kubelet)","lastHeartbeatTime":"'$(date -u +%FT%TZ)'","lastTransitionTime":"'$(date -u +%FT%TZ)'"}]}}'
km patch node $MEMBER_NODE --subresource=status --type=merge -p "$ready_patch" >>"$E2E_LOG_DIR/kubectl-member.log" 2>&1
ts "member objects created (CSIDriver, Node+CSINode $MEMBER_NODE, SC member-hostpath, member-hostpath-wffc)"

# ---------------- 4. member: sidecars ----------------
# Topology: on by default from external-provisioner v5 for a driver with VOLUME_ACCESSIBILITY_CONSTRAINTS
# (hostpath has it), off by default before (v3.4.1, the oldest set); said either way, as deploy/ says it.
PROV_EXTRA=(--feature-gates=Topology=true)
e2e_start member-csi-provisioner $BIN/csi-provisioner \
  --csi-address=$SOCK --kubeconfig=$MEMBER_KC --leader-election=false -v=${SIDECAR_V:-3} "${PROV_EXTRA[@]}"
e2e_start member-csi-attacher $BIN/csi-attacher \
  --csi-address=$SOCK --kubeconfig=$MEMBER_KC --leader-election=false -v=${SIDECAR_V:-3}
waitlog() { # waitlog NAME REGEX SECONDS
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    grep -qE "$2" "$E2E_LOG_DIR/$1.log" && return 0
    e2e_alive "$1" || { echo "$1 died; see $E2E_LOG_DIR/$1.log" >&2; tail -5 "$E2E_LOG_DIR/$1.log" >&2; return 1; }
    sleep 0.1
  done
  echo "timeout waiting for '$2' in $E2E_LOG_DIR/$1.log" >&2; return 1
}
waitlog member-csi-provisioner 'Started provisioner controller' 60
waitlog member-csi-attacher 'Starting CSI attacher|Started VA processing|caches populated' 60
ts "csi-provisioner ${PROV_EXTRA[*]} (pid $(cat $E2E_PIDS_DIR/member-csi-provisioner.pid)) and csi-attacher (pid $(cat $E2E_PIDS_DIR/member-csi-attacher.pid)) running"

# ---------------- 5. host objects ----------------
cat >$E/manifests/host.yaml <<EOF
# Kosmos-style virtual node (cf. kosmos pkg/utils BuildNodeTemplate: kosmos.io/node label + taint, role agent)
apiVersion: v1
kind: Node
metadata:
  name: vnode-member
  annotations: {volumes.kubernetes.io/controller-managed-attach-detach: "true"}
  labels:
    kosmos.io/node: "true"
    kubernetes.io/role: agent
    kubernetes.io/hostname: vnode-member
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    beta.kubernetes.io/os: linux
spec:
  taints:
  - {key: kosmos.io/node, value: "true", effect: NoSchedule}
---
apiVersion: v1
kind: Node
metadata:
  name: host-node-1
  annotations: {volumes.kubernetes.io/controller-managed-attach-detach: "true"}
  labels:
    kubernetes.io/hostname: host-node-1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
EOF
kh apply -f $E/manifests/host.yaml >"$E2E_LOG_DIR/kubectl-host.log" 2>&1
for n in vnode-member host-node-1; do
  kh patch node $n --subresource=status --type=merge -p "$ready_patch" >>"$E2E_LOG_DIR/kubectl-host.log" 2>&1
done
# the ServiceAccount admission plugin rejects pods until the 'default' SA exists
for ((i = 0; i < 300; i++)); do
  kh -n default get sa default >/dev/null 2>&1 && km -n default get sa default >/dev/null 2>&1 && break; sleep 0.2
done
ts "host objects created (Nodes vnode-member [tainted kosmos.io/node=true:NoSchedule], host-node-1)"

# ---------------- 5b. member: the relay's identity, as deploy/member makes it ----------------
"$HERE/member-identity.sh" "$MEMBER_KC" "$H/run/member-relay.kubeconfig" member >"$E2E_LOG_DIR/member-identity.log" 2>&1 ||
  { cat "$E2E_LOG_DIR/member-identity.log" >&2; false; }
ts "member: deploy/member applied with its admission policy; the relay's identity in $H/run/member-relay.kubeconfig"

# ---------------- 6. env.sh ----------------
cat >$E/env.sh <<EOF
# generated by env-up.sh at $(date -u +%FT%TZ); removed by env-down.sh
export HOST_KUBECONFIG=$HOST_KC
export MEMBER_KUBECONFIG=$MEMBER_KC
# The relay's own member identity (deploy/member's csi-relay-member, admission policy installed).
export MEMBER_RELAY_KUBECONFIG=$H/run/member-relay.kubeconfig
# The node plugins' (deploy/member's csi-relay-member-node: no rights without node-secrets/).
export MEMBER_RELAY_NODE_KUBECONFIG=$H/run/member-relay-node.kubeconfig
export MEMBER_STORAGE_CLASS=member-hostpath
export MEMBER_CSI_DRIVER=$DRIVER
export MEMBER_NODE=$MEMBER_NODE
export MEMBER_HOSTPATH_SOCK=$SOCK
export HOST_VIRTUAL_NODE=vnode-member
export HOST_REAL_NODE=host-node-1
export HOST_CLUSTER_PIDS_DIR=$H/run/host/pids
EOF
trap - ERR
ts "env-up complete; source $E/env.sh"
kh get nodes -L kosmos.io/node 2>/dev/null | sed 's/^/  host   /'
km get nodes,csinode,sc 2>/dev/null | sed 's/^/  member /'
