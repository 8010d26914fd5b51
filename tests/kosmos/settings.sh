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
# The seed's demo (demo-up.sh): member1's non-CSI classes, a host kubelet node standing for member-kl-1.
OPENEBS_CLASS=openebs-hostpath        # openebs dynamic-localpv-provisioner (local PVs)
LOCAL_PATH_CLASS=local-path           # rancher local-path-provisioner (hostPath PVs)
LOCAL_PATH_HEALTH_PORT=19478          # its health port (its default, 8080, is too common)
DEMO_NODE=demo-kl-1                   # real kubelet node in the HOST cluster, mapped to member1/member-kl-1
DEMO_KL_PORT=10370                    # its https port (+1: healthz)
DEMO_SCHED_PORT=19477                 # host kube-scheduler
DEMO_CTRD_STATE=/run/kosmos-demo-containerd
