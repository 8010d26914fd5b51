# lib.sh: names, ports and helpers of tests/deploy-kit/{up,check,down}.sh (sourced; needs RUN set).
# Everything here is overridable from the environment.
: "${E2E_HOME:?set E2E_HOME (bin/, images/: tests/e2e-env/README.md)}"; export E2E_HOME
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$KIT/../.." && pwd)
export PATH=$E2E_HOME/bin:$PATH
E2E_ENV=$REPO/tests/e2e-env                # cluster-up.sh, kubelet/
KL=$E2E_ENV/kubelet
HOST=${KIT_HOST:-deploykit}                 # host control plane: cluster-up.sh NAME
HOST_PORT=${KIT_HOST_PORT:-19443}           # .. its ports PORT..PORT+3
MEMBER=${KIT_MEMBER:-deploykit-member}      # member control plane (no kubelet: static hostPath PVs)
MEMBER_PORT=${KIT_MEMBER_PORT:-19453}
SCHED_PORT=${KIT_SCHED_PORT:-19467}
NODE=${KIT_NODE:-kit-node-1}
KL_PORT=${KIT_KUBELET_PORT:-10370}          # kubelet https; +1 healthz
CTRD_STATE=${KIT_CTRD_STATE:-/run/deploykit-containerd}
# The second host node, for the controller's second replica: a kubelet with its own containerd in
# a network namespace of its own (NETNS2), so its 127.0.0.1 is its own (the controller pod's
# liveness port 9808 there, as on node 1) and it can be frozen or lost alone. A forwarder gives it
# the two API servers on its loopback and the API server its kubelet port on the machine's.
# Tainted controller-only: no node plugin, no user pod.
NODE2=${KIT_NODE2:-kit-node-2}
KL_PORT2=${KIT_KUBELET_PORT2:-10372}        # kubelet https in NETNS2 and on 127.0.0.1 here; +1 healthz
CTRD_STATE2=${KIT_CTRD_STATE2:-/run/deploykit-containerd-2}
NETNS2=${KIT_NETNS2:-deploykit-node2}
CONTROLLER_ONLY=kit.relay.csi.dev/controller-only
MEMBER_NODE=member-node-1                   # the member node the host node stands for
MEMBER_PVS=${KIT_MEMBER_PVS:-100}          # static hostPath PVs of the member's class `standard`
MEMBER_NAME=member1                         # deploy/'s member name (--member member1=...)
CLASS=relay-member1                         # deploy/storageclass.yaml (WaitForFirstConsumer)
PULL_PROXY=http://127.0.0.1:9               # a closed port: a pull that should never happen fails at once
HELM=${KIT_HELM:-$E2E_HOME/bin/helm}         # KIT_INSTALL=helm: up.sh installs the chart with it
# The release lives in the controller's namespace, as README.md installs it (helm -n csi-relay):
# every helm command of the kit (up.sh, helm.sh, ha.sh, down.sh) takes it from here.
export HELM_NAMESPACE=csi-relay
HKC=$E2E_HOME/run/$HOST.kubeconfig
MKC=$E2E_HOME/run/$MEMBER.kubeconfig
LAB=$RUN/lab                                # kubelet-node-up.sh LAB_DIR
KUBELET_DIR=$LAB/kubelet                    # the kubelet's --root-dir: the kit's kubeletDir
LAB2=$RUN/lab2                              # node 2's LAB_DIR
USER_NS=kit-user
HA_NS=kit-ha                                # ha.sh's claims and pods
SNAP_NS=kit-snap                            # snapshot.sh's claims and snapshot
# The e2e suite's busybox, as $E2E_HOME/images/images.txt names it.
BUSYBOX_IMAGE=$(awk '$1 ~ /e2e-test-images\/busybox:1\.36\.1-1$/ {print $1; exit}' "$E2E_HOME/images/images.txt" 2>/dev/null)
kh() { kubectl --kubeconfig "$HKC" "$@"; }
km() { kubectl --kubeconfig "$MKC" "$@"; }
in2() { nsenter --net="/run/netns/$NETNS2" -- "$@"; }   # a command on node 2's network
T_START=${T_START:-$(date +%s.%N)}
ts() { printf '[%6.1fs] %s\n' "$(awk -v a="$T_START" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$*"; }
die() { echo "FAIL: $*" >&2; exit 1; }
waitfor() { # waitfor SECONDS WHAT CMD... : polls CMD every 0.5 s
  local t=$1 what=$2 i; shift 2
  for ((i=0;i<t*2;i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  echo "timeout (${t}s) waiting for $what" >&2; return 1
}
mounts_under() { # mount points at/under DIR, deepest first
  python3 - "$(readlink -m "$1")" <<'EOF'
import sys
r = sys.argv[1].rstrip('/')
pts = [l.split()[4] for l in open('/proc/self/mountinfo')]
for mp in reversed([p for p in pts if p == r or p.startswith(r + '/')]):
    print(mp)
EOF
}
