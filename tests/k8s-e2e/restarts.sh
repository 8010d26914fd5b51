#!/usr/bin/env bash
# restarts.sh RUN_DIR : what a real kubelet node lives through, on the env
# tests/k8s-e2e/env-up.sh RUN_DIR brought up (local backend, host-kl-1):
#   1. csi-relay killed with SIGKILL while a pod writes to a filesystem
#      volume and another reads a raw block one: the pods keep running and
#      writing; csi-relay is started again with its own command line; a new
#      claim and pod work after it.
#   2. the kubelet killed with SIGKILL and started again: its volume
#      reconstruction finds csi-relay's mounts (the pods stay Running, their
#      data is there), and the pods' deletion unpublishes and unstages them.
#   3. teardown: every claim and PV goes, nothing of the volumes is left
#      mounted, looped or in csi-relay's state.
# Prints one line per check ("ok ..." / "FAIL ...") and exits 1 on any FAIL.
set -uo pipefail
RUN=${1:?usage: restarts.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
RUN=$(cd "$RUN" && pwd)
source "$RUN/env.sh"
LAB=$RUN/lab
source "$KL/kl-lib.sh"
NS=relay-restarts
# The suite's busybox, as the images imported at env-up name it.
IMAGE=$(awk '$1 ~ /e2e-test-images\/busybox:1\.36\.1-1$/ {print $1; exit}' "$E2E_HOME/images/images.txt")
[[ -n $IMAGE ]] || { echo "no e2e-test-images/busybox:1.36.1-1 in $E2E_HOME/images/images.txt" >&2; exit 2; }
source "$HERE/checks.inc.sh"
lines() { kn exec "$1" -- sh -c 'wc -l < /data/log' 2>/dev/null | tr -d ' '; }
grows() { # grows POD : the pod's log gains lines within 10 s
  local a b; a=$(lines "$1"); [[ -n $a ]] || return 1
  for ((i = 0; i < 50; i++)); do b=$(lines "$1"); [[ -n $b && $b -gt $a ]] && return 0; sleep 0.2; done
  return 1
}
source "$HERE/processes.inc.sh"
SIDECARS=(relay-registrar relay-provisioner relay-attacher relay-resizer relay-snapshotter)

claim_and_pod() { # claim_and_pod NAME SIZE fs|block COMMAND : a claim of the class and a pod using it
  local name=$1 size=$2 mode=$3 cmd=$4 use
  if [[ $mode == block ]]; then
    use="volumeDevices: [{name: v, devicePath: /dev/xvda}]"
  else
    use="volumeMounts: [{name: v, mountPath: /data}]"
  fi
  kn apply -f - > /dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $name}
spec: {accessModes: [ReadWriteOnce], volumeMode: $([[ $mode == block ]] && echo Block || echo Filesystem), storageClassName: $CLASS, resources: {requests: {storage: $size}}}
---
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  nodeName: $KL_NODE
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: c
    image: $IMAGE
    imagePullPolicy: IfNotPresent
    command: [sh, -c, '$cmd']
    $use
  volumes: [{name: v, persistentVolumeClaim: {claimName: $name}}]
YAML
}

kh create namespace $NS > /dev/null 2>&1
claim_and_pod writer 64Mi fs 'while true; do date >> /data/log; sleep 0.2; done'
claim_and_pod blockuser 32Mi block 'echo relay-block-data | dd of=/dev/xvda bs=512 conv=sync 2>/dev/null; sleep 100000'
if waitfor 90 running writer && waitfor 90 running blockuser; then
  ok "filesystem and raw block pods Running"
else
  fail "pods not Running: $(kn get pods -o wide 2>&1 | tail -n +2 | tr '\n' ';')"
fi
check "the writer's volume takes writes" grows writer
block_reads() { [[ $(kn exec blockuser -- sh -c 'dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -c 16') == relay-block-data ]]; }
check "the block device holds what was written" block_reads
PV_FS=$(kn get pvc writer -o jsonpath='{.spec.volumeName}')

