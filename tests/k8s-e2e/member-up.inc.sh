# member-up.inc.sh: part (b) of env-up.sh (sourced by it when MEMBER=1; uses its
# variables and helpers).
#   - The member cluster gets a kube-scheduler and a real kubelet node
#     member-kl-1 (own containerd and pod log dirs: host-kl-1 runs beside it)
#     with csi-driver-host-path as driver hostpath.kl.csi.k8s.io (node plugin
#     registered through node-driver-registrar; provisioner, attacher,
#     resizer) and class kl-hostpath: the member storage
#     (tests/e2e-env/storage-node-up.sh). The env's fake member-node-1 gets
#     no scheduled pods.
#   - csi-relay with --backend member as driver member.relay.csi.dev: a
#     controller (--mode controller) for member cluster "member1" = the env's
#     member, and a node plugin on host-kl-1 (--mode node) that proxies to the
#     member-kl-1 hostpath's node plugin, found through --plugins-dir
#     RUN_DIR/member-plugins/<driver>/csi.sock (a symlink to its socket).
#     host-kl-1 maps to member node member-kl-1 by the labels
#     topology.relay.csi.dev/member(-node). Class relay-member: member1's
#     kl-hostpath (Immediate). NODE_MEMBER_KUBECONFIG, when set, is how the
#     node plugin reaches member1 (a test's fault proxy, node-partition.sh).
#     MEMBER_RELAY_KUBECONFIG, when set (tests/e2e-env/env-up.sh makes it), is
#     the controller's: deploy/member's identity under its admission policy.
#   - Snapshots, when the local part has them (SNAP=1): the snapshot CRDs,
#     snapshot-controller and hostpath's csi-snapshotter in the member with
#     class kl-hostpath-snap and the default VolumeGroupSnapshotClass
#     kl-hostpath-group (the gate CSIVolumeGroupSnapshot on, as on the host);
#     the host's csi-snapshotter for the member relay and class
#     relay-member-snap (memberSnapshotClass: kl-hostpath-snap).
MLAB=$RUN/member-lab
# The kubelet changes three sysctls and each node-down puts back what its
# node-up found: this node starts second, so it gets the first one's record of
# the originals (whichever goes down last must not restore the kubelet's values).
mkdir -p "$MLAB/state"; cp "$LAB/state/sysctl.orig" "$MLAB/state/sysctl.orig"
POD_LOG_DIR=$RUN/member-var-log CTRD_STATE=$M_KL_CTRD_STATE KUBELET_CLIENT_CA="$RUN/kubelet-client-ca-bundle.crt" \
  HTTPS_PROXY=$K8SE2E_PROXY HTTP_PROXY=$K8SE2E_PROXY https_proxy=$K8SE2E_PROXY http_proxy=$K8SE2E_PROXY \
  FAKE_NODES=$MEMBER_NODE FAKE_TAINT=$FAKE_TAINT DRIVER=$M_KL_DRIVER CLASS=$M_KL_CLASS \
  "$E2E_ENV/storage-node-up.sh" "$MEMBER_KUBECONFIG" $M_KL_NODE $M_KL_PORT $M_SCHED_PORT "$MLAB" \
  > "$RUN/logs/member-storage-node-up.log" 2>&1
ts "member: scheduler, kubelet node $M_KL_NODE with $M_KL_DRIVER, class $M_KL_CLASS"
M_SOCK=$MLAB/kubelet/plugins/$M_KL_DRIVER/csi.sock
if ((SNAP)); then
  km apply -f "$SNAPSHOT_CRDS" > /dev/null
  km wait --for=condition=Established crd volumesnapshots.snapshot.storage.k8s.io \
    volumesnapshotclasses.snapshot.storage.k8s.io volumesnapshotcontents.snapshot.storage.k8s.io --timeout=60s > /dev/null
  ( LAB=$MLAB; source "$KL/kl-lib.sh"
    kl_start snapshot-controller "$MLAB/logs/snapshot-controller.log" "$B/snapshot-controller" \
      --kubeconfig="$MEMBER_KUBECONFIG" --leader-election=false -v=3 $GROUP_GATE
    kl_start csi-snapshotter "$MLAB/logs/csi-snapshotter.log" "$B/csi-snapshotter" --csi-address="$M_SOCK" \
      --kubeconfig="$MEMBER_KUBECONFIG" --leader-election=false -v=3 $GROUP_GATE )
  km apply -f - > /dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: $M_KL_SNAPCLASS}
driver: $M_KL_DRIVER
deletionPolicy: Delete
YAML
  # hostpath cuts groups (its GroupController): the member's default
  # VolumeGroupSnapshotClass of it, which the relay's member group
  # snapshots use (group-snapshots.sh member).
  if km get crd volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io > /dev/null 2>&1; then
    km wait --for=condition=Established crd volumegroupsnapshots.groupsnapshot.storage.k8s.io \
      volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io --timeout=60s > /dev/null
    km apply -f - > /dev/null <<YAML
apiVersion: groupsnapshot.storage.k8s.io/$(km get crd volumegroupsnapshotclasses.groupsnapshot.storage.k8s.io -o jsonpath='{.spec.versions[?(@.storage==true)].name}')
kind: VolumeGroupSnapshotClass
metadata:
  name: $M_KL_GROUPCLASS
  annotations: {groupsnapshot.storage.kubernetes.io/is-default-class: "true"}
