#!/usr/bin/env bash
# env-up.sh RUN_DIR: adds to the running two-cluster environment
# (tests/e2e-env/env-up.sh) what the Kubernetes "External
# Storage" e2e suite (tests/k8s-e2e/run.sh) needs, all in the HOST cluster:
#   - a kube-scheduler and a real kubelet node "host-kl-1" with its own
#     containerd and the e2e images imported (no registry is ever contacted);
#   - the env's fake nodes tainted (host-node-1 here; vnode-member already is),
#     the kubelet's not-ready taint lifted (the env runs no node lifecycle
#     controller), the Node's InternalIP set to 127.0.0.1 for exec/logs;
#   - csi-relay `serve --mode all --backend local` as driver relay.csi.dev on
#     that node (socket in the kubelet's plugins dir, registered through
#     csi-node-driver-registrar), with csi-provisioner, csi-attacher,
#     csi-resizer and, when built, csi-snapshotter + snapshot-controller + the
#     snapshot CRDs; the CSIDriver (deploy/csidriver.yaml's spec),
#     StorageClasses relay-local (Immediate) and relay-local-wffc, and a
#     VolumeSnapshotClass.
#   - with MEMBER=1 also part (b) (member-up.inc.sh): in the member cluster a
#     kube-scheduler and a kubelet node member-kl-1 with hostpath as the member
#     storage; csi-relay --backend member (controller + node plugin on
#     host-kl-1) as member.relay.csi.dev, class relay-member.
# Pre-condition: the two-cluster env was started with the APISERVER_EXTRA that
# apiserver-extra.sh prints (exec/logs; refused otherwise unless
# K8SE2E_NO_EXEC=1). Writes RUN_DIR/env.sh. Starts binaries from
# $E2E_HOME/bin and RELAY_BIN only; builds nothing. Undo with env-down.sh
# RUN_DIR (run on any failure here too).
# Knobs: RELAY_BIN [repo's target/release/csi-relay], IMAGES_DIR
# [$E2E_HOME/images], EXTRA_IMAGES_DIR (imported after, same names win: stand-ins), SNAPSHOT_CRDS [$E2E_HOME/snapshot-crds], RELAY_LOG
# [csi_relay=debug], MEMBER [0], CAPACITY [1], MAX_VOLUMES [24].
set -Eeuo pipefail
RUN=${1:?usage: env-up.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
RELAY_BIN=$(readlink -f "${RELAY_BIN:-$HERE/../../target/release/csi-relay}")
IMAGES_DIR=${IMAGES_DIR:-$E2E_HOME/images}
SNAPSHOT_CRDS=${SNAPSHOT_CRDS:-$E2E_HOME/snapshot-crds}
RELAY_LOG=${RELAY_LOG:-csi_relay=debug}
MEMBER=${MEMBER:-0}
# The node's attach limit (NodeGetInfo max_volumes_per_node -> CSINode
# allocatable), which volumeLimits checks by filling it. Room for the parallel
# shards of run.sh at once (each holds at most a few volumes).
MAX_VOLUMES=${MAX_VOLUMES:-24}
B=$E2E_HOME/bin
mkdir -p "$RUN"; RUN=$(cd "$RUN" && pwd)
LAB=$RUN/lab
mkdir -p "$RUN/logs" "$RUN/manifests" "$LAB/logs"
trap 'rc=$?; echo "k8s-e2e env-up failed (rc=$rc) at line $LINENO; see $RUN/logs and $LAB/logs" >&2; "$HERE/env-down.sh" "$RUN" >&2 || true; exit $rc' ERR
source "$HERE/../env-lib.sh"
lab() { ( source "$KL/kl-lib.sh"; "$@" ); }   # kl_start/kl_stop with LAB=$RUN/lab
for b in kubelet kube-scheduler pause csi-node-driver-registrar csi-provisioner csi-attacher csi-resizer; do
  [[ -x $B/$b ]] || { echo "missing $B/$b" >&2; exit 2; }
done
[[ -x $RELAY_BIN ]] || { echo "missing csi-relay binary $RELAY_BIN (set RELAY_BIN)" >&2; exit 2; }
lab kl_alive kubelet && { echo "kubelet of $LAB already running; run env-down.sh $RUN first" >&2; exit 1; }
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

# ---- exec/logs: the host API server must present a client cert the kubelet trusts
apid=$(cat "$HOST_CLUSTER_PIDS_DIR/kube-apiserver.pid")
CLIENT_CRT=$(tr '\0' '\n' < /proc/$apid/cmdline | sed -n 's/^--kubelet-client-certificate=//p')
if [[ -z $CLIENT_CRT ]] || ! tr '\0' '\n' < /proc/$apid/cmdline | grep -qx -- '--kubelet-preferred-address-types=InternalIP'; then
  if [[ ${K8SE2E_NO_EXEC:-0} != 1 ]]; then
    echo "the host API server runs without --kubelet-client-certificate/--kubelet-preferred-address-types=InternalIP:" >&2
    echo "  kubectl exec/logs (which the e2e suite needs) cannot work. Restart the two-cluster env with" >&2
    echo "  export APISERVER_EXTRA=\"\$($HERE/apiserver-extra.sh $RUN/../pki)\"; $E2E_ENV/env-down.sh; $E2E_ENV/env-up.sh" >&2
    echo "  (or set K8SE2E_NO_EXEC=1 to go on without exec/logs)" >&2
    exit 2
  fi
fi
# The kubelet's x509 client CA bundle: the cluster CA and, when the API
# server's client cert is not signed by it, that cert's CA (apiserver-extra.sh
# keeps kubelet-client-ca.crt next to kubelet-client.crt).
HOST_CA=$E2E_HOME/run/host/pki/ca.crt
cat "$HOST_CA" > "$RUN/kubelet-client-ca-bundle.crt"
if [[ -n $CLIENT_CRT ]] && ! openssl verify -CAfile "$HOST_CA" "$CLIENT_CRT" > /dev/null 2>&1; then
  [[ -s $(dirname "$CLIENT_CRT")/kubelet-client-ca.crt ]] || { echo "no CA for $CLIENT_CRT" >&2; false; }
  cat "$(dirname "$CLIENT_CRT")/kubelet-client-ca.crt" >> "$RUN/kubelet-client-ca-bundle.crt"
fi

# ---- nodes: the fake host-node-1 gets nothing scheduled; scheduler; kubelet
kh taint node "$HOST_REAL_NODE" $FAKE_TAINT --overwrite > /dev/null
# The env's fake nodes have no kubelet: a CSINode of theirs is one an earlier
# test's registrar made (a relay's virtual-node registrar on vnode-member).
# The provisioner publishes capacity for every node listing the driver, and
# the capacity spec finds such an extra object: they go.
kh delete csinode "$HOST_REAL_NODE" "$HOST_VIRTUAL_NODE" --ignore-not-found > /dev/null
export BIN_DIR=$B
"$KL/kube-scheduler-up.sh" "$HOST_KUBECONFIG" $SCHED_PORT "$LAB" > "$RUN/logs/scheduler-up.log" 2>&1
node_up() {
  env CTRD_STATE=$KL_CTRD_STATE KUBELET_CLIENT_CA="$RUN/kubelet-client-ca-bundle.crt" \
    HTTPS_PROXY=$K8SE2E_PROXY HTTP_PROXY=$K8SE2E_PROXY https_proxy=$K8SE2E_PROXY http_proxy=$K8SE2E_PROXY \
    "$KL/kubelet-node-up.sh" "$HOST_KUBECONFIG" $KL_NODE $KL_PORT "$LAB" > "$RUN/logs/kubelet-node-up.log" 2>&1
}
node_up
source "$LAB/node.env"
# No node lifecycle controller in the env: lift the kubelet's not-ready taint.
kh taint node $KL_NODE node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
# The kubelet refuses --node-ip 127.0.0.1 and leaves the addresses alone.
kh patch node $KL_NODE --subresource=status --type=merge \
  -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"},{\"type\":\"Hostname\",\"address\":\"$KL_NODE\"}]}}" > /dev/null
ts "scheduler + kubelet node $KL_NODE Ready"

# ---- images (OCI tarballs named as the e2e suite asks for them)
snapshotter=$(sed -n 's/^ *snapshotter = "\(.*\)"/\1/p' "$LAB/containerd.toml" | head -1)
n=0
for f in "$IMAGES_DIR"/*.tar ${EXTRA_IMAGES_DIR:+"$EXTRA_IMAGES_DIR"/*.tar}; do
  [[ -e $f ]] || continue
  ctr -a "$KL_CONTAINERD_SOCK" -n k8s.io images import --snapshotter "${snapshotter:-overlayfs}" "$f" \
    >> "$RUN/logs/images-import.log" 2>&1
  n=$((n + 1))
done
ctr -a "$KL_CONTAINERD_SOCK" -n k8s.io images ls -q > "$RUN/logs/images.txt" 2>/dev/null || true
ts "imported $n image tarball(s) from $IMAGES_DIR ($(wc -l < "$RUN/logs/images.txt") image refs)"

# ---- snapshot CRDs + snapshot-controller (when built)
SNAP=0 GROUP_GATE=""
if [[ -x $B/csi-snapshotter && -x $B/snapshot-controller && -d $SNAPSHOT_CRDS ]]; then
  SNAP=1
  kh apply -f "$SNAPSHOT_CRDS" > /dev/null
  kh wait --for=condition=Established crd volumesnapshots.snapshot.storage.k8s.io \
    volumesnapshotclasses.snapshot.storage.k8s.io volumesnapshotcontents.snapshot.storage.k8s.io --timeout=60s > /dev/null
  # Group snapshots too (group-snapshots.sh): the gate on here and on the
  # relays' csi-snapshotters, its CRDs in snapshot-crds/.
  GROUP_GATE=--feature-gates=CSIVolumeGroupSnapshot=true
  lab kl_start snapshot-controller "$LAB/logs/snapshot-controller.log" "$B/snapshot-controller" \
    --kubeconfig="$HOST_KUBECONFIG" --leader-election=false -v=3 $GROUP_GATE
fi

# ---- csi-relay (local backend) + sidecars
SOCKDIR=$LAB/kubelet/plugins/$DRIVER; SOCK=$SOCKDIR/csi.sock
mkdir -p "$SOCKDIR" "$RUN/relay-state"
RUST_LOG=$RELAY_LOG lab kl_start csi-relay "$LAB/logs/csi-relay.log" "$RELAY_BIN" serve \
  --mode all --backend local --driver-name $DRIVER --node-id $KL_NODE \
  --max-volumes-per-node "$MAX_VOLUMES" --state-dir "$RUN/relay-state" --endpoint "unix://$SOCK" \
  --metrics-address "$RELAY_METRICS"
waitfor 30 "csi-relay socket $SOCK" test -S "$SOCK"
lab kl_start relay-registrar "$LAB/logs/relay-registrar.log" "$B/csi-node-driver-registrar" --csi-address="$SOCK" \
  --kubelet-registration-path="$SOCK" --plugin-registration-path="$KL_REGISTRATION_DIR" -v=3
SC=(--csi-address="$SOCK" --kubeconfig="$HOST_KUBECONFIG" --leader-election=false --timeout=60s -v=${SIDECAR_V:-3})
# CAPACITY=1 (default): storage capacity tracking (GetCapacity ->
# CSIStorageCapacity in kube-system, no owner; CSIDriver storageCapacity:
# true), so the scheduler checks WaitForFirstConsumer claims against it. (It
# was off until csi-relay accepted the provisioner's GetCapacity, whose access
# mode is UNKNOWN: with no objects the scheduler refused every such claim.)
CAP_ARGS=(); [[ ${CAPACITY:-1} == 1 ]] && CAP_ARGS=(--enable-capacity --capacity-for-immediate-binding --capacity-ownerref-level=-1 --capacity-poll-interval=15s)
NAMESPACE=kube-system lab kl_start relay-provisioner "$LAB/logs/relay-provisioner.log" "$B/csi-provisioner" "${SC[@]}" \
  --feature-gates=Topology=true --extra-create-metadata "${CAP_ARGS[@]}"
lab kl_start relay-attacher "$LAB/logs/relay-attacher.log" "$B/csi-attacher" "${SC[@]}"
# The resizer's gates as deploy/ gives them for this cluster's Kubernetes (tests/env-lib.sh).
RESIZER_GATES=$(sidecar_gates csi-resizer "$HOST_KUBECONFIG")
lab kl_start relay-resizer "$LAB/logs/relay-resizer.log" "$B/csi-resizer" "${SC[@]}" $RESIZER_GATES
((SNAP)) && lab kl_start relay-snapshotter "$LAB/logs/relay-snapshotter.log" "$B/csi-snapshotter" "${SC[@]}" $GROUP_GATE

# deploy/csidriver.yaml's spec (attach, pod info, fsGroup File, Persistent + Ephemeral) (+ storageCapacity with CAPACITY=1):
# the spec every e2e test installs (e2e_support::install_csidriver), since most of it is immutable.
cat > "$RUN/manifests/relay-local.yaml" <<YAML
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $DRIVER}
spec:
  attachRequired: true
  podInfoOnMount: true
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent, Ephemeral]
  storageCapacity: $([[ ${CAPACITY:-1} == 1 ]] && echo true || echo false)
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $CLASS}
provisioner: $DRIVER
volumeBindingMode: Immediate
reclaimPolicy: Delete
allowVolumeExpansion: true
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $CLASS_WFFC}
provisioner: $DRIVER
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
allowVolumeExpansion: true
YAML
if ((SNAP)); then cat >> "$RUN/manifests/relay-local.yaml" <<YAML
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: $SNAPCLASS}
driver: $DRIVER
deletionPolicy: Delete
YAML
fi
kh apply -f "$RUN/manifests/relay-local.yaml" > /dev/null
waitfor 60 "CSINode $KL_NODE with $DRIVER" \
  sh -c "[ \"\$(kubectl --kubeconfig '$HOST_KUBECONFIG' get csinode $KL_NODE -o jsonpath='{.spec.drivers[?(@.name==\"$DRIVER\")].nodeID}')\" = $KL_NODE ]"
ts "csi-relay $DRIVER registered on $KL_NODE (snapshots: $SNAP)"

# ---- part (b): member backend
if [[ $MEMBER == 1 ]]; then
  source "$HERE/member-up.inc.sh"
fi

cat > "$RUN/env.sh" <<ENV
export K8SE2E_RUN=$RUN
export K8SE2E_NODE=$KL_NODE
export K8SE2E_DRIVER=$DRIVER
export K8SE2E_RELAY_LOG=$LAB/logs/csi-relay.log
export K8SE2E_RELAY_STATE=$RUN/relay-state
export K8SE2E_CONTAINERD_SOCK=$KL_CONTAINERD_SOCK
export K8SE2E_KUBELET_ROOT=$KL_KUBELET_ROOT
export K8SE2E_SNAPSHOTS=$SNAP
export K8SE2E_MEMBER=$MEMBER
ENV
ts "k8s-e2e env up"