# ---- 1. csi-relay SIGKILLed under running pods
save csi-relay 0
for ((k = 0; k < ${#SIDECARS[@]}; k++)); do kl_alive "${SIDECARS[$k]}" && save "${SIDECARS[$k]}" $((k + 1)); done
kill_hard csi-relay
check "pods keep running and writing while csi-relay is down" grows writer
start_saved csi-relay 0 "$LAB/logs/csi-relay.log"
SOCK=$LAB/kubelet/plugins/$DRIVER/csi.sock
if waitfor 30 test -S "$SOCK" && waitfor 30 kl_alive csi-relay; then ok "csi-relay started again"; else fail "csi-relay did not come back"; fi
# The stock sidecars exit when they find their connection to the driver
# lost, at their next call (a pod's restart policy starts them again): so
# does a supervisor here, until the end of this script.
supervise() {
  while sleep 0.5; do
    for ((k = 0; k < ${#SIDECARS[@]}; k++)); do
      n=${SIDECARS[$k]}
      [[ -n ${saved_argv[$((k + 1))]:-} ]] || continue
      kl_alive "$n" && continue
      echo "           $n exited (lost connection); started again"
      start_saved "$n" $((k + 1)) "$LAB/logs/$n.log"
    done
  done
}
supervise & SUPERVISOR=$!
trap 'kill $SUPERVISOR 2>/dev/null' EXIT
check "the writer still writes after csi-relay's restart" grows writer
check "the block device still reads back" block_reads
claim_and_pod after 16Mi fs 'echo after > /data/f; sleep 100000'
check "a new claim and pod run through the restarted csi-relay" waitfor 90 running after

# ---- 2. the kubelet SIGKILLed and started again
save kubelet 9
kill_hard kubelet
start_saved kubelet 9 "$LAB/logs/kubelet.log"
answers() { [[ $(curl -sf --max-time 2 "http://127.0.0.1:$((KL_PORT + 1))/healthz") == ok ]]; }
check "the kubelet is back and answers" waitfor 60 answers
# Its API port (exec, through the API server) opens after its health port.
serves_exec() { kn exec writer -- true; }
check "the new kubelet serves exec" waitfor 60 serves_exec
check "the writer survived the kubelet's restart and still writes" grows writer
check "the block pod still reads its device" block_reads
# The kubelet's staging and target paths carry the PV's name.
mounted_fs() { grep -q "$PV_FS" /proc/self/mountinfo; }
check "the filesystem volume is still mounted for the writer" mounted_fs

# ---- 3. teardown through the restarted kubelet
kn delete pod writer blockuser after --wait=false > /dev/null
gone() { [[ -z $(kn get pods -o name 2>/dev/null) ]]; }
check "the pods are deleted (NodeUnpublish/NodeUnstage through the new kubelet)" waitfor 90 gone
unmounted() { ! grep -q "$PV_FS" /proc/self/mountinfo; }
check "nothing of the volume stays mounted" waitfor 30 unmounted
kn delete pvc writer blockuser after --wait=false > /dev/null
no_pvs() { [[ -z $(kh get pv -o json | jq -r --arg ns $NS '.items[] | select(.spec.claimRef.namespace == $ns) | .metadata.name') ]]; }
check "the claims' PVs are deleted" waitfor 90 no_pvs
no_loops() { ! losetup -nl -O BACK-FILE | grep -qF "$RUN/relay-state/"; }
check "no loop device left on the relay's volumes" waitfor 30 no_loops
no_data() { [[ -z $(ls "$RUN/relay-state/volumes" 2>/dev/null) ]]; }
check "the relay's volumes directory is empty" waitfor 30 no_data
kh delete namespace $NS --wait=false > /dev/null 2>&1
echo "restarts: $fails failed check(s) in $(at)"
((fails == 0))
