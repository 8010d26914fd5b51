#!/usr/bin/env bash
# group-snapshots.sh RUN_DIR [local|member] : a VolumeGroupSnapshot of two
# claims through the stock snapshot-controller and csi-snapshotter (both with
# the feature gate CSIVolumeGroupSnapshot, as env-up.sh starts them), on the
# env tests/k8s-e2e/env-up.sh RUN_DIR brought up (pods on host-kl-1), of the
# local backend's class, or of the member backend's (MEMBER=1): then the
# member cuts one VolumeGroupSnapshot of the member claims with hostpath's
# own group snapshot (its default class kl-hostpath-group), the relay maps
# its VolumeSnapshots back, and the restores are member claims from them;
# a class naming a member class that is not there is refused, saying so.
#   1. two claims of class relay-local with the label group=g1, a pod on
#      host-kl-1 writes a different file into each;
#   2. a VolumeGroupSnapshotClass of relay.csi.dev and a VolumeGroupSnapshot
#      of the label: ready, with one ready VolumeSnapshot per claim;
#   3. each claim restored from its member VolumeSnapshot; a pod reads both
#      files back; external-provisioner v6.2+'s source-protection finalizer
#      is off each VolumeSnapshot once its restore is Bound, and its PV
#      finalizer (external-provisioner.volume.kubernetes.io/finalizer) is on
#      every PV it made;
#   4. the group snapshot deleted (deletionPolicy Delete): its contents and
#      the member VolumeSnapshots go; then every claim: no PV left.
# Prints "ok"/"FAIL" per check and "figure:" lines; exits 1 on any FAIL.
set -uo pipefail
RUN=${1:?usage: group-snapshots.sh RUN_DIR [local|member]}
BACKEND=${2:-local}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
RUN=$(cd "$RUN" && pwd)
source "$RUN/env.sh"
NS=relay-group-snapshots
GROUPCLASS=relay-local-group
if [[ $BACKEND == member ]]; then
  [[ $(sed -n 's/^export K8SE2E_MEMBER=//p' "$RUN/env.sh") == 1 ]] ||
    { echo "skipped: no member backend in this env (MEMBER=1)"; exit 0; }
  NS=relay-group-snapshots-member CLASS=$MEMBER_CLASS DRIVER=$MEMBER_DRIVER GROUPCLASS=relay-member-group
fi
source "$HERE/checks.inc.sh"
IMAGE=$(awk '$1 ~ /e2e-test-images\/busybox:1\.36\.1-1$/ {print $1; exit}' "$E2E_HOME/images/images.txt")
[[ -n $IMAGE ]] || { echo "no e2e-test-images/busybox:1.36.1-1 in $E2E_HOME/images/images.txt" >&2; exit 2; }
kh get crd volumegroupsnapshots.groupsnapshot.storage.k8s.io > /dev/null 2>&1 ||
  { echo "skipped: no VolumeGroupSnapshot CRD (\$E2E_HOME/snapshot-crds of external-snapshotter v8.6+)"; exit 0; }
# v1 where served (external-snapshotter v8.6+), else the version it stores.
served=$(kh get crd volumegroupsnapshots.groupsnapshot.storage.k8s.io -o jsonpath='{.spec.versions[?(@.served==true)].name}')
API=$(kh get crd volumegroupsnapshots.groupsnapshot.storage.k8s.io -o jsonpath='{.spec.versions[?(@.storage==true)].name}')
[[ " $served " == *" v1 "* ]] && API=v1
PV_FINALIZER=external-provisioner.volume.kubernetes.io/finalizer
SOURCE_FINALIZER=provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection

kh create namespace $NS > /dev/null 2>&1 || true
waitfor 30 kn get serviceaccount default || fail "namespace $NS has no default ServiceAccount"
claim() { # claim NAME [SNAPSHOT]
  local source=""
  [[ -n ${2:-} ]] && source="dataSource: {apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: $2}"
  kn apply -f - > /dev/null <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, labels: {group: ${3:-g1}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: $CLASS
  resources: {requests: {storage: 16Mi}}
  $source
YAML
}
pod() { # pod NAME COMMAND CLAIM... : a pod on host-kl-1 with each claim at /CLAIM
  local name=$1 cmd=$2 mounts="" volumes="" c; shift 2
  for c in "$@"; do
    mounts+="    - {name: $c, mountPath: /$c}"$'\n'
    volumes+="  - {name: $c, persistentVolumeClaim: {claimName: $c}}"$'\n'
  done
  kn apply -f - > /dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name}
spec:
  nodeSelector: {kubernetes.io/hostname: $KL_NODE}
  tolerations: [{operator: Exists}]
  terminationGracePeriodSeconds: 1
  automountServiceAccountToken: false
  containers:
  - name: c
    image: $IMAGE
    imagePullPolicy: IfNotPresent
    command: [sh, -c, '$cmd']
    volumeMounts:
$mounts  volumes:
$volumes
YAML
}
bound() { [[ $(kn get pvc "$1" -o jsonpath='{.status.phase}' 2>/dev/null) == Bound ]]; }

