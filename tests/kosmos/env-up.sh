#!/usr/bin/env bash
# env-up.sh RUN_DIR: adds to the running two-cluster environment
# (tests/e2e-env/env-up.sh) what tests/suite/kosmos_e2e.rs needs:
#   - in member cluster "member" (Kosmos Cluster "member1"): a kube-scheduler
#     and a real kubelet node "member-kl-1" with its own containerd, running the
#     hostpath CSI driver under the name hostpath.kl.csi.k8s.io (node plugin
#     registered through node-driver-registrar, provisioner, attacher,
#     resizer) and its StorageClass "kl-hostpath";
#   - a second member control plane "member2" (ports 18443-18446, no kubelet)
#     with a bare hostpath driver and its StorageClass "member2-hostpath";
#   - Kosmos: its CRDs in the host, a Cluster object per member and the real
#     clustertree-cluster-manager, which makes virtual nodes kosmos-member1 and
#     kosmos-member2 in the host;
#   - a pod network the members' kubelet nodes share (a network namespace
#     "relay-podnet-<run>" with a bridge, POD_NETWORK of kubelet-node-up.sh):
#     their pods reach each other as ClusterLink's or Liqo's would, and
#     nothing else (shared-up.sh puts member2's kubelet on it too).
# Writes RUN_DIR/env.sh (sourced by the test's caller). Starts binaries from
# $E2E_HOME/bin only; builds nothing. Undo with env-down.sh RUN_DIR (run on
# any failure here too).
set -Eeuo pipefail
RUN=${1:?usage: env-up.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
mkdir -p "$RUN"; RUN=$(cd "$RUN" && pwd)
mkdir -p "$RUN/logs" "$RUN/hostlab/pids" "$RUN/member2/pids" "$RUN/manifests"
trap 'rc=$?; echo "kosmos env-up failed (rc=$rc) at line $LINENO; see $RUN/logs" >&2; "$HERE/env-down.sh" "$RUN" >&2 || true; exit $rc' ERR
source "$HERE/../env-lib.sh"
for b in kubelet kube-scheduler pause hostpathplugin csi-node-driver-registrar csi-provisioner csi-attacher csi-resizer clustertree-cluster-manager; do
  [[ -x $E2E_HOME/bin/$b ]] || { echo "missing $E2E_HOME/bin/$b" >&2; exit 2; }
done
[[ -d $E2E_HOME/kosmos-crds ]] || { echo "missing $E2E_HOME/kosmos-crds (Kosmos deploy/crds)" >&2; exit 2; }

# member2: its control plane and bare hostpath, in the background while
# member1's node starts.
SPARE_MEMBER=member2 SPARE_PORT=$MEMBER2_PORT "$E2E_ENV/spare-member-up.sh" "$RUN" \
  > "$RUN/logs/spare-member-up-member2.log" 2>&1 &
m2=$!

# The members' pod network (RUN/podnet names it for shared-up.sh and
# env-down.sh).
PODNET=relay-podnet-${RUN##*-}
ip netns add "$PODNET"
echo "$PODNET" > "$RUN/podnet"

# member1: a scheduler and a real kubelet node with hostpath; the fake
# member-node-1 of the two-cluster env gets no scheduled pods (Kosmos clears a
# mirrored pod's nodeName, the member scheduler places it).
# The member API server reaches it on 127.0.0.1 (port-forward to the relay's
# movers) with APISERVER_EXTRA's client cert.
POD_NETWORK=$PODNET FAKE_NODES=member-node-1 FAKE_TAINT=$FAKE_TAINT DRIVER=$KL_DRIVER CLASS=$KL_CLASS \
  KUBELET_CLIENT_CA=$(kubelet_client_ca "$E2E_HOME/run/member/pki/ca.crt" "$RUN/member1-kubelet-client-ca.crt") \
  "$E2E_ENV/storage-node-up.sh" "$MEMBER_KUBECONFIG" $KL_NODE $KL_PORT $SCHED_PORT "$RUN/lab" > "$RUN/logs/storage-node-up.log" 2>&1
node_on_loopback "$MEMBER_KUBECONFIG" $KL_NODE
ts "member1: scheduler, kubelet node $KL_NODE with $KL_DRIVER, class $KL_CLASS"

wait $m2 || { tail -5 "$RUN/logs/spare-member-up-member2.log" >&2; false; }
M2KC=$E2E_HOME/run/member2.kubeconfig
ts "member2: control plane, $M2_DRIVER, class $M2_CLASS"

# Kosmos.
kh apply -f "$E2E_HOME/kosmos-crds/" -f "$E2E_HOME/kosmos-crds/mcs/" > /dev/null
kh wait --for=condition=Established crd --all --timeout=60s > /dev/null
# A Cluster an interrupted run left (its finalizer, with no cluster-manager
# to remove it) would keep the new one from being made.
for c in member1 member2; do
  kh patch clusters.kosmos.io $c --type=merge -p '{"metadata":{"finalizers":null}}' > /dev/null 2>&1 || true
done
kh delete clusters.kosmos.io member1 member2 --ignore-not-found --timeout=30s > /dev/null
for m in member1:$MEMBER_KUBECONFIG member2:$M2KC; do
  cat > "$RUN/manifests/cluster-${m%%:*}.yaml" <<YAML
apiVersion: kosmos.io/v1alpha1
kind: Cluster
metadata: {name: ${m%%:*}}
spec:
  kubeconfig: $(base64 -w0 "${m#*:}")
  clusterLinkOptions: {}
  clusterTreeOptions: {enable: true}
YAML
  kh apply -f "$RUN/manifests/cluster-${m%%:*}.yaml" > /dev/null
done
# LEAF_NODE_IP: the first address Kosmos gives its nodes. Not of type
# InternalIP: Kosmos appends the member nodes' InternalIPs (127.0.0.1 too),
# and a duplicate fails every node status update.
( LAB=$RUN/hostlab; source "$KL/kl-lib.sh"
  kl_start cluster-manager "$RUN/logs/cluster-manager.log" /usr/bin/env LEAF_NODE_IP=127.0.0.1 \
    "$E2E_HOME/bin/clustertree-cluster-manager" --kubeconfig="$HOST_KUBECONFIG" --leader-elect=false \
    --listen-port=$KOSMOS_PORT -v=3 )
waitfor 90 "Kosmos nodes kosmos-member1 and kosmos-member2" kh get node kosmos-member1 kosmos-member2
ts "Kosmos: nodes kosmos-member1, kosmos-member2"

cat > "$RUN/env.sh" <<ENV
export RELAY_KOSMOS_RUN=$RUN
export RELAY_KOSMOS_MEMBER2_KUBECONFIG=$M2KC
export RELAY_KOSMOS_KL_STATE=$RUN/lab/csi/hostpath-state
export RELAY_KOSMOS_POD_NETWORK=$PODNET
ENV
ts "kosmos env up"
