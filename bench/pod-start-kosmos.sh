#!/usr/bin/env bash
# [LOAD=N] pod-start-kosmos.sh RUN_DIR [relay-pod-start options]: the Kosmos
# rows of pod-start.sh (see there), on the Kosmos environment of RUN_DIR
# (tests/kosmos/env-up.sh RUN_DIR). Everything it starts is recorded in
# RUN_DIR/bench/pids and stopped by PID when it ends, however it ends.
set -Eeuo pipefail
RUN=$(cd "${1:?usage: pod-start-kosmos.sh RUN_DIR [options]}" && pwd)
shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$REPO/tests/kosmos/settings.sh"
BENCH=${BENCH:-$REPO/target/release/relay-pod-start}
RELAY_BIN=$(readlink -f "${RELAY_BIN:-$REPO/target/release/csi-relay}")
IMAGE=${IMAGE:-localhost/pause:3.9}   # on every kubelet node of the env
VNODE=kosmos-member1
SCHED_PORT_STOCK=19471                # host kube-scheduler (healthz)
SCHED_PORT_KOSMOS=19472               # Kosmos's scheduler (healthz)
METRICS=127.0.0.1:19461               # the relay controller's /metrics
for b in "$BENCH" "$RELAY_BIN" "$E2E_HOME/bin/kosmos-scheduler" "$E2E_HOME/bin/kube-scheduler" \
  "$E2E_HOME/bin/csi-provisioner" "$E2E_HOME/bin/csi-attacher"; do
  [[ -x $b ]] || { echo "missing $b" >&2; exit 2; }
done
kh get node $VNODE > /dev/null || { echo "no node $VNODE: is the Kosmos env of $RUN up?" >&2; exit 2; }

