#!/usr/bin/env bash
# node-partition.sh RUN_DIR PHASE : the member relay's node plugin on the real
# kubelet node host-kl-1 while its way to the member API is black-holed, on
# the env tests/k8s-e2e/env-up.sh RUN_DIR brought up with MEMBER=1 and
# NODE_MEMBER_KUBECONFIG naming a fault proxy the caller cuts and heals
# (tests/suite/k8s_e2e.rs). The controller's way is not cut: attachment
# goes on, the node's calls meet the cut.
#   before : two claims of class relay-member bound; a pod on host-kl-1 with
#            the first: its apply-to-Running time (the member reachable).
#   during : (the caller has cut the node's member API) a pod with the
#            second claim: its apply-to-Running time, a file written, the pod
#            deleted (NodeUnpublish, NodeUnstage); the node plugin keeps
#            running; its NodeStage/NodePublish/NodeUnpublish/NodeUnstage
#            answer times from its log.
#   after  : (healed) a pod on the second claim again; everything deleted;
#            nothing left mounted, no PV left.
# Prints "ok"/"FAIL" per check and "figure:" lines; exits 1 on any FAIL.
set -uo pipefail
RUN=${1:?usage: node-partition.sh RUN_DIR before|during|after}
PHASE=${2:?usage: node-partition.sh RUN_DIR before|during|after}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
RUN=$(cd "$RUN" && pwd)
source "$RUN/env.sh"
LAB=$RUN/lab
source "$KL/kl-lib.sh"
NS=relay-partition
source "$HERE/checks.inc.sh"
IMAGE=$(awk '$1 ~ /e2e-test-images\/busybox:1\.36\.1-1$/ {print $1; exit}' "$E2E_HOME/images/images.txt")
[[ -n $IMAGE ]] || { echo "no e2e-test-images/busybox:1.36.1-1 in $E2E_HOME/images/images.txt" >&2; exit 2; }
NODE_LOG=$LAB/logs/member-relay-node.log
MARK=$RUN/node-partition.logline   # where in the node plugin's log a phase starts

claim() { # claim NAME
  kn apply -f - > /dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1}
spec: {accessModes: [ReadWriteOnce], storageClassName: $MEMBER_CLASS, resources: {requests: {storage: 16Mi}}}
YAML
}
pod() { # pod NAME CLAIM : a pod on host-kl-1 that writes a file to the claim
  kn apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  nodeSelector: {kubernetes.io/hostname: $KL_NODE}
  tolerations: [{operator: Exists}]
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: c
    image: $IMAGE
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'echo $1 > /data/$1 && sleep 100000']
    volumeMounts: [{name: v, mountPath: /data}]
  volumes: [{name: v, persistentVolumeClaim: {claimName: $2}}]
YAML
}
bound() { [[ $(kn get pvc "$1" -o jsonpath='{.status.phase}' 2>/dev/null) == Bound ]]; }
gone() { ! kn get pod "$1" > /dev/null 2>&1; }
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN{printf "%.1f", a-b}'; }
start_pod() { # start_pod NAME CLAIM WHEN : pod Running within 120 s, its time printed
  local t0; t0=$(now)
  pod "$1" "$2"
  if waitfor 120 running "$1"; then
    ok "pod $1 Running ($3)"; echo "figure: node partition: pod $1 apply to Running $(since "$t0") s ($3)"
  else
    fail "pod $1 not Running in 120 s ($3): $(kn get pod "$1" -o wide 2>&1 | tail -1)"
    kn describe pod "$1" 2>&1 | tail -5
  fi
}
stop_pod() { # stop_pod NAME WHEN : pod gone within 120 s (unpublish, unstage), its time printed
  local t0; t0=$(now)
  kn delete pod "$1" --wait=false > /dev/null
  if waitfor 120 gone "$1"; then
    ok "pod $1 deleted ($2)"; echo "figure: node partition: pod $1 delete to gone $(since "$t0") s ($2)"
  else
    fail "pod $1 not gone in 120 s ($2)"
  fi
}
calls_since_mark() { # the node plugin's answers logged since the phase began: "METHOD ms=N" or "METHOD code=C"
  tail -n +"$(cat "$MARK")" "$NODE_LOG" | sed 's/\x1b\[[0-9;]*m//g' |
    grep -E 'method="(NodeStageVolume|NodePublishVolume|NodeUnpublishVolume|NodeUnstageVolume)"' |
    sed -E 's/.*method="([A-Za-z]+)".*(ms=[0-9]+|code=[A-Za-z]+).*/\1 \2/' | tr '\n' ';'
}
mark() { echo $(($(wc -l < "$NODE_LOG") + 1)) > "$MARK"; }

case $PHASE in
before)
  kh create namespace $NS > /dev/null 2>&1
  claim first; claim second
  check "the first claim bound" waitfor 90 bound first
  check "the second claim bound" waitfor 90 bound second
  for c in first second; do kn get pvc $c -o jsonpath='{.spec.volumeName}{"\n"}'; done > "$RUN/node-partition.pvs"
  mark
  start_pod base first "member reachable"
  stop_pod base "member reachable"
  echo "figure: node partition: node plugin answers, member reachable: $(calls_since_mark)"
  ;;
during)
  mark
  start_pod cut second "node's member API black-holed"
  check "the pod wrote to its member volume" kn exec cut -- cat /data/cut
  stop_pod cut "node's member API black-holed"
  check "the member relay's node plugin kept running" kl_alive member-relay-node
  echo "figure: node partition: node plugin answers, member cut: $(calls_since_mark)"
  ;;
after)
  mark
  start_pod healed second "healed"
  check "the volume kept what the pod wrote during the cut" kn exec healed -- cat /data/cut
  stop_pod healed "healed"
  kn delete pvc first second --wait=false > /dev/null
  no_pvs() { [[ -z $(kh get pv -o json | jq -r --arg ns $NS '.items[] | select(.spec.claimRef.namespace == $ns) | .metadata.name') ]]; }
  check "the claims' PVs are deleted" waitfor 90 no_pvs
  unmounted() { ! grep -qFf "$RUN/node-partition.pvs" /proc/self/mountinfo; }
  check "nothing of the member volumes stays mounted on the node" waitfor 30 unmounted
  kh delete namespace $NS --wait=false > /dev/null 2>&1
  ;;
*) echo "unknown phase $PHASE" >&2; exit 2 ;;
esac
echo "node partition ($PHASE): $fails failed check(s) in $(at)"
((fails == 0))
