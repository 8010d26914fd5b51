# Names and ports of tests/kosmos/env-up.sh (sourced; see there).
E2E_ENV=$(cd "$(dirname "${BASH_SOURCE[0]}")/../e2e-env" && pwd)   # the two-cluster environment
KL=$E2E_ENV/kubelet                   # kubelet node scripts
KL_NODE=member-kl-1                   # real kubelet node in member1
KL_PORT=10350                         # its https port (+1: healthz)
SCHED_PORT=19447                      # member1 kube-scheduler
KOSMOS_PORT=10450                     # Kosmos cluster-manager's node server
KL_DRIVER=hostpath.kl.csi.k8s.io      # hostpath on member-kl-1 (the env's own hostpath keeps its name)
KL_CLASS=kl-hostpath                  # member1 class of that driver (Immediate)
MEMBER2_PORT=18443                    # member2 control plane: 18443-18446
M2_DRIVER=hostpath.csi.k8s.io
M2_CLASS=member2-hostpath
FAKE_TAINT=relay.csi.dev/e2e-fake-node=true:NoSchedule
kh() { kubectl --kubeconfig "$HOST_KUBECONFIG" "$@"; }
km() { kubectl --kubeconfig "$MEMBER_KUBECONFIG" "$@"; }
