#!/usr/bin/env bash
# spare-member-up.sh RUN_DIR: one more member cluster beside the two-cluster
# environment (tests/e2e-env/env-up.sh), one a test may lose for good:
#   - control plane $SPARE_MEMBER on 127.0.0.1:$SPARE_PORT (etcd +1/+2,
#     controller-manager +3), kubeconfig $E2E_HOME/run/$SPARE_MEMBER.kubeconfig;
#   - a bare hostpath driver (hostpath.csi.k8s.io, node $SPARE_MEMBER-node-1,
#     no attach) with its provisioner, its CSIDriver and the StorageClass
#     "$SPARE_MEMBER-hostpath" (Immediate, Delete); the Node and CSINode
#     $SPARE_MEMBER-node-1 as the driver's registrar would leave them (no
#     kubelet): external-provisioner v5+ always asks for topology of a driver
#     that reports it, and refuses every claim ("no available topology
#     found") while no node lists the driver;
#   - deploy/member with its admission policy, and the relay's identity there as
#     $E2E_HOME/run/$SPARE_MEMBER-relay.kubeconfig (member-identity.sh).
# Processes recorded in RUN_DIR/$SPARE_MEMBER/pids, logs in RUN_DIR/logs.
# Starts binaries from $E2E_HOME/bin only. Undo with spare-member-down.sh
# RUN_DIR (run on any failure here too).
set -Eeuo pipefail
RUN=${1:?usage: SPARE_MEMBER=NAME SPARE_PORT=PORT spare-member-up.sh RUN_DIR}
NAME=${SPARE_MEMBER:?set SPARE_MEMBER} PORT=${SPARE_PORT:?set SPARE_PORT}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
mkdir -p "$RUN"; RUN=$(cd "$RUN" && pwd)
LAB_DIR=$RUN/$NAME
mkdir -p "$RUN/logs" "$LAB_DIR/pids"
trap 'rc=$?; echo "spare-member-up $NAME failed (rc=$rc) at line $LINENO; see $RUN/logs" >&2; "$HERE/spare-member-down.sh" "$RUN" >&2 || true; exit $rc' ERR
source "$HERE/../env-lib.sh"
for b in kube-apiserver kube-controller-manager hostpathplugin csi-provisioner; do
  [[ -x $E2E_HOME/bin/$b ]] || { echo "missing $E2E_HOME/bin/$b" >&2; exit 2; }
done
"$HERE/cluster-up.sh" "$NAME" "$PORT" > "$RUN/logs/cluster-up-$NAME.log" 2>&1 ||
  { tail -5 "$RUN/logs/cluster-up-$NAME.log" >&2; false; }
KC=$E2E_HOME/run/$NAME.kubeconfig
lab() { ( LAB=$LAB_DIR; source "$HERE/kubelet/kl-lib.sh"; "$@" ); }
lab kl_start hostpath "$RUN/logs/$NAME-hostpath.log" "$E2E_HOME/bin/hostpathplugin" \
  --endpoint "unix://$LAB_DIR/hostpath.sock" --nodeid "$NAME-node-1" --drivername hostpath.csi.k8s.io \
  --statedir "$LAB_DIR/state" -v=3
waitfor 30 "$NAME hostpath socket" test -S "$LAB_DIR/hostpath.sock"
lab kl_start csi-provisioner "$RUN/logs/$NAME-csi-provisioner.log" "$E2E_HOME/bin/csi-provisioner" \
  --csi-address="$LAB_DIR/hostpath.sock" --kubeconfig="$KC" --leader-election=false -v=3
kubectl --kubeconfig "$KC" apply -f - > /dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: hostpath.csi.k8s.io}
spec: {attachRequired: false, podInfoOnMount: false, volumeLifecycleModes: [Persistent]}
---
apiVersion: v1
kind: Node
metadata:
  name: $NAME-node-1
  labels: {kubernetes.io/hostname: $NAME-node-1, kubernetes.io/os: linux, topology.hostpath.csi/node: $NAME-node-1}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: $NAME-node-1}
spec:
  drivers:
  - {name: hostpath.csi.k8s.io, nodeID: $NAME-node-1, topologyKeys: [topology.hostpath.csi/node]}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $NAME-hostpath}
provisioner: hostpath.csi.k8s.io
volumeBindingMode: Immediate
reclaimPolicy: Delete
YAML
now=$(date -u +%FT%TZ)
kubectl --kubeconfig "$KC" patch node "$NAME-node-1" --subresource=status --type=merge -p \
  '{"status":{"conditions":[{"type":"Ready","status":"True","reason":"E2EFakeNode","message":"fake node (no kubelet)","lastHeartbeatTime":"'$now'","lastTransitionTime":"'$now'"}]}}' > /dev/null
waitfor 60 "$NAME default ServiceAccount" kubectl --kubeconfig "$KC" -n default get sa default
"$HERE/member-identity.sh" "$KC" "$E2E_HOME/run/$NAME-relay.kubeconfig" "$NAME" > "$RUN/logs/$NAME-identity.log" 2>&1 ||
  { cat "$RUN/logs/$NAME-identity.log" >&2; false; }
ts "$NAME: control plane :$PORT, hostpath.csi.k8s.io, class $NAME-hostpath"
