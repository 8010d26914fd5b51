#!/bin/bash
# snapshot.sh RUN_DIR: a snapshot taken and restored through the kit up.sh RUN_DIR installed, under
# deploy/'s RBAC (the controller pod's csi-snapshotter and csi-provisioner as deploy/ runs them).
#   - member: snapshot CRDs, snapshot-controller and csi-driver-host-path (controller side only,
#     no topology, state in RUN_DIR/member-hostpath) with csi-provisioner and csi-snapshotter,
#     processes on this machine recorded in LAB_DIR/pids (stopped with the node by down.sh);
#     class kit-hostpath, default VolumeSnapshotClass kit-hostpath-snap;
#   - host: snapshot-controller (LAB_DIR/pids too), class relay-member1-snap (member1's
#     kit-hostpath, Immediate), VolumeSnapshotClass relay-member1-snap;
#   1. claim src Bound; a file written into its member volume (the driver's directory);
#   2. VolumeSnapshot s1 of it ready, through the member VolumeSnapshot;
#   3. claim restored from s1 Bound, holding the file; the provisioner's source-protection
#      finalizer off s1 once it is (its `update` on volumesnapshots, deploy/rbac.yaml);
#   4. everything deleted: nothing left in either cluster or in the driver's state.
# Prints PASS/FAIL per step with timings; exit 1 on the first failure.
set -Eeuo pipefail
RUN=${1:?usage: snapshot.sh RUN_DIR}
RUN=$(cd "$RUN" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exec > >(tee -a "$RUN/logs/snapshot.log") 2>&1
T_START=$(date +%s.%N)
ts "snapshot.sh $RUN"
kn() { kh -n "$SNAP_NS" "$@"; }
pass() { ts "PASS: $*"; }
trap 'ts "FAIL at line $LINENO: $BASH_COMMAND"; kn get pvc,volumesnapshot -o wide 2>&1; km get pvc,volumesnapshot -A 2>&1' ERR
lab() { ( source "$KL/kl-lib.sh"; "$@" ); }
B=$E2E_HOME/bin
for b in hostpathplugin csi-provisioner csi-snapshotter snapshot-controller; do
  [[ -x $B/$b ]] || { echo "skipped: no $B/$b"; exit 0; }
done
HP_DRIVER=hostpath.kit.csi.k8s.io
HP=$RUN/member-hostpath
SOURCE_FINALIZER=provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection

# ---------- member storage that snapshots ----------
mkdir -p "$HP"
km apply -f "$E2E_HOME/snapshot-crds/" > /dev/null
km wait --for=condition=Established crd volumesnapshots.snapshot.storage.k8s.io \
  volumesnapshotclasses.snapshot.storage.k8s.io volumesnapshotcontents.snapshot.storage.k8s.io --timeout=60s > /dev/null
lab kl_start kit-member-hostpath "$RUN/logs/member-hostpath.log" "$B/hostpathplugin" --endpoint "unix://$HP/csi.sock" \
  --nodeid "$MEMBER_NODE" --drivername $HP_DRIVER --statedir "$HP" --enable-topology=false -v=3
waitfor 10 "member hostpath socket" test -S "$HP/csi.sock"
lab kl_start kit-member-provisioner "$RUN/logs/member-provisioner.log" "$B/csi-provisioner" --csi-address="$HP/csi.sock" \
  --kubeconfig="$MKC" --leader-election=false --timeout=60s -v=3
lab kl_start kit-member-snapshotter "$RUN/logs/member-snapshotter.log" "$B/csi-snapshotter" --csi-address="$HP/csi.sock" \
  --kubeconfig="$MKC" --leader-election=false --timeout=60s -v=3
lab kl_start kit-member-snapshot-controller "$RUN/logs/member-snapshot-controller.log" "$B/snapshot-controller" \
  --kubeconfig="$MKC" --leader-election=false -v=3
lab kl_start kit-host-snapshot-controller "$RUN/logs/host-snapshot-controller.log" "$B/snapshot-controller" \
  --kubeconfig="$HKC" --leader-election=false -v=3
km apply -f - > /dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: { name: kit-hostpath }
provisioner: $HP_DRIVER
volumeBindingMode: Immediate
reclaimPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: kit-hostpath-snap
  annotations: { snapshot.storage.kubernetes.io/is-default-class: "true" }
driver: $HP_DRIVER
deletionPolicy: Delete
EOF
kh apply -f - > /dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: { name: relay-member1-snap }
provisioner: relay.csi.dev
volumeBindingMode: Immediate
reclaimPolicy: Delete
parameters: { member: $MEMBER_NAME, memberStorageClass: kit-hostpath, createMemberNamespace: "true" }
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: { name: relay-member1-snap }
driver: relay.csi.dev
deletionPolicy: Delete
EOF
kh create namespace "$SNAP_NS" > /dev/null 2>&1 || true
waitfor 30 "default ServiceAccount in $SNAP_NS" kn get serviceaccount default
ts "member: $HP_DRIVER with its provisioner and snapshotter, snapshot-controller in both clusters"

claim() { # claim NAME [SNAPSHOT]
  local source=""
  [[ -n ${2:-} ]] && source="dataSource: { apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: $2 }"
  kn apply -f - > /dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: $1 }
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: relay-member1-snap
  resources: { requests: { storage: 16Mi } }
  $source
EOF
}
bound() { [[ $(kn get pvc "$1" -o jsonpath='{.status.phase}') == Bound ]]; }
member_dir() { # member_dir CLAIM : the driver's directory of the claim's member volume
  local pv handle
  pv=$(km -n "$SNAP_NS" get pvc "$1" -o jsonpath='{.spec.volumeName}')
  handle=$(km get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
  [[ -n $handle && -d $HP/$handle ]] && echo "$HP/$handle"
}

# ---------- 1. a claim with data ----------
claim src
waitfor 60 "claim src Bound" bound src
src_dir=$(member_dir src)
token=kit-$RANDOM-$RANDOM
echo "$token" > "$src_dir/token"
pass "claim src Bound; its member volume $src_dir holds a token"

# ---------- 2. the snapshot ----------
t=$(date +%s.%N)
kn apply -f - > /dev/null <<EOF
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: { name: s1 }
spec:
  volumeSnapshotClassName: relay-member1-snap
  source: { persistentVolumeClaimName: src }
EOF
ready() { [[ $(kn get volumesnapshot s1 -o jsonpath='{.status.readyToUse}') == true ]]; }
waitfor 90 "VolumeSnapshot s1 ready" ready
msnap=$(km -n "$SNAP_NS" get volumesnapshot -l app.kubernetes.io/managed-by=csi-relay -o jsonpath='{.items[0].metadata.name} {.items[0].status.readyToUse}')
[[ $msnap == *" true" ]] || die "member VolumeSnapshot of s1: '$msnap'"
pass "VolumeSnapshot s1 ready $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s after it was made, through member VolumeSnapshot ${msnap% *}"

# ---------- 3. the restore ----------
t=$(date +%s.%N)
claim restored s1
waitfor 90 "claim restored Bound" bound restored
got=$(cat "$(member_dir restored)/token")
[[ $got == "$token" ]] || die "the restored volume holds '$got', not '$token'"
pass "claim restored Bound $(awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s after it was made, holding the token"
released() { ! kn get volumesnapshot s1 -o jsonpath='{.metadata.finalizers}' | grep -q "$SOURCE_FINALIZER"; }
waitfor 30 "$SOURCE_FINALIZER off s1" released
# Off, and on before: the host's audit log shows the provisioner's own writes of s1 (putting the
# finalizer on, taking it off) answered 200, under deploy/'s identity for the controller pod.
AUDIT_HOST=$E2E_HOME/run/$HOST/logs/audit.log
writes=$(jq -r --arg ns "$SNAP_NS" 'select(.objectRef.resource == "volumesnapshots" and .objectRef.namespace == $ns
    and .objectRef.name == "s1" and (.verb == "update" or .verb == "patch")
    and (.userAgent | startswith("csi-provisioner"))) | "\(.user.username) \(.responseStatus.code)"' "$AUDIT_HOST" | sort | uniq -c)
ok_writes=$(awk '$2 == "system:serviceaccount:csi-relay:csi-relay-controller" && $3 == 200 {n += $1} END {print n + 0}' <<< "$writes")
((ok_writes >= 2)) || die "the provisioner's writes of s1 in the host's audit log: '$writes'"
[[ -z $(awk '$3 != 200' <<< "$writes") ]] || die "the provisioner's writes of s1 refused: '$writes'"
pass "the provisioner put its source-protection finalizer on s1 and took it off: $ok_writes writes, each 200, as csi-relay-controller (deploy/rbac.yaml's update on volumesnapshots)"

# ---------- 4. teardown ----------
kn delete volumesnapshot s1 --wait=false > /dev/null
kn delete pvc --all --wait=false > /dev/null
gone() {
  [[ -z $(kn get pvc,volumesnapshot -o name 2>/dev/null) ]] &&
    [[ -z $(kh get volumesnapshotcontent -o name 2>/dev/null) ]] &&
    [[ -z $(kh get pv -o jsonpath="{range .items[?(@.spec.claimRef.namespace=='$SNAP_NS')]}{.metadata.name}{end}") ]] &&
    [[ -z $(km -n "$SNAP_NS" get pvc,volumesnapshot -o name 2>/dev/null) ]] &&
    [[ -z $(km get volumesnapshotcontent,pv -o name 2>/dev/null | grep -v '/kit-pv-') ]] &&
    [[ -z $(find "$HP" -mindepth 1 -maxdepth 1 ! -name csi.sock ! -name state.json) ]]
}
waitfor 90 "everything of the snapshot gone" gone
pass "snapshot, claims, their PVs, member objects and the driver's data all deleted"
kh delete namespace "$SNAP_NS" --wait=false > /dev/null
kh delete storageclass relay-member1-snap > /dev/null
kh delete volumesnapshotclass relay-member1-snap > /dev/null
ts "snapshot.sh: done"
