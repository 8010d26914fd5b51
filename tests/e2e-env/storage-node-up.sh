#!/usr/bin/env bash
# storage-node-up.sh KUBECONFIG NODE_NAME PORT SCHED_PORT LAB_DIR: makes a cluster able to run pods
# on real storage: a kube-scheduler (healthz on SCHED_PORT), a real kubelet node NODE_NAME
# (kubelet/kubelet-node-up.sh: https on PORT, healthz PORT+1), and csi-driver-host-path on it as
# driver DRIVER (node plugin registered through node-driver-registrar; provisioner, attacher and
# resizer against KUBECONFIG) with StorageClasses CLASS (Immediate) and CLASS-wffc. The
# cluster's fake nodes (FAKE_NODES, tainted FAKE_TAINT) get no scheduled pods. Binaries from
# BIN_DIR. Undo: kubelet/kubelet-node-down.sh LAB_DIR KUBECONFIG NODE_NAME (it stops the
# scheduler and the driver too), then delete the classes.
# Knobs: BIN_DIR [$E2E_HOME/bin], DRIVER [hostpath.kl.csi.k8s.io], CLASS [kl-hostpath],
#   FAKE_NODES [""], FAKE_TAINT [relay.csi.dev/e2e-fake-node=true:NoSchedule], and those of
#   kubelet-node-up.sh (CTRD_STATE, POD_LOG_DIR, KUBELET_CLIENT_CA, ...).
set -Eeuo pipefail
KC=${1:?usage: storage-node-up.sh KUBECONFIG NODE_NAME PORT SCHED_PORT LAB_DIR}
NODE=${2:?} PORT=${3:?} SCHED_PORT=${4:?} LAB=${5:?}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); KL=$HERE/kubelet
export BIN_DIR=${BIN_DIR:-${E2E_HOME:?set E2E_HOME}/bin} CSI_BIN_DIR=${BIN_DIR:-$E2E_HOME/bin}
DRIVER=${DRIVER:-hostpath.kl.csi.k8s.io} CLASS=${CLASS:-kl-hostpath}
FAKE_TAINT=${FAKE_TAINT:-relay.csi.dev/e2e-fake-node=true:NoSchedule}
k() { kubectl --kubeconfig "$KC" "$@"; }
mkdir -p "$LAB/logs"
for n in ${FAKE_NODES:-}; do k taint node "$n" "$FAKE_TAINT" --overwrite > /dev/null; done
"$KL/kube-scheduler-up.sh" "$KC" "$SCHED_PORT" "$LAB"
"$KL/kubelet-node-up.sh" "$KC" "$NODE" "$PORT" "$LAB"
# No node lifecycle controller runs in these clusters to lift the kubelet's not-ready taint.
k taint node "$NODE" node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
DRIVER=$DRIVER CLASS=$CLASS "$KL/csi-hostpath-up.sh" "$KC" "$NODE" "$LAB"
echo "storage node $NODE: scheduler :$SCHED_PORT, kubelet :$PORT, $DRIVER (classes $CLASS, $CLASS-wffc)"
