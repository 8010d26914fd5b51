#!/bin/bash
# check.sh RUN_DIR: what a user of the kit installed by up.sh RUN_DIR sees.
#   1. livenessprobe answers /healthz (node :9809, controller :9808), on 127.0.0.1 only; the
#      controller runs in csi-relay, which enforces the "restricted" Pod Security Standard;
#   2. a PVC of deploy/'s class relay-member1 + a busybox pod: Running, writing; the data lands
#      in the member PV's directory; RelayVolume PUBLISHED;
#   3. the node plugin's csi-relay container killed (SIGKILL through containerd; the kubelet
#      restarts it): the running pod still reads and writes its volume, and a new PVC + pod works;
#   3b. `csi-relay check` in the controller's container: exit 0 on this healthy install; then each
#      kind of problem put in on purpose (an unmapped node, a class whose member class is missing,
#      a volume whose create fails, an old CRD, a right beyond the matrix, a member claim deleted
#      under a running pod), each named with exit 1;
#   4. the user objects deleted: pods gone, host PVs, VolumeAttachments, RelayVolumes and member
#      PVCs gone, nothing of theirs mounted.
# Prints PASS/FAIL per step with timings; exit 1 on the first failure.
set -Eeuo pipefail
RUN=${1:?usage: check.sh RUN_DIR}
RUN=$(cd "$RUN" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$LAB/node.env"
exec > >(tee -a "$RUN/logs/check.log") 2>&1
T_START=$(date +%s.%N)
ts "check.sh $RUN"
ku() { kh -n "$USER_NS" "$@"; }
lap() { T_LAP=$(date +%s.%N); }
since() { awk -v a="$T_LAP" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1fs", b-a}'; }
pass() { ts "PASS: $*"; }
trap 'ts "FAIL at line $LINENO: $BASH_COMMAND"; kh get pods -A -o wide; kh get pvc,pv,volumeattachment -A 2>/dev/null; kh get relayvolumes 2>/dev/null' ERR

# ---------- 1. livenessprobe ----------
for p in 9809 9808; do
  [[ "$(curl -sf --max-time 5 "http://127.0.0.1:$p/healthz")" == ok ]] || die "http://127.0.0.1:$p/healthz"
  addrs=$(ss -Hltn "sport = :$p" | awk '{print $4}' | sort -u | tr '\n' ' ')
  [[ $addrs == "127.0.0.1:$p " ]] || die "port $p listens on: $addrs"
done
# Node 2's controller replica (a standby, or the leader): its liveness port on node 2's loopback.
[[ "$(in2 curl -sf --max-time 5 "http://127.0.0.1:9808/healthz")" == ok ]] || die "node 2: http://127.0.0.1:9808/healthz"
pass "livenessprobe /healthz ok on 127.0.0.1:9809 (node) and 127.0.0.1:9808 (controller, on both nodes), bound to 127.0.0.1 only"

# ---------- 1b. Pod Security: the controller's namespace enforces "restricted" ----------
[[ "$(kh get ns csi-relay -o jsonpath='{.metadata.labels.pod-security\.kubernetes\.io/enforce}')" == restricted ]] \
  || die "namespace csi-relay does not enforce restricted"
CP=$(kh -n csi-relay get pods -l app=csi-relay-controller -o jsonpath='{.items[0].metadata.name}')
[[ "$(kh -n csi-relay get pod "$CP" -o jsonpath='{.spec.hostNetwork}')" != true ]] || die "controller on hostNetwork"
refusal=$(kh -n csi-relay run pss-probe --image="$BUSYBOX_IMAGE" --dry-run=server --privileged 2>&1) \
  && die "a privileged pod was admitted into csi-relay"
grep -q 'violates PodSecurity "restricted' <<< "$refusal" || die "unexpected refusal: $refusal"
pass "controller pod $CP admitted into csi-relay, which enforces restricted (a privileged pod there: refused); node plugin in csi-relay-node (privileged)"

# ---------- 2. a user's PVC + pod ----------
kh create ns "$USER_NS" > /dev/null 2>&1 || true
waitfor 30 "default ServiceAccount in $USER_NS" kh -n "$USER_NS" get sa default
user_objs() { # user_objs N: PVC data-N + pod writer-N
  cat <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: data-$1, namespace: $USER_NS }
spec:
  storageClassName: $CLASS
  accessModes: [ReadWriteOnce]
  resources: { requests: { storage: 64Mi } }
---
apiVersion: v1
kind: Pod
metadata: { name: writer-$1, namespace: $USER_NS }
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: writer
      image: $BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["sh", "-c", "echo written-by-writer-$1 > /data/hello && sync && exec sleep 100000"]
      volumeMounts: [{ name: data, mountPath: /data }]
  volumes:
    - name: data
      persistentVolumeClaim: { claimName: data-$1 }
EOF
}
member_dir() { # the member PV directory behind host PVC data-N
  local pv mpvc mpv
  pv=$(ku get pvc "data-$1" -o jsonpath='{.spec.volumeName}')
  mpvc=$(kh get relayvolume -o jsonpath="{.items[?(@.spec.volumeName==\"$pv\")].spec.memberPvc}")
  mpv=$(km -n "${mpvc%%/*}" get pvc "${mpvc##*/}" -o jsonpath='{.spec.volumeName}')
  km get pv "$mpv" -o jsonpath='{.spec.hostPath.path}'
}
run_user() { # run_user N: create, wait Running, check the data
  lap
  user_objs "$1" | kh apply -f - > /dev/null
  ku wait --for=condition=Ready "pod/writer-$1" --timeout=120s > /dev/null
  local t_run; t_run=$(since)
  [[ "$(ku exec "writer-$1" -- cat /data/hello)" == "written-by-writer-$1" ]]
  local d; d=$(member_dir "$1")
  [[ "$(cat "$d/hello")" == "written-by-writer-$1" ]] || die "data-$1: not in the member PV directory $d"
  local pv; pv=$(ku get pvc "data-$1" -o jsonpath='{.spec.volumeName}')
  waitfor 30 "RelayVolume of $pv PUBLISHED" sh -c \
    "[ \"\$(kubectl --kubeconfig '$HKC' get relayvolumes -o jsonpath='{.items[?(@.spec.volumeName==\"$pv\")].status.phase}')\" = PUBLISHED ]"
  pass "PVC data-$1 + pod writer-$1 Running in $t_run (apply -> Ready); the pod's file is in member PV dir $d; RelayVolume PUBLISHED ($(kh get relayvolumes -o jsonpath="{.items[?(@.spec.volumeName==\"$pv\")].status.nodeSummary}"))"
}
run_user 1
kh get relayvolumes

# ---------- 3. node plugin container restart ----------
NP=$(kh -n csi-relay-node get pods -l app=csi-relay-node -o jsonpath='{.items[0].metadata.name}')
cs() { kh -n csi-relay-node get pod "$NP" -o jsonpath="{.status.containerStatuses[?(@.name==\"csi-relay\")].$1}"; }
restarts0=$(cs restartCount); cid=$(cs containerID); cid=${cid#containerd://}
lap
ctr -a "$KL_CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "$cid"
waitfor 120 "csi-relay container of $NP restarted" sh -c \
  "[ \"\$(kubectl --kubeconfig '$HKC' -n csi-relay-node get pod $NP -o jsonpath='{.status.containerStatuses[?(@.name==\"csi-relay\")].restartCount}')\" -gt $restarts0 ]"
kh -n csi-relay-node wait --for=condition=Ready "pod/$NP" --timeout=120s > /dev/null
waitfor 30 "node healthz after restart" sh -c '[ "$(curl -sf --max-time 5 http://127.0.0.1:9809/healthz)" = ok ]'
pass "node plugin container killed (SIGKILL, task $cid): restarted by the kubelet (restartCount $restarts0 -> $(cs restartCount)), pod Ready again in $(since)"
ku exec writer-1 -- sh -c 'echo after-restart > /data/after && sync && cat /data/hello /data/after' > "$RUN/logs/after-restart.txt"
[[ "$(cat "$RUN/logs/after-restart.txt")" == $'written-by-writer-1\nafter-restart' ]] || die "writer-1 after restart: $(cat "$RUN/logs/after-restart.txt")"
[[ "$(cat "$(member_dir 1)/after")" == after-restart ]] || die "writer-1's write after the restart is not in its member PV dir"
pass "writer-1 still reads and writes its volume after the node plugin restart (file in the member PV dir too)"
run_user 2

# ---------- 3b. csi-relay check: healthy, then each kind of problem put in on purpose ----------
# Run where an operator runs it: in the controller's container, with its own identities.
relay_check() { # relay_check [ARGS...]: the JSON report in $RUN/logs/check-N.json; returns its exit status
  CHECKS=$(( ${CHECKS:-0} + 1 ))
  local rc=0
  kh -n csi-relay exec deploy/csi-relay-controller -c csi-relay -- /usr/local/bin/csi-relay check \
    --member "$MEMBER_NAME=/etc/csi-relay/members/$MEMBER_NAME" --output json "$@" > "$RUN/logs/check-$CHECKS.json" || rc=$?
  return $rc
}
finding() { # finding KIND SUBJECT TEXT: the last report has a problem of that kind and subject whose message has TEXT
  jq -e --arg k "$1" --arg s "$2" --arg t "$3" \
    '[.findings[] | select(.status == "problem" and .kind == $k and .subject == $s and (.message | contains($t)))] | length > 0' \
    "$RUN/logs/check-$CHECKS.json" > /dev/null || { cat "$RUN/logs/check-$CHECKS.json"; die "check: no $1 problem for $2 with \"$3\""; }
}
planted() { # planted WHAT KIND SUBJECT TEXT [ARGS...]: check exits 1 and names it
  local what=$1 kind=$2 subject=$3 text=$4 rc=0; shift 4
  relay_check "$@" || rc=$?
  [[ $rc == 1 ]] || { cat "$RUN/logs/check-$CHECKS.json"; die "check with $what: exit $rc, want 1"; }
  finding "$kind" "$subject" "$text"
  pass "csi-relay check names $what: $(jq -r --arg k "$kind" --arg s "$subject" '[.findings[] | select(.status == "problem" and .kind == $k and .subject == $s)][0] | .message + " | fix: " + .fix' "$RUN/logs/check-$CHECKS.json" | cut -c1-240)"
}
lap
rc=0; relay_check || rc=$?
[[ $rc == 0 ]] || { cat "$RUN/logs/check-$CHECKS.json"; die "csi-relay check on the healthy install: exit $rc"; }
pass "csi-relay check on the healthy install (2 pods running): exit 0, $(jq '.findings | length' "$RUN/logs/check-$CHECKS.json") findings, 0 problems, in $(since)"
kh -n csi-relay exec deploy/csi-relay-controller -c csi-relay -- /usr/local/bin/csi-relay check \
  --member "$MEMBER_NAME=/etc/csi-relay/members/$MEMBER_NAME" > "$RUN/logs/check-healthy.txt"

# A node where the node plugin registered that maps to no member (kept off the DaemonSet).
kh apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Node
metadata: { name: kit-unmapped, labels: { type: virtual-kubelet } }
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: { name: kit-unmapped }
spec:
  drivers: [{ name: relay.csi.dev, nodeID: kit-unmapped }]
YAML
planted "an unmapped node" node "node kit-unmapped" "maps to no member cluster"
kh delete csinode kit-unmapped > /dev/null; kh delete node kit-unmapped > /dev/null

# A class whose member class does not exist.
kh apply -f - > /dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: { name: kit-broken }
provisioner: relay.csi.dev
volumeBindingMode: Immediate
parameters: { member: $MEMBER_NAME, memberStorageClass: no-such-class }
YAML
planted "a class whose member class is missing" class "StorageClass kit-broken" 'has no StorageClass "no-such-class"'

# A claim of it: its create fails, and its RelayVolume says why.
kh apply -f - > /dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: broken, namespace: $USER_NS }
spec:
  storageClassName: kit-broken
  accessModes: [ReadWriteOnce]
  resources: { requests: { storage: 64Mi } }
YAML
waitfor 60 "a RelayVolume with a LAST-ERROR" sh -c \
  "kubectl --kubeconfig '$HKC' get relayvolumes -o jsonpath='{.items[*].status.lastError}' | grep -q no-such-class"
BROKEN=$(kh get relayvolumes -o jsonpath='{range .items[?(@.status.lastError)]}{.spec.volumeId}{end}')
planted "a volume whose create fails" volume "volume $BROKEN" "LAST-ERROR" --stuck-after 0
finding volume "volume $BROKEN" "PROVISIONING for"
ku delete pvc broken --wait=true --timeout=60s > /dev/null
kh delete storageclass kit-broken > /dev/null
waitfor 60 "the broken claim's RelayVolume gone" sh -c \
  "[ -z \"\$(kubectl --kubeconfig '$HKC' get relayvolumes -o jsonpath='{.items[?(@.spec.volumeId==\"$BROKEN\")].metadata.name}')\" ]"

# A CRD older than the build: without a field it writes.
kh get crd relayvolumes.relay.csi.dev -o json \
  | jq 'del(.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.formatVersion) | del(.metadata.resourceVersion, .metadata.uid, .metadata.managedFields, .metadata.creationTimestamp, .metadata.generation, .status)' \
  > "$RUN/logs/old-crd.json"
kh replace -f "$RUN/logs/old-crd.json" > /dev/null
planted "an old CRD" crd "relayvolumes.relay.csi.dev" "older than this build"
kh replace -f "$REPO/deploy/crds/relayvolume-crd.yaml" > /dev/null
relay_check > /dev/null || true
jq -e '[.findings[] | select(.kind == "crd" and .status == "ok")] | length == 1' "$RUN/logs/check-$CHECKS.json" > /dev/null \
  || { cat "$RUN/logs/check-$CHECKS.json"; die "the CRD put back is not ok"; }

# A right beyond the matrix, in the member.
km create clusterrolebinding kit-extra --clusterrole=view --serviceaccount=csi-relay:csi-relay-member > /dev/null
planted "a right beyond the matrix" access "member cluster $MEMBER_NAME" "beyond what docs/security.md gives"
km delete clusterrolebinding kit-extra > /dev/null

# A member claim deleted under a running pod (step 4 needs the member dirs: read them first).
KIT_MDIRS="$(member_dir 1) $(member_dir 2)"
GONE=$(ku get pvc data-1 -o jsonpath='{.spec.volumeName}')
GONE_ID=$(kh get relayvolume -o jsonpath="{.items[?(@.spec.volumeName==\"$GONE\")].spec.volumeId}")
GONE_PVC=$(kh get relayvolume -o jsonpath="{.items[?(@.spec.volumeName==\"$GONE\")].spec.memberPvc}")
km -n "${GONE_PVC%%/*}" delete pvc "${GONE_PVC##*/}" --wait=true --timeout=30s > /dev/null
planted "a member claim deleted under a running pod" volume "volume $GONE_ID" "is gone from member"

# ---------- 4. delete the user's objects ----------
lap
mdirs=${KIT_MDIRS:-"$(member_dir 1) $(member_dir 2)"}
pvs=$(ku get pvc -o jsonpath='{.items[*].spec.volumeName}')
ku delete pods --all --wait=true --timeout=90s > /dev/null
t_pods=$(since)
ku delete pvc --all --wait=true --timeout=90s > /dev/null
for pv in $pvs; do waitfor 90 "PV $pv deleted" sh -c "! kubectl --kubeconfig '$HKC' get pv $pv"; done
waitfor 60 "VolumeAttachments gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$HKC' get volumeattachment -o name)\" ]"
waitfor 60 "RelayVolumes gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$HKC' get relayvolumes -o name)\" ]"
waitfor 60 "member PVCs gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$MKC' get pvc -A -o name)\" ]"
left=$(for d in $mdirs; do grep -F " $d " /proc/self/mountinfo || true; done
       mounts_under "$KUBELET_DIR/pods" | grep -F kubernetes.io~csi || true
       mounts_under "$KUBELET_DIR/plugins/kubernetes.io/csi" || true)
[[ -z $left ]] || die "still mounted: $left"
pass "user objects deleted: pods gone in $t_pods, host PVs ($pvs), VolumeAttachments, RelayVolumes and member PVCs gone, nothing mounted ($(since) in all); member PVs: $(km get pv -o jsonpath='{range .items[*]}{.metadata.name}={.status.phase} {end}')"
kh -n csi-relay get pods; kh -n csi-relay-node get pods
ts "check.sh: ALL PASS"