driver: $M_KL_DRIVER
deletionPolicy: Delete
YAML
  fi
  ts "member: snapshot CRDs, snapshot-controller, hostpath's csi-snapshotter, classes $M_KL_SNAPCLASS, $M_KL_GROUPCLASS"
fi
[[ -x $B/csi-resizer ]] || { echo "missing $B/csi-resizer" >&2; false; }
MSTATE=$RUN/member-state
mkdir -p "$MSTATE/controller" "$MSTATE/node" "$RUN/member-plugins/$M_KL_DRIVER"
ln -sfn "$M_SOCK" "$RUN/member-plugins/$M_KL_DRIVER/csi.sock"
"$RELAY_BIN" crd | kh apply -f - > /dev/null
kh wait --for=condition=Established crd --all --timeout=60s > /dev/null
kh label node $KL_NODE --overwrite topology.relay.csi.dev/member=member1 \
  topology.relay.csi.dev/member-node=$M_KL_NODE > /dev/null
MCSOCK=$RUN/member-controller.sock
MNSOCKDIR=$LAB/kubelet/plugins/$MEMBER_DRIVER; MNSOCK=$MNSOCKDIR/csi.sock
mkdir -p "$MNSOCKDIR"
RUST_LOG=$RELAY_LOG lab kl_start member-relay-controller "$LAB/logs/member-relay-controller.log" \
  "$RELAY_BIN" serve --mode controller --backend member --driver-name $MEMBER_DRIVER --node-id relay-controller \
  --member member1="${MEMBER_RELAY_KUBECONFIG:-$MEMBER_KUBECONFIG}" --host-kubeconfig "$HOST_KUBECONFIG" \
  --state-dir "$MSTATE/controller" --endpoint "unix://$MCSOCK" --metrics-address "$MEMBER_METRICS"
RUST_LOG=$RELAY_LOG lab kl_start member-relay-node "$LAB/logs/member-relay-node.log" \
  "$RELAY_BIN" serve --mode node --backend member --driver-name $MEMBER_DRIVER --node-id $KL_NODE \
  --node-member member1 --member member1="${NODE_MEMBER_KUBECONFIG:-$MEMBER_KUBECONFIG}" --host-kubeconfig "$HOST_KUBECONFIG" \
  --plugins-dir "$RUN/member-plugins" --state-dir "$MSTATE/node" --endpoint "unix://$MNSOCK" \
  --metrics-address "$MEMBER_NODE_METRICS"
waitfor 30 "member relay sockets" sh -c "test -S '$MCSOCK' && test -S '$MNSOCK'"
lab kl_start member-registrar "$LAB/logs/member-registrar.log" "$B/csi-node-driver-registrar" --csi-address="$MNSOCK" \
  --kubelet-registration-path="$MNSOCK" --plugin-registration-path="$KL_REGISTRATION_DIR" -v=3
MSC=(--csi-address="$MCSOCK" --kubeconfig="$HOST_KUBECONFIG" --leader-election=false --timeout=60s -v=${SIDECAR_V:-3})
lab kl_start member-provisioner "$LAB/logs/member-provisioner.log" "$B/csi-provisioner" "${MSC[@]}" \
  --feature-gates=Topology=true --extra-create-metadata
lab kl_start member-attacher "$LAB/logs/member-attacher.log" "$B/csi-attacher" "${MSC[@]}"
lab kl_start member-resizer "$LAB/logs/member-resizer.log" "$B/csi-resizer" "${MSC[@]}" $RESIZER_GATES
((SNAP)) && lab kl_start member-snapshotter "$LAB/logs/member-snapshotter.log" "$B/csi-snapshotter" "${MSC[@]}" $GROUP_GATE
cat > "$RUN/manifests/relay-member.yaml" <<YAML
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $MEMBER_DRIVER}
spec:
  attachRequired: true
  podInfoOnMount: true
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $MEMBER_CLASS}
provisioner: $MEMBER_DRIVER
volumeBindingMode: Immediate
reclaimPolicy: Delete
allowVolumeExpansion: true
parameters:
  member: member1
  memberStorageClass: $M_KL_CLASS
  createMemberNamespace: "true"
YAML
if ((SNAP)); then cat >> "$RUN/manifests/relay-member.yaml" <<YAML
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: $MEMBER_SNAPCLASS}
driver: $MEMBER_DRIVER
deletionPolicy: Delete
parameters:
  memberSnapshotClass: $M_KL_SNAPCLASS
YAML
fi
kh apply -f "$RUN/manifests/relay-member.yaml" > /dev/null
waitfor 60 "CSINode $KL_NODE with $MEMBER_DRIVER" \
  sh -c "[ \"\$(kubectl --kubeconfig '$HOST_KUBECONFIG' get csinode $KL_NODE -o jsonpath='{.spec.drivers[?(@.name==\"$MEMBER_DRIVER\")].nodeID}')\" = $KL_NODE ]"
ts "csi-relay $MEMBER_DRIVER (member backend, member1) registered on $KL_NODE"
