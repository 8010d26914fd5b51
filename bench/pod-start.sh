#!/usr/bin/env bash
# pod-start.sh RUN_DIR local|member [relay-pod-start options]: time to a
# Running pod, side by side, on the real kubelet nodes of the Kubernetes
# suite's environment (tests/k8s-e2e/env-up.sh RUN_DIR, with MEMBER=1 for
# `member`; start it with RELAY_LOG=csi_relay=info, as a production driver
# logs). Builds nothing; needs target/release/relay-pod-start.
#   local:  csi-relay's local backend (relay-local) against csi-driver-host-path
#           as a second driver of the same node host-kl-1 (host-hostpath, added
#           here on first use, stopped by the env's env-down.sh).
#   member: a pod on host-kl-1 using a member volume (relay-member) against the
#           same pod run in the member itself, on member-kl-1 (kl-hostpath,
#           the storage behind relay-member).
#   kosmos: RUN_DIR is the Kosmos environment's (tests/kosmos/env-up.sh
#           RUN_DIR, on tests/e2e-env). Host pods on the virtual node
#           kosmos-member1, run by Kosmos on member-kl-1, all on member
#           storage kl-hostpath:
#             - Kosmos's own claim copy and PV sync (host class kl-hostpath,
#               the member's class name) under Kosmos's scheduler;
#             - csi-relay's Immediate class of deploy/storageclass.yaml under
#               Kosmos's scheduler;
#             - csi-relay's WaitForFirstConsumer class under the stock
#               kube-scheduler.
#           Starts (and stops on exit, by PID) a csi-relay controller for
#           member1 with the stock host sidecars, Kosmos's scheduler
#           ($E2E_HOME/bin/kosmos-scheduler, profile "kosmos-scheduler") and
#           a kube-scheduler; the host of tests/e2e-env has none.
# Extra options go to relay-pod-start (e.g. --pods 20 --parallel 1,10).
set -Eeuo pipefail
RUN=$(cd "${1:?usage: pod-start.sh RUN_DIR local|member [options]}" && pwd)
WHAT=${2:?usage: pod-start.sh RUN_DIR local|member [options]}
shift 2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/../tests/k8s-e2e/settings.sh"
BENCH=${BENCH:-$HERE/../target/release/relay-pod-start}
[[ -x $BENCH ]] || { echo "missing $BENCH: cargo build --release -p relay-bench" >&2; exit 2; }
IMAGE=${IMAGE:-localhost/pause:3.9}   # on every kubelet node of the env (kubelet-node-up.sh)
HOST_HOSTPATH=hostpath.host.csi.k8s.io
case $WHAT in
  local)
    if ! ( LAB=$RUN/lab; source "$KL/kl-lib.sh"; kl_alive csi-hostpath ); then
      DRIVER=$HOST_HOSTPATH CLASS=host-hostpath CSI_BIN_DIR=$E2E_HOME/bin HOSTPATH_V=2 \
        "$KL/csi-hostpath-up.sh" "$HOST_KUBECONFIG" "$KL_NODE" "$RUN/lab" >&2
    fi
    exec "$BENCH" --kubeconfig "$HOST_KUBECONFIG" --image "$IMAGE" --node "$KL_NODE" \
      --class "$CLASS" --class host-hostpath --metrics "$CLASS=http://$RELAY_METRICS/metrics" "$@" ;;
  member)
    exec "$BENCH" --kubeconfig "$HOST_KUBECONFIG" --image "$IMAGE" \
      --class "$MEMBER_CLASS@$KL_NODE" --class "$M_KL_CLASS@$M_KL_NODE@$MEMBER_KUBECONFIG" \
      --metrics "$MEMBER_CLASS=http://$MEMBER_METRICS/metrics" \
      --metrics "$MEMBER_CLASS=http://$MEMBER_NODE_METRICS/metrics" "$@" ;;
  kosmos)
    exec "$HERE/pod-start-kosmos.sh" "$RUN" "$@" ;;
  *) echo "pod-start.sh: say local, member or kosmos, not $WHAT" >&2; exit 2 ;;
esac