# 1. two claims with data
claim a; claim b
pod writer 'echo alpha > /a/f && echo beta > /b/f && sync && sleep 100000' a b
if waitfor 120 running writer; then ok "claims a, b bound and written by a pod"; else fail "writer not Running"; fi
for c in a b; do
  pv=$(kn get pvc $c -o jsonpath='{.spec.volumeName}')
  if kh get pv "$pv" -o jsonpath='{.metadata.finalizers}' | grep -q "$PV_FINALIZER"; then
    ok "PV of $c carries $PV_FINALIZER"
  else
    fail "PV $pv of $c lacks $PV_FINALIZER: $(kh get pv "$pv" -o jsonpath='{.metadata.finalizers}')"
  fi
done

# 2. the group snapshot
kh apply -f - > /dev/null <<YAML
apiVersion: groupsnapshot.storage.k8s.io/$API
kind: VolumeGroupSnapshotClass
metadata: {name: $GROUPCLASS}
driver: $DRIVER
deletionPolicy: Delete
YAML
started=$(date +%s.%N)
kn apply -f - > /dev/null <<YAML
apiVersion: groupsnapshot.storage.k8s.io/$API
kind: VolumeGroupSnapshot
metadata: {name: g1}
spec:
  volumeGroupSnapshotClassName: $GROUPCLASS
  source: {selector: {matchLabels: {group: g1}}}
YAML
ready() { [[ $(kn get volumegroupsnapshot g1 -o jsonpath='{.status.readyToUse}' 2>/dev/null) == true ]]; }
if waitfor 120 ready; then
  ok "VolumeGroupSnapshot g1 ready ($API)"
  echo "figure: group snapshot of 2 claims ready $(awk -v a="$(date +%s.%N)" -v b="$started" 'BEGIN{printf "%.1f", a-b}') s after it was made"
else
  fail "VolumeGroupSnapshot g1 not ready: $(kn get volumegroupsnapshot g1 -o jsonpath='{.status}')"
fi
# Its member VolumeSnapshots name their claim (v8.2+).
snap_of() { # snap_of CLAIM : the member VolumeSnapshot of CLAIM
  kn get volumesnapshot -o jsonpath="{range .items[?(@.spec.source.persistentVolumeClaimName=='$1')]}{.metadata.name}{'\n'}{end}" | head -1
}
# The group's readyToUse comes first: snapshot-controller then marks each
# member VolumeSnapshot ready in its own sync, moments later (CI saw one not
# yet ready at the instant the group was).
snap_ready() { local s; s=$(snap_of "$1"); [[ -n $s && $(kn get volumesnapshot "$s" -o jsonpath='{.status.readyToUse}') == true ]]; }
for c in a b; do
  if waitfor 30 snap_ready $c; then
    s=$(snap_of $c)
    ok "member VolumeSnapshot $s of claim $c ready"
  else
    fail "no ready member VolumeSnapshot of claim $c: $(kn get volumesnapshot -o wide 2>&1 | tail -n +2)"
  fi
done

