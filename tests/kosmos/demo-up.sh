#!/usr/bin/env bash
# demo-up.sh RUN_DIR: adds to a running Kosmos environment (env-up.sh RUN_DIR)
# what tests/suite/member_classes_e2e.rs needs to play the seed's demo with
# the member storage people run under Kosmos:
#   - in member1, beside hostpath (kl-hostpath, kl-hostpath-wffc), the two
#     non-CSI provisioners, as plain processes with the member admin's
#     kubeconfig, their helper pods on the real kubelet node member-kl-1
#     (image: the busybox the kubelet scripts make, localhost/busybox:1.35):
#       openebs dynamic-localpv-provisioner, class openebs-hostpath
#         (`local` PVs under $RUN/demo/disk/openebs),
#       rancher local-path-provisioner, class local-path
#         (`hostPath` PVs under $RUN/demo/disk/local-path),
#     both WaitForFirstConsumer, as the provisioners require;
#   - in the host, a kube-scheduler and a real kubelet node demo-kl-1 that
#     stands for member1's node member-kl-1 (labels
#     topology.relay.csi.dev/member{,-node}); the relay's node plugin and its
#     registrar are the test's to start (RUN_DIR/demo/env.sh says where).
# Binaries from $E2E_HOME/bin only; builds nothing. Undone by env-down.sh
# RUN_DIR (demo-down.sh first), also after a partial run.
set -Eeuo pipefail
RUN=${1:?usage: demo-up.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
RUN=$(cd "$RUN" && pwd)
D=$RUN/demo
mkdir -p "$D/logs" "$D/pids" "$D/disk/openebs" "$D/disk/local-path"
trap 'rc=$?; echo "demo-up failed (rc=$rc) at line $LINENO; see $D/logs" >&2; "$HERE/demo-down.sh" "$RUN" >&2 || true; exit $rc' ERR
source "$HERE/../env-lib.sh"
B=$E2E_HOME/bin
for b in provisioner-localpv local-path-provisioner kube-scheduler kubelet csi-node-driver-registrar; do
  [[ -x $B/$b ]] || { echo "missing $B/$b" >&2; exit 2; }
done
lab() { ( LAB=$D; source "$KL/kl-lib.sh"; "$@" ); }
HELPER_IMAGE=localhost/busybox:1.35

# ---- member1: openebs-hostpath
km apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: openebs}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: openebs-helper, namespace: openebs}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $OPENEBS_CLASS
  annotations:
    cas.openebs.io/config: |
      - name: StorageType
        value: hostpath
      - name: BasePath
        value: $D/disk/openebs
provisioner: openebs.io/local
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
YAML
# It reads its kubeconfig from OPENEBS_IO_KUBE_CONFIG only, and exits at
# its first call if the API server is not up (it is, here).
lab kl_start openebs-localpv "$D/logs/openebs-localpv.log" /usr/bin/env \
  OPENEBS_IO_KUBE_CONFIG="$MEMBER_KUBECONFIG" OPENEBS_NAMESPACE=openebs \
  OPENEBS_SERVICE_ACCOUNT=openebs-helper OPENEBS_IO_HELPER_IMAGE=$HELPER_IMAGE \
  OPENEBS_IO_BASE_PATH="$D/disk/openebs" LEADER_ELECTION_ENABLED=false OPENEBS_IO_ENABLE_ANALYTICS=false \
  "$B/provisioner-localpv" --logtostderr=true --v=2
ts "member1: openebs dynamic-localpv-provisioner, class $OPENEBS_CLASS"

# ---- member1: local-path
cat > "$D/local-path-config.json" <<JSON
{"nodePathMap":[{"node":"DEFAULT_PATH_FOR_NON_LISTED_NODES","paths":["$D/disk/local-path"]}]}
JSON
cat > "$D/local-path-setup" <<'SH'
#!/bin/sh
set -eu
mkdir -m 0777 -p "$VOL_DIR"
SH
cat > "$D/local-path-teardown" <<'SH'
#!/bin/sh
set -eu
rm -rf "$VOL_DIR"
SH
cat > "$D/local-path-helper.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata: {name: helper-pod}
spec:
  containers:
  - name: helper-pod
    image: $HELPER_IMAGE
    imagePullPolicy: IfNotPresent
YAML
km create namespace local-path-storage --dry-run=client -o yaml | km apply -f - > /dev/null
km -n local-path-storage create serviceaccount local-path-provisioner-service-account --dry-run=client -o yaml | km apply -f - > /dev/null
# The helper pod mounts its scripts from this ConfigMap, files or not.
km -n local-path-storage create configmap local-path-config --from-file=config.json="$D/local-path-config.json" \
  --from-file=setup="$D/local-path-setup" --from-file=teardown="$D/local-path-teardown" \
  --from-file=helperPod.yaml="$D/local-path-helper.yaml" --dry-run=client -o yaml | km apply -f - > /dev/null
km apply -f - > /dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $LOCAL_PATH_CLASS}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
YAML
lab kl_start local-path "$D/logs/local-path.log" "$B/local-path-provisioner" start \
  --kubeconfig "$MEMBER_KUBECONFIG" --namespace local-path-storage --config "$D/local-path-config.json" \
  --helper-pod-file "$D/local-path-helper.yaml" --health-port $LOCAL_PATH_HEALTH_PORT
ts "member1: local-path-provisioner, class $LOCAL_PATH_CLASS"

# ---- host: a scheduler and demo-kl-1, which stands for member-kl-1
# The Kosmos node is Ready; no node lifecycle controller runs here to lift
# the not-ready taint a new node gets (a scheduler would keep pods off it).
kh taint node kosmos-member1 node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
export BIN_DIR=$B
"$KL/kube-scheduler-up.sh" "$HOST_KUBECONFIG" $DEMO_SCHED_PORT "$D/lab" > "$D/logs/scheduler-up.log" 2>&1
# A second kubelet on this machine: pod log dirs of its own (POD_LOG_DIR).
CTRD_STATE=$DEMO_CTRD_STATE POD_LOG_DIR=$D/var-log \
  "$KL/kubelet-node-up.sh" "$HOST_KUBECONFIG" $DEMO_NODE $DEMO_KL_PORT "$D/lab" > "$D/logs/kubelet-node-up.log" 2>&1
kh taint node $DEMO_NODE node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
kh label node $DEMO_NODE --overwrite topology.relay.csi.dev/member=member1 \
  topology.relay.csi.dev/member-node=$KL_NODE > /dev/null
# The relay's node plugin reaches member-kl-1's hostpath node plugin here
# (--plugins-dir): this machine is that node's.
mkdir -p "$D/member-plugins/$KL_DRIVER"
ln -sfn "$RUN/lab/kubelet/plugins/$KL_DRIVER/csi.sock" "$D/member-plugins/$KL_DRIVER/csi.sock"
MEMBER_NODE=$KL_NODE
source "$D/lab/node.env"   # KL_* of the host node from here on
cat > "$D/env.sh" <<ENV
export RELAY_DEMO_NODE=$DEMO_NODE
export RELAY_DEMO_PLUGINS_DIR=$KL_PLUGINS_DIR
export RELAY_DEMO_REGISTRATION_DIR=$KL_REGISTRATION_DIR
export RELAY_DEMO_MEMBER_PLUGINS=$D/member-plugins
export RELAY_DEMO_DISK=$D/disk
ENV
ts "host: scheduler, kubelet node $DEMO_NODE for member1/$MEMBER_NODE; demo up"