LAB=$RUN/bench
mkdir -p "$LAB/pids" "$LAB/logs" "$LAB/relay"
lab() { ( source "$KL/kl-lib.sh"; "$@" ); }
stop() {
  local f
  for f in $(ls -t "$LAB"/pids/*.pid 2>/dev/null); do lab kl_stop "$(basename "$f" .pid)" 15 || true; done
  kh delete storageclass $KL_CLASS relay-member1 relay-member1-immediate --ignore-not-found > /dev/null 2>&1 || true
  # What Kosmos's flow leaves in the host: PVs Released for good, held by
  # the member attacher's finalizer it copied (see --released-ok).
  local pv
  for pv in $(kh get pv -o jsonpath="{range .items[?(@.spec.storageClassName=='$KL_CLASS')]}{.metadata.name} {.status.phase}{'\n'}{end}" 2>/dev/null | awk '$2 == "Released" {print $1}'); do
    kh patch pv "$pv" --type=merge -p '{"metadata":{"finalizers":null}}' > /dev/null 2>&1 || true
    kh delete pv "$pv" --ignore-not-found --wait=false > /dev/null 2>&1 || true
  done
}
trap stop EXIT

# The relay: deploy/'s CRD, CSIDriver and classes (member class: the
# member's kl-hostpath), a controller for member1 as its own member
# identity, registering the virtual nodes' topology, and the stock sidecars.
kh apply -f "$REPO/deploy/crds/relayvolume-crd.yaml" -f "$REPO/deploy/csidriver.yaml" > /dev/null
sed "s/memberStorageClass: standard/memberStorageClass: $KL_CLASS/" "$REPO/deploy/storageclass.yaml" | kh apply -f - > /dev/null
SOCK=$LAB/relay/csi.sock
RUST_LOG=${RELAY_LOG:-csi_relay=info} lab kl_start csi-relay "$LAB/logs/csi-relay.log" "$RELAY_BIN" serve \
  --mode controller --backend member --member "member1=$MEMBER_RELAY_KUBECONFIG" \
  --host-kubeconfig "$HOST_KUBECONFIG" --virtual-node-registrar --node-id bench-controller \
  --state-dir "$LAB/relay" --endpoint "unix://$SOCK" --metrics-address $METRICS
for ((i = 0; i < 100; i++)); do [[ -S $SOCK ]] && break; sleep 0.2; done
[[ -S $SOCK ]] || { echo "csi-relay made no socket; see $LAB/logs/csi-relay.log" >&2; exit 1; }
# The client rates of deploy/controller.yaml.
SC=(--csi-address="$SOCK" --kubeconfig="$HOST_KUBECONFIG" --leader-election=false --timeout=60s -v=3
  --kube-api-qps=20 --kube-api-burst=100)
lab kl_start relay-provisioner "$LAB/logs/relay-provisioner.log" "$E2E_HOME/bin/csi-provisioner" "${SC[@]}" \
  --feature-gates=Topology=true --extra-create-metadata
lab kl_start relay-attacher "$LAB/logs/relay-attacher.log" "$E2E_HOME/bin/csi-attacher" "${SC[@]}"

# Kosmos's flow: a host class of the member's class name, whose claims
# Kosmos copies into the member with the pod and whose PVs it syncs back.
# WaitForFirstConsumer: Kosmos's scheduler holds a pod whose Immediate
# claim is unbound, and nothing in the host binds this one; a claim to
# bind is left to the member on a Kosmos node.
cat <<YAML | kh apply -f - > /dev/null
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $KL_CLASS}
provisioner: $KL_DRIVER
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
YAML

# Kosmos's scheduler with the profile of its deploy/scheduler, under its own
# name so the stock one serves the WaitForFirstConsumer row beside it.
cat > "$LAB/kosmos-scheduler.yaml" <<YAML
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: $HOST_KUBECONFIG}
leaderElection: {leaderElect: false}
profiles:
  - schedulerName: kosmos-scheduler
    plugins:
      preFilter:
        disabled: [{name: VolumeBinding}]
        enabled: [{name: LeafNodeVolumeBinding}]
      filter:
        disabled: [{name: VolumeBinding}, {name: TaintToleration}]
        enabled: [{name: LeafNodeTaintToleration}, {name: LeafNodeVolumeBinding}, {name: LeafNodeDistribution}]
      score:
        disabled: [{name: VolumeBinding}]
      reserve:
        disabled: [{name: VolumeBinding}]
        enabled: [{name: LeafNodeVolumeBinding}]
      preBind:
        disabled: [{name: VolumeBinding}]
        enabled: [{name: LeafNodeVolumeBinding}]
    pluginConfig:
      - name: LeafNodeVolumeBinding
        args: {bindTimeoutSeconds: 5}
YAML
AUTH=(--authentication-kubeconfig="$HOST_KUBECONFIG" --authorization-kubeconfig="$HOST_KUBECONFIG" --bind-address=127.0.0.1)
lab kl_start kosmos-scheduler "$LAB/logs/kosmos-scheduler.log" "$E2E_HOME/bin/kosmos-scheduler" \
  --config="$LAB/kosmos-scheduler.yaml" "${AUTH[@]}" --secure-port=$SCHED_PORT_KOSMOS --v=2
lab kl_start kube-scheduler "$LAB/logs/kube-scheduler.log" "$E2E_HOME/bin/kube-scheduler" \
  --kubeconfig="$HOST_KUBECONFIG" "${AUTH[@]}" --leader-elect=false --secure-port=$SCHED_PORT_STOCK --v=2
for port in $SCHED_PORT_KOSMOS $SCHED_PORT_STOCK; do
  for ((i = 0; i < 120; i++)); do curl -skf "https://127.0.0.1:$port/healthz" > /dev/null 2>&1 && break; sleep 0.5; done
  curl -skf "https://127.0.0.1:$port/healthz" > /dev/null || { echo "scheduler on :$port not healthy; see $LAB/logs" >&2; exit 1; }
done
# The registrar's CSINode entry for the virtual node, which the stock
# scheduler's volume binding reads for the WaitForFirstConsumer row.
for ((i = 0; i < 120; i++)); do
  kh get csinode $VNODE -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null | grep -qw relay.csi.dev && break
  sleep 0.5
done

# LOAD=N: N busy loops beside everything (a node that is busy, as nodes
# are: one per core loads both), the same for every row since the rows
# take turns wave by wave; each ends by itself after LOAD_SECS, and the
# stop above ends it with the run.
for ((i = 0; i < ${LOAD:-0}; i++)); do
  lab kl_start "burner-$i" "$LAB/logs/burner.log" "$(command -v timeout)" "${LOAD_SECS:-3600}" \
    sh -c 'while :; do :; done'
done

"$BENCH" --kubeconfig "$HOST_KUBECONFIG" --image "$IMAGE" --tolerate-all \
  --class "$KL_CLASS@$VNODE" --class "relay-member1-immediate@$VNODE" --class "relay-member1@$VNODE" \
  --scheduler "$KL_CLASS=kosmos-scheduler" --scheduler "relay-member1-immediate=kosmos-scheduler" --released-ok "$KL_CLASS" \
  --metrics "relay-member1-immediate=http://$METRICS/metrics" --metrics "relay-member1=http://$METRICS/metrics" "$@"
