# Names and ports of tests/k8s-e2e/env-up.sh (sourced; see there).
E2E_ENV=$(cd "$(dirname "${BASH_SOURCE[0]}")/../e2e-env" && pwd)   # the two-cluster environment
KL=$E2E_ENV/kubelet                   # kubelet node scripts
KL_NODE=host-kl-1                     # real kubelet node in the HOST cluster
KL_PORT=10360                         # its https port (+1: healthz); tests/kosmos uses 10350
SCHED_PORT=19457                      # host kube-scheduler (https healthz, 127.0.0.1)
RELAY_METRICS=127.0.0.1:19461         # /metrics of the local csi-relay (bench/: relay-pod-start --metrics)
MEMBER_METRICS=127.0.0.1:19462        # and of the member csi-relay's controller (the node plugin: :19463)
MEMBER_NODE_METRICS=127.0.0.1:19463
KL_CTRD_STATE=/run/k8se2e-containerd  # its containerd's state dir (short: sockets live there)
DRIVER=relay.csi.dev                  # csi-relay, local backend
MEMBER_DRIVER=member.relay.csi.dev    # csi-relay, member backend (part b)
CLASS=relay-local                     # StorageClass of DRIVER (Immediate)
CLASS_WFFC=relay-local-wffc           # same, WaitForFirstConsumer
MEMBER_CLASS=relay-member             # StorageClass of MEMBER_DRIVER
SNAPCLASS=relay-local-snap            # VolumeSnapshotClass of DRIVER
MEMBER_SNAPCLASS=relay-member-snap    # VolumeSnapshotClass of MEMBER_DRIVER (memberSnapshotClass: M_KL_SNAPCLASS)
FAKE_TAINT=relay.csi.dev/e2e-fake-node=true:NoSchedule   # on the env's fake host-node-1 (and member-node-1 with MEMBER=1)
# Part (b), MEMBER=1: the member cluster's own kubelet node, whose hostpath is the member storage.
M_KL_NODE=member-kl-1                 # real kubelet node in the MEMBER cluster
M_KL_PORT=10364                       # its https port (+1: healthz)
M_SCHED_PORT=19458                    # member kube-scheduler
M_KL_CTRD_STATE=/run/k8se2e-m-containerd
M_KL_DRIVER=hostpath.kl.csi.k8s.io    # csi-driver-host-path on member-kl-1
M_KL_CLASS=kl-hostpath                # its member StorageClass (Immediate)
M_KL_SNAPCLASS=kl-hostpath-snap       # its member VolumeSnapshotClass
M_KL_GROUPCLASS=kl-hostpath-group     # its member VolumeGroupSnapshotClass (the default of M_KL_DRIVER)
# Pulls must never leave the machine: every image is imported, and the
# kubelet's containerd (and e2e.test) get a proxy on a closed loopback port,
# so a pull of a missing image fails at once instead of reaching out.
K8SE2E_PROXY=http://127.0.0.1:9
kh() { kubectl --kubeconfig "$HOST_KUBECONFIG" "$@"; }
km() { kubectl --kubeconfig "$MEMBER_KUBECONFIG" "$@"; }