# The member's own group: one VolumeGroupSnapshot of the relay, ready, with
# a VolumeSnapshot of each member claim.
if [[ $BACKEND == member ]]; then
  mgroup=$(km get volumegroupsnapshot -A -l app.kubernetes.io/managed-by=csi-relay \
    -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.status.readyToUse}{"\n"}{end}')
  if [[ $(wc -l <<< "$mgroup") == 1 && $mgroup == */relay-group-*" true" ]]; then
    ok "member VolumeGroupSnapshot ${mgroup% *} ready"
    mns=${mgroup%%/*} mname=${mgroup%% *}; mname=${mname#*/}
    owned=$(km -n "$mns" get volumesnapshot -o jsonpath="{range .items[?(@.metadata.ownerReferences[0].name=='$mname')]}{.metadata.name}{'\n'}{end}" | grep -c .)
    if [[ $owned == 2 ]]; then ok "its 2 member VolumeSnapshots, one per claim"; else
      fail "member VolumeSnapshots of $mname: $owned, not 2: $(km -n "$mns" get volumesnapshot -o wide 2>&1)"; fi
  else
    fail "member VolumeGroupSnapshots of the relay: '$mgroup'"
  fi
  # A new controller knows the group: the member relay's controller and its sidecars started
  # again on an empty state directory (deploy/'s is an emptyDir), as a new pod would be; what
  # follows (restores from the group's snapshots, the group's delete) goes through it.
  LAB=$RUN/lab
  source "$KL/kl-lib.sh"
  source "$HERE/processes.inc.sh"
  MEMBER_PROCS=(member-relay-controller member-provisioner member-attacher member-resizer member-snapshotter)
  for ((k = 0; k < ${#MEMBER_PROCS[@]}; k++)); do save "${MEMBER_PROCS[$k]}" "$k"; done
  for n in "${MEMBER_PROCS[@]}"; do kill_hard "$n"; done
  rm -rf "$RUN/member-state/controller" && mkdir -p "$RUN/member-state/controller"
  rm -f "$RUN/member-controller.sock"
  for ((k = 0; k < ${#MEMBER_PROCS[@]}; k++)); do
    start_saved "${MEMBER_PROCS[$k]}" "$k" "$LAB/logs/${MEMBER_PROCS[$k]}.log"
  done
  recovered() { grep -q "group snapshot record recovered from the member" "$LAB/logs/member-relay-controller.log"; }
  if waitfor 60 recovered; then ok "the member relay's controller, started again on an empty state directory, recovered the group from the member"; else
    fail "the restarted member relay's controller recovered no group: $(tail -5 "$LAB/logs/member-relay-controller.log")"; fi
fi

# 3. restore each, read both back
kn delete pod writer --wait=true > /dev/null 2>&1
for c in a b; do claim "r$c" "$(snap_of $c)" restored; done
pod reader 'cat /ra/f /rb/f > /tmp/both && sleep 100000' ra rb
if waitfor 120 running reader; then
  got=$(kn exec reader -- cat /tmp/both 2>/dev/null | tr '\n' ' ')
  if [[ $got == "alpha beta " ]]; then ok "restored claims hold the data"; else fail "restored claims hold '$got'"; fi
else
  fail "reader not Running: $(kn get pvc ra rb 2>&1 | tail -n +2)"
fi
for c in a b; do
  s=$(snap_of $c)
  [[ -n $s ]] || { fail "no member VolumeSnapshot of claim $c to look at"; continue; }
  if kn get volumesnapshot "$s" -o jsonpath='{.metadata.finalizers}' | grep -q "$SOURCE_FINALIZER"; then
    fail "VolumeSnapshot $s keeps $SOURCE_FINALIZER after its restore is Bound"
  else
    ok "VolumeSnapshot $s: no source-protection finalizer left once its restore is Bound"
  fi
done

# 4. teardown
kn delete pod reader --wait=true > /dev/null 2>&1
contents=$(kh get volumegroupsnapshotcontent -o jsonpath="{range .items[?(@.spec.volumeGroupSnapshotRef.namespace=='$NS')]}{.metadata.name}{'\n'}{end}")
kn delete volumegroupsnapshot g1 --wait=false > /dev/null 2>&1
gone() { ! kn get volumegroupsnapshot g1 > /dev/null 2>&1 && [[ -z $(kn get volumesnapshot -o name 2>/dev/null) ]] &&
  for c in $contents; do ! kh get volumegroupsnapshotcontent "$c" > /dev/null 2>&1 || return 1; done; }
if waitfor 120 gone; then ok "group snapshot, its VolumeSnapshots and its contents deleted"; else
  fail "left after deleting the group snapshot: $(kn get volumesnapshot,volumegroupsnapshot -o name 2>&1) $contents"; fi
if [[ $BACKEND == member && -n ${mname:-} ]]; then
  mgone() { ! km -n "$mns" get volumegroupsnapshot "$mname" > /dev/null 2>&1 &&
    [[ -z $(km -n "$mns" get volumesnapshot -o jsonpath="{range .items[?(@.metadata.ownerReferences[0].name=='$mname')]}{.metadata.name}{end}") ]]; }
  if waitfor 120 mgone; then ok "the member VolumeGroupSnapshot and its VolumeSnapshots deleted"; else
    fail "left in the member: $(km -n "$mns" get volumegroupsnapshot,volumesnapshot -o name 2>&1)"; fi
  # A class naming a member class that is not there: refused, and said.
  group_of_class() { # group_of_class GROUP CLASS PARAMETERS : a class of the relay, and a group of claims a, b
    kh apply -f - > /dev/null <<YAML
apiVersion: groupsnapshot.storage.k8s.io/$API
kind: VolumeGroupSnapshotClass
metadata: {name: $2}
driver: $DRIVER
deletionPolicy: Delete
parameters: $3
YAML
    kn apply -f - > /dev/null <<YAML
apiVersion: groupsnapshot.storage.k8s.io/$API
kind: VolumeGroupSnapshot
metadata: {name: $1}
spec:
  volumeGroupSnapshotClassName: $2
  source: {selector: {matchLabels: {group: g1}}}
YAML
  }
  group_of_class g2 $GROUPCLASS-missing "{memberGroupSnapshotClass: not-there}"
  said() { kn get volumegroupsnapshot g2 -o jsonpath='{.status.error.message}' | grep -q "has no VolumeGroupSnapshotClass not-there"; }
  if waitfor 60 said; then ok "a class naming a member class that is not there: $(kn get volumegroupsnapshot g2 -o jsonpath='{.status.error.message}' | grep -o 'FailedPrecondition.*' | head -c 160)"; else
    fail "VolumeGroupSnapshot g2 of a missing member class: $(kn get volumegroupsnapshot g2 -o jsonpath='{.status}')"; fi
  kn delete volumegroupsnapshot g2 --wait=true --timeout=60s > /dev/null 2>&1
  kh delete volumegroupsnapshotclass $GROUPCLASS-missing --ignore-not-found > /dev/null 2>&1
  # A class that opts in to one member VolumeSnapshot per volume (not crash-consistent): the
  # relay's own member VolumeSnapshots, no member VolumeGroupSnapshot.
  group_of_class g3 $GROUPCLASS-per-volume "{perVolumeSnapshots: \"true\", memberSnapshotClass: $M_KL_SNAPCLASS}"
  g3_ready() { [[ $(kn get volumegroupsnapshot g3 -o jsonpath='{.status.readyToUse}') == true ]]; }
  own_snaps() { km -n "$mns" get volumesnapshot -l app.kubernetes.io/managed-by=csi-relay -o name | grep -c .; }
  if waitfor 120 g3_ready; then
    groups=$(km -n "$mns" get volumegroupsnapshot -o name | grep -c .)
    if [[ $(own_snaps) == 2 && $groups == 0 ]]; then ok "perVolumeSnapshots: the group of 2 claims is 2 of the relay's member VolumeSnapshots, no member VolumeGroupSnapshot"; else
      fail "perVolumeSnapshots in the member: $(km -n "$mns" get volumesnapshot,volumegroupsnapshot -o name 2>&1)"; fi
  else
    fail "VolumeGroupSnapshot g3 (perVolumeSnapshots) not ready: $(kn get volumegroupsnapshot g3 -o jsonpath='{.status}')"
  fi
  kn delete volumegroupsnapshot g3 --wait=false > /dev/null 2>&1
  none_left() { [[ $(own_snaps) == 0 ]] && ! kn get volumegroupsnapshot g3 > /dev/null 2>&1; }
  if waitfor 120 none_left; then ok "g3 and its member VolumeSnapshots deleted"; else
    fail "left of g3: $(kn get volumegroupsnapshot -o name 2>&1) $(km -n "$mns" get volumesnapshot -o name 2>&1)"; fi
  kh delete volumegroupsnapshotclass $GROUPCLASS-per-volume --ignore-not-found > /dev/null 2>&1
fi
kn delete pvc --all --wait=false > /dev/null 2>&1
pvs_gone() { [[ -z $(kh get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$NS')]}{.metadata.name}{'\n'}{end}") ]]; }
if waitfor 120 pvs_gone; then ok "every PV of the claims deleted (finalizer released)"; else
  fail "PVs left: $(kh get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$NS')]}{.metadata.name} {.metadata.finalizers}{'\n'}{end}")"; fi
kh delete volumegroupsnapshotclass $GROUPCLASS --ignore-not-found > /dev/null 2>&1
kh delete namespace $NS --wait=false > /dev/null 2>&1
echo "group-snapshots: $fails failure(s)"
((fails == 0))
