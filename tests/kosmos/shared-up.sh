#!/usr/bin/env bash
# shared-up.sh RUN_DIR: adds to a running Kosmos environment (env-up.sh
# RUN_DIR) one real shared filesystem that a real kubelet node of each member
# reaches through a FUSE client of its own:
#   - GlusterFS volume relay-shared (../e2e-env/glusterfs-up.sh, state in
#     RUN_DIR/shared/gluster), mounted twice by two separate clients:
#     RUN_DIR/shared/member1 (member1's nodes) and RUN_DIR/shared/member2
#     (member2's); nothing else carries data between the members;
#   - in member1, a second rancher local-path-provisioner (namespace
#     relay-shared-storage, provisioner relay.csi.dev/shared-local-path, health
#     port 19488), configured with sharedFileSystemPath
#     RUN_DIR/shared/member1/volumes: hostPath PVs there, no node affinity,
#     every access mode; class shared-local-path, Immediate, Delete; its
#     helper pods on member-kl-1 (localhost/busybox:1.35);
#   - in member2, a kube-scheduler (:19487) and a real kubelet node
#     member2-kl-1 (:10380, healthz :10381; its own containerd, mount
#     namespace and pod log dirs, as demo-up.sh's demo-kl-1), started after
#     the mounts, so that its mount namespace has RUN_DIR/shared/member2
#     (member2's client); RUN_DIR/shared/member1 is unmounted in that
#     namespace. member2's fake node member2-node-1 gets FAKE_TAINT;
#   - in member2, storage of its own for volumes that move (movableBetween):
#     a third local-path-provisioner (namespace relay-m2-local, provisioner
#     relay.csi.dev/m2-local-path, health port 19489), class m2-local-path
#     (WaitForFirstConsumer, Delete), hostPath PVs under RUN_DIR/shared/m2-own
#     on member2-kl-1 only: nothing of member1 names that directory, nor
#     member2 member1's; and for block volumes and a size it refuses,
#     csi-driver-host-path on member2-kl-1 (../e2e-env/kubelet/csi-hostpath-up.sh,
#     driver hostpath.m2.csi.k8s.io, classes m2-hostpath (Immediate) and
#     m2-hostpath-wffc, state in RUN_DIR/shared/m2lab/csi/hostpath-state,
#     volumes of at most OWN_HP_MAX bytes: a bigger one is refused).
# Writes RUN_DIR/shared/env.sh. Binaries from $E2E_HOME/bin and Debian's
# glusterfs-server/-client; builds nothing. Undo with shared-down.sh RUN_DIR
# (run on any failure here too); env-down.sh RUN_DIR does not know of it.
set -Eeuo pipefail
RUN=${1:?usage: shared-up.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
# shellcheck disable=SC1091 # written by e2e-env/env-up.sh
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
[[ -s $RUN/env.sh ]] || { echo "no Kosmos environment in $RUN (run $HERE/env-up.sh $RUN first)" >&2; exit 2; }
RUN=$(cd "$RUN" && pwd)
S=$RUN/shared
# Names and ports (shared-down.sh has the same).
SHARED_VOLUME=relay-shared
SHARED_CLASS=shared-local-path
SHARED_NS=relay-shared-storage
SHARED_PROVISIONER=relay.csi.dev/shared-local-path
SHARED_HEALTH_PORT=19488              # the provisioner's health port (it listens on all addresses)
OWN_CLASS=m2-local-path               # member2's own storage
OWN_NS=relay-m2-local
OWN_PROVISIONER=relay.csi.dev/m2-local-path
OWN_HEALTH_PORT=19489
OWN_HP_DRIVER=hostpath.m2.csi.k8s.io  # member2's own block-capable storage
OWN_HP_CLASS=m2-hostpath
OWN_HP_MAX=$((100 << 20))             # 100 MiB: a move of a bigger volume there is refused
M2_KL_NODE=member2-kl-1
M2_KL_PORT=10380                      # its https port (+1: healthz)
M2_SCHED_PORT=19487                   # member2 kube-scheduler
M2_CTRD_STATE=/run/relay-shared-m2-containerd
M2KC=$E2E_HOME/run/member2.kubeconfig
HELPER_IMAGE=localhost/busybox:1.35
B=$E2E_HOME/bin
km2() { kubectl --kubeconfig "$M2KC" "$@"; }
# shellcheck disable=SC2034,SC1091 # kl-lib.sh: run-time path; it keeps its processes in $LAB/pids
lab() { ( LAB=$S; source "$KL/kl-lib.sh"; "$@" ); }
source "$HERE/../env-lib.sh"

for b in local-path-provisioner kube-scheduler kubelet pause; do
  [[ -x $B/$b ]] || { echo "missing $B/$b" >&2; exit 2; }
done
busy=()
for f in "$S"/pids/*.pid "$S"/m2lab/pids/*.pid "$S"/gluster/pids/*.pid; do
  [[ -e $f ]] || continue
  # shellcheck disable=SC2034,SC1091 # as lab()
  ( LAB=$(dirname "$(dirname "$f")"); source "$KL/kl-lib.sh"; kl_alive "$(basename "$f" .pid)" ) &&
    busy+=("process $(basename "$f" .pid) (pid $(cat "$f"))")
done
[[ -e $S/env.sh ]] && busy+=("$S/env.sh")
for p in $SHARED_HEALTH_PORT $OWN_HEALTH_PORT $M2_SCHED_PORT $M2_KL_PORT $((M2_KL_PORT + 1)); do
  ss -Hltn "sport = :$p" | grep -q . && busy+=("tcp port $p in use")
done
[[ -e $M2_CTRD_STATE ]] && busy+=("$M2_CTRD_STATE exists")
if ((${#busy[@]})); then
  echo "shared-up: (part of) a previous run is there; run $HERE/shared-down.sh $RUN first:" >&2
  printf '  - %s\n' "${busy[@]}" >&2
  exit 1
fi
km2 get node member2-node-1 > /dev/null || { echo "member2 is not up ($M2KC)" >&2; exit 2; }
[[ "$(km get node $KL_NODE -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]] ||
  { echo "member1's node $KL_NODE is not Ready" >&2; exit 2; }
mkdir -p "$S/logs" "$S/pids" "$S/manifests" "$S/local-path"
bg=
# shellcheck disable=SC2154 # rc is the trap's own
trap 'rc=$?; echo "shared-up failed (rc=$rc) at line $LINENO; see $S/logs" >&2; [[ -z $bg ]] || wait $bg || true; "$HERE/shared-down.sh" "$RUN" >&2 || true; exit $rc' ERR

# ---- the shared filesystem: one volume, a client per member
"$E2E_ENV/glusterfs-up.sh" "$S/gluster" $SHARED_VOLUME "$S/member1" "$S/member2" > "$S/logs/glusterfs-up.log" 2>&1 ||
  { tail -5 "$S/logs/glusterfs-up.log" >&2; false; }
ts "GlusterFS volume $SHARED_VOLUME: member1's mount $S/member1 (client pid $(cat "$S/gluster/pids/client-1.pid")), member2's $S/member2 (pid $(cat "$S/gluster/pids/client-2.pid"))"

# ---- member2: a scheduler and a real kubelet node, in the background
# (started after the mounts: its mount namespace copies them).
m2_node_up() {
  km2 taint node member2-node-1 "$FAKE_TAINT" --overwrite > /dev/null
  BIN_DIR=$B "$KL/kube-scheduler-up.sh" "$M2KC" $M2_SCHED_PORT "$S/m2lab"
  # Another kubelet on this machine: pod log dirs of its own (POD_LOG_DIR),
  # hence a mount namespace of its own.
  # On the pod network member1's node is on (env-up.sh).
  BIN_DIR=$B CTRD_STATE=$M2_CTRD_STATE POD_LOG_DIR=$S/m2-var-log POD_NETWORK=$(cat "$RUN/podnet" 2>/dev/null) \
    KUBELET_CLIENT_CA=$(kubelet_client_ca "$E2E_HOME/run/member2/pki/ca.crt" "$S/member2-kubelet-client-ca.crt") \
    "$KL/kubelet-node-up.sh" "$M2KC" $M2_KL_NODE $M2_KL_PORT "$S/m2lab"
  node_on_loopback "$M2KC" $M2_KL_NODE
  # No node lifecycle controller may lift the not-ready taint here.
  km2 taint node $M2_KL_NODE node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
}
( trap - ERR; m2_node_up ) > "$S/logs/member2-node-up.log" 2>&1 &
bg=$!

# ---- member1: local-path-provisioner on the shared filesystem
mkdir -p "$S/member1/volumes"
cat > "$S/local-path/config.json" <<JSON
{"nodePathMap":[],"sharedFileSystemPath":"$S/member1/volumes"}
JSON
cat > "$S/local-path/setup" <<'SH'
#!/bin/sh
set -eu
mkdir -m 0777 -p "$VOL_DIR"
SH
cat > "$S/local-path/teardown" <<'SH'
#!/bin/sh
set -eu
rm -rf "$VOL_DIR"
SH
# With a shared filesystem the provisioner names no node for its helper pods
# (and refuses spec.nodeName in the template): a nodeSelector keeps them on
# the node that mounts it.
cat > "$S/local-path/helperPod.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: helper-pod}
spec:
  nodeSelector: {kubernetes.io/hostname: $KL_NODE}
  containers:
  - name: helper-pod
    image: $HELPER_IMAGE
    imagePullPolicy: IfNotPresent
YAML
# A previous run's namespace still terminating would take what is made now with it.
ns_usable() { [[ "$(km get namespace $SHARED_NS -o jsonpath='{.status.phase}' 2> /dev/null)" != Terminating ]]; }
waitfor 120 "namespace $SHARED_NS of a previous run to go" ns_usable
km create namespace $SHARED_NS --dry-run=client -o yaml | km apply -f - > /dev/null
km -n $SHARED_NS create serviceaccount local-path-provisioner-service-account --dry-run=client -o yaml | km apply -f - > /dev/null
# The helper pod mounts setup/teardown from this ConfigMap.
km -n $SHARED_NS create configmap local-path-config --from-file=config.json="$S/local-path/config.json" \
  --from-file=setup="$S/local-path/setup" --from-file=teardown="$S/local-path/teardown" \
  --from-file=helperPod.yaml="$S/local-path/helperPod.yaml" --dry-run=client -o yaml | km apply -f - > /dev/null
cat > "$S/manifests/storageclass.yaml" <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $SHARED_CLASS}
provisioner: $SHARED_PROVISIONER
volumeBindingMode: Immediate
reclaimPolicy: Delete
YAML
km apply -f "$S/manifests/storageclass.yaml" > /dev/null
lab kl_start shared-local-path "$S/logs/shared-local-path.log" "$B/local-path-provisioner" start \
  --kubeconfig "$MEMBER_KUBECONFIG" --provisioner-name $SHARED_PROVISIONER --namespace $SHARED_NS \
  --config "$S/local-path/config.json" --helper-pod-file "$S/local-path/helperPod.yaml" \
  --health-port $SHARED_HEALTH_PORT
waitfor 30 "local-path-provisioner health on :$SHARED_HEALTH_PORT" curl -sf "http://127.0.0.1:$SHARED_HEALTH_PORT/health"
lab kl_alive shared-local-path || { echo "local-path-provisioner exited; see $S/logs/shared-local-path.log" >&2; false; }
ts "member1: local-path-provisioner $SHARED_PROVISIONER (pid $(cat "$S/pids/shared-local-path.pid")), class $SHARED_CLASS on $S/member1/volumes"

wait $bg || { bg=; tail -5 "$S/logs/member2-node-up.log" >&2; false; }
bg=
# member2's node sees the volume through member2's client only.
KLPID=$(cat "$S/m2lab/pids/kubelet.pid")
[[ "$(readlink "/proc/$KLPID/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ]] ||
  { echo "$M2_KL_NODE's kubelet shares this mount namespace" >&2; false; }
nsenter -t "$KLPID" -m umount "$S/member1"
[[ "$(nsenter -t "$KLPID" -m findmnt -n -o FSTYPE --mountpoint "$S/member2")" == fuse.glusterfs ]] ||
  { echo "$S/member2 is not a glusterfs mount in $M2_KL_NODE's mount namespace" >&2; false; }
if nsenter -t "$KLPID" -m findmnt -n --mountpoint "$S/member1" > /dev/null; then
  echo "$S/member1 is still mounted in $M2_KL_NODE's mount namespace" >&2; false
fi
probe=.probe-$$; echo "$probe" > "$S/member1/volumes/$probe"
[[ "$(nsenter -t "$KLPID" -m cat "$S/member2/volumes/$probe")" == "$probe" ]] ||
  { echo "$M2_KL_NODE does not see member1's write through $S/member2" >&2; false; }
rm -f "$S/member1/volumes/$probe"
ts "member2: scheduler :$M2_SCHED_PORT, kubelet node $M2_KL_NODE (pid $KLPID, :$M2_KL_PORT) on $S/member2 (glusterfs in its mount namespace; $S/member1 not there)"

# ---- member2: storage of its own (local-path on member2-kl-1)
mkdir -p "$S/m2-own" "$S/m2-local-path"
cat > "$S/m2-local-path/config.json" <<JSON
{"nodePathMap":[{"node":"$M2_KL_NODE","paths":["$S/m2-own"]}]}
JSON
cp "$S/local-path/setup" "$S/local-path/teardown" "$S/m2-local-path/"
cat > "$S/m2-local-path/helperPod.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: helper-pod}
spec:
  containers:
  - name: helper-pod
    image: $HELPER_IMAGE
    imagePullPolicy: IfNotPresent
YAML
km2 create namespace $OWN_NS --dry-run=client -o yaml | km2 apply -f - > /dev/null
km2 -n $OWN_NS create serviceaccount local-path-provisioner-service-account --dry-run=client -o yaml | km2 apply -f - > /dev/null
km2 -n $OWN_NS create configmap local-path-config --from-file=config.json="$S/m2-local-path/config.json" \
  --from-file=setup="$S/m2-local-path/setup" --from-file=teardown="$S/m2-local-path/teardown" \
  --from-file=helperPod.yaml="$S/m2-local-path/helperPod.yaml" --dry-run=client -o yaml | km2 apply -f - > /dev/null
km2 apply -f - > /dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $OWN_CLASS}
provisioner: $OWN_PROVISIONER
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
YAML
lab kl_start m2-local-path "$S/logs/m2-local-path.log" "$B/local-path-provisioner" start \
  --kubeconfig "$M2KC" --provisioner-name $OWN_PROVISIONER --namespace $OWN_NS \
  --config "$S/m2-local-path/config.json" --helper-pod-file "$S/m2-local-path/helperPod.yaml" \
  --health-port $OWN_HEALTH_PORT
waitfor 30 "member2's local-path-provisioner health on :$OWN_HEALTH_PORT" curl -sf "http://127.0.0.1:$OWN_HEALTH_PORT/health"
lab kl_alive m2-local-path || { echo "member2's local-path-provisioner exited; see $S/logs/m2-local-path.log" >&2; false; }
ts "member2: local-path-provisioner $OWN_PROVISIONER (pid $(cat "$S/pids/m2-local-path.pid")), class $OWN_CLASS on $S/m2-own"

CSI_BIN_DIR=$B DRIVER=$OWN_HP_DRIVER CLASS=$OWN_HP_CLASS HOSTPATH_MAX_VOLUME_SIZE=$OWN_HP_MAX \
  "$KL/csi-hostpath-up.sh" "$M2KC" $M2_KL_NODE "$S/m2lab" > "$S/logs/m2-hostpath-up.log" 2>&1 ||
  { tail -5 "$S/logs/m2-hostpath-up.log" >&2; false; }
ts "member2: csi-driver-host-path $OWN_HP_DRIVER on $M2_KL_NODE (pid $(cat "$S/m2lab/pids/csi-hostpath.pid")), class $OWN_HP_CLASS, volumes of at most $OWN_HP_MAX bytes"

cat > "$S/env.sh" <<ENV
# generated by shared-up.sh at $(date -u +%FT%TZ); removed by shared-down.sh
export RELAY_SHARED_RUN=$S
export RELAY_SHARED_VOLUME=$SHARED_VOLUME
# Each member's own GlusterFS client mount of the volume (separate glusterfs processes).
export RELAY_SHARED_MEMBER1_MOUNT=$S/member1
export RELAY_SHARED_MEMBER2_MOUNT=$S/member2
export RELAY_SHARED_MEMBER1_CLIENT_PID=$(cat "$S/gluster/pids/client-1.pid")
export RELAY_SHARED_MEMBER2_CLIENT_PID=$(cat "$S/gluster/pids/client-2.pid")
# Where the class's PVs live (hostPath dirs PVNAME_NAMESPACE_CLAIM), through each member's mount.
export RELAY_SHARED_MEMBER1_VOLUMES=$S/member1/volumes
export RELAY_SHARED_MEMBER2_VOLUMES=$S/member2/volumes
export RELAY_SHARED_CLASS=$SHARED_CLASS
export RELAY_SHARED_PROVISIONER=$SHARED_PROVISIONER
export RELAY_SHARED_NAMESPACE=$SHARED_NS
export RELAY_SHARED_MEMBER1_KUBECONFIG=$MEMBER_KUBECONFIG
export RELAY_SHARED_MEMBER1_NODE=$KL_NODE
export RELAY_SHARED_MEMBER2_KUBECONFIG=$M2KC
export RELAY_SHARED_MEMBER2_NODE=$M2_KL_NODE
export RELAY_SHARED_MEMBER2_KUBELET_PID=$KLPID
export RELAY_SHARED_HELPER_IMAGE=$HELPER_IMAGE
# member2's own storage (no shared filesystem): class, and where its PVs live.
export RELAY_OWN_MEMBER2_CLASS=$OWN_CLASS
export RELAY_OWN_MEMBER2_VOLUMES=$S/m2-own
# member2's own csi-driver-host-path (block volumes; at most RELAY_OWN_MEMBER2_HOSTPATH_MAX bytes).
export RELAY_OWN_MEMBER2_HOSTPATH_CLASS=$OWN_HP_CLASS
export RELAY_OWN_MEMBER2_HOSTPATH_MAX=$OWN_HP_MAX
export RELAY_OWN_MEMBER2_HOSTPATH_STATE=$S/m2lab/csi/hostpath-state
export RELAY_SHARED_MEMBER2_LAB=$S/m2lab
ENV
trap - ERR
ts "shared storage up; source $S/env.sh"
