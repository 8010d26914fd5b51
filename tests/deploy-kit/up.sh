#!/bin/bash
# up.sh RUN_DIR: deploy/ installed for real, with `kubectl apply -k`, into a host cluster with a
# real kubelet node (part 3 of issue #25). Undo with down.sh RUN_DIR; check with check.sh RUN_DIR.
#   - host control plane `deploykit` (E2E_HOME/cluster-up.sh, 127.0.0.1:19443-19446) with a
#     kube-scheduler (:19467) and a kubelet node `kit-node-1` (:10370/10371, its own containerd,
#     state dir /run/deploykit-containerd, LAB_DIR RUN_DIR/lab, kubelet root RUN_DIR/lab/kubelet);
#   - member control plane `deploykit-member` (127.0.0.1:19453-19456, no kubelet): deploy/member
#     applied, the relay's ServiceAccount token as member1's kubeconfig, class `standard`
#     (deploy/storageclass.yaml's memberStorageClass) with static hostPath PVs on the member node
#     `member-node-1`, whose "disk" is RUN_DIR/member-disk on this machine; the host node is
#     mapped to that member node (label topology.relay.csi.dev/member-node);
#   - images imported, no registry: csi-relay:0.1.0 from image.sh (the release binary), the
#     sidecars and busybox from E2E_HOME/images (images.txt);
#   - `kubectl apply -k RUN_DIR/kustomize`: tests/deploy-kit/overlay plus a generated layer
#     (kubeletDir patch, node state dir, member kubeconfig, API server address);
#   - waits for the controller and node pods Running and Ready and the driver registered.
# Env: CSI_RELAY_BIN (release binary for image.sh), KIT_IMAGE (a prebuilt image tar instead),
#      KIT_INSTALL=helm (install with `helm install` of the chart deploy/ instead, the same
#      objects; KIT_HELM names the helm binary, default E2E_HOME/bin/helm), and the names/ports in lib.sh.
set -Eeuo pipefail
RUN=${1:?usage: up.sh RUN_DIR}
mkdir -p "$RUN"; RUN=$(cd "$RUN" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mkdir -p "$RUN"/{logs,kustomize,member-disk,node-state}
exec > >(tee -a "$RUN/logs/up.log") 2>&1
ts "up.sh $RUN"

# ---------- preflight ----------
for c in kubectl ctr buildah python3 ss curl openssl; do command -v $c >/dev/null || die "need $c"; done
INSTALL=${KIT_INSTALL:-kustomize}
[[ $INSTALL != helm || -x $HELM ]] || die "KIT_INSTALL=helm: no $HELM"
for p in $HOST_PORT $((HOST_PORT+1)) $((HOST_PORT+2)) $((HOST_PORT+3)) \
         $MEMBER_PORT $((MEMBER_PORT+1)) $((MEMBER_PORT+2)) $((MEMBER_PORT+3)) \
         $SCHED_PORT $KL_PORT $((KL_PORT+1)) $KL_PORT2 $((KL_PORT2+1)) 9808 9809; do
  ss -Hltn "sport = :$p" | grep -q . && die "port $p in use"
done
[[ -e $CTRD_STATE ]] && die "$CTRD_STATE exists (run down.sh first)"
[[ -e $CTRD_STATE2 ]] && die "$CTRD_STATE2 exists (run down.sh first)"
[[ -e /run/netns/$NETNS2 ]] && die "network namespace $NETNS2 exists (run down.sh first)"
[[ -n "$(mounts_under "$RUN")" ]] && die "mounts under $RUN (run down.sh first)"
echo "$HOST $MEMBER $NODE $CTRD_STATE" > "$RUN/kit.env"

# ---------- image ----------
IMAGE_TAR=${KIT_IMAGE:-$RUN/csi-relay-0.1.0.tar}
if [[ -z ${KIT_IMAGE:-} ]]; then
  WORK_DIR=$RUN/image-build nice "$KIT/image.sh" "$IMAGE_TAR"
  rm -rf "$RUN/image-build"
fi
ts "image ready: $IMAGE_TAR"

# ---------- control planes ----------
# exec/logs on loopback (kubelet README): the API server presents the admin client certificate
# to the kubelet at the Node's InternalIP 127.0.0.1 (PKI is made before the API server starts).
P=$E2E_HOME/run/$HOST/pki
# AUDIT=1: the API servers' own record of who wrote what and when (tests/deploy-kit/ha.sh reads it).
AUDIT=1 APISERVER_EXTRA="--kubelet-preferred-address-types=InternalIP --kubelet-client-certificate=$P/admin.crt --kubelet-client-key=$P/admin.key" \
  nice "$E2E_ENV/cluster-up.sh" "$HOST" "$HOST_PORT" > "$RUN/logs/cluster-up-host.log" 2>&1 &
h=$!
AUDIT=1 APISERVER_EXTRA="" nice "$E2E_ENV/cluster-up.sh" "$MEMBER" "$MEMBER_PORT" > "$RUN/logs/cluster-up-member.log" 2>&1 &
m=$!
wait $h || { cat "$RUN/logs/cluster-up-host.log"; die "cluster-up $HOST"; }
wait $m || { cat "$RUN/logs/cluster-up-member.log"; die "cluster-up $MEMBER"; }
ts "control planes up: $HOST :$HOST_PORT, $MEMBER :$MEMBER_PORT"

# ---------- kubelet node ----------
export BIN_DIR=$E2E_HOME/bin NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
# POD_FORWARD: the controller runs without hostNetwork (its namespace enforces "restricted"); the
# node's CNI gives pods of csi-relay the two API servers on their own loopback, and the node the
# controller's liveness port 9808 (tests/e2e-env/kubelet/podlocal-forward.py).
POD_FORWARD="{\"namespaces\": [\"csi-relay\"], \"in\": [$HOST_PORT, $MEMBER_PORT], \"out\": [9808]}"
# POD_LOG_DIR: this node's containerd and kubelet get /var/log/{pods,containers} of their own
# (another kubelet may run on this machine), and LAB_DIR becomes an rshared mount, which the node
# plugin's Bidirectional kubelet-dir mount needs (/ is private here).
node_up() {
  env CTRD_STATE="$CTRD_STATE" POD_LOG_DIR="$RUN/var-log" POD_FORWARD="$POD_FORWARD" \
    HTTPS_PROXY=$PULL_PROXY HTTP_PROXY=$PULL_PROXY https_proxy=$PULL_PROXY http_proxy=$PULL_PROXY \
    nice "$KL/kubelet-node-up.sh" "$HKC" "$NODE" "$KL_PORT" "$LAB" >> "$RUN/logs/kubelet-node-up.log" 2>&1
}
node_up || { tail -20 "$RUN/logs/kubelet-node-up.log"; die "kubelet-node-up"; }
source "$LAB/node.env"
# After the node: a failed kubelet-node-up.sh stops every process recorded in LAB_DIR/pids
# (its ERR trap runs kubelet-node-down.sh), the scheduler included.
SCHEDULER_V=1 "$KL/kube-scheduler-up.sh" "$HKC" "$SCHED_PORT" "$LAB" > "$RUN/logs/kube-scheduler-up.log" 2>&1 \
  || { cat "$RUN/logs/kube-scheduler-up.log"; die "kube-scheduler-up"; }
ts "node $NODE Ready ($(tail -2 "$RUN/logs/kubelet-node-up.log" | head -1))"
kh patch node "$NODE" --subresource=status --type=merge \
  -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"},{\"type\":\"Hostname\",\"address\":\"$NODE\"}]}}" > /dev/null
kh taint node "$NODE" node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
kh label node "$NODE" --overwrite topology.relay.csi.dev/member-node=$MEMBER_NODE > /dev/null

# ---------- kubelet node 2: the controller's second replica, on a network of its own ----------
ip netns add "$NETNS2"
in2 ip link set lo up
mkdir -p "$LAB2/pids"
# The node's forwarder, recorded in LAB2/pids so kubelet-node-down.sh stops it with the node:
# API servers on node 2's loopback, node 2's kubelet port on the machine's (exec, logs).
python3 "$KL/podlocal-forward.py" "/run/netns/$NETNS2" "$LAB2/pids" node-forward \
  --in "$HOST_PORT,$MEMBER_PORT" --out "$KL_PORT2" >> "$RUN/logs/node2-forward.log" 2>&1 &
waitfor 10 "node 2 forwarder" test -s "$LAB2/pids/node-forward.pid" || die "node 2 forwarder"
in2 env CTRD_STATE="$CTRD_STATE2" POD_LOG_DIR="$RUN/var-log-2" POD_FORWARD="$POD_FORWARD" \
  HTTPS_PROXY=$PULL_PROXY HTTP_PROXY=$PULL_PROXY https_proxy=$PULL_PROXY http_proxy=$PULL_PROXY \
  nice "$KL/kubelet-node-up.sh" "$HKC" "$NODE2" "$KL_PORT2" "$LAB2" >> "$RUN/logs/kubelet-node2-up.log" 2>&1 \
  || { tail -20 "$RUN/logs/kubelet-node2-up.log"; die "kubelet-node-up (node 2)"; }
source "$LAB2/node.env"; KL2_CONTAINERD_SOCK=$KL_CONTAINERD_SOCK
source "$LAB/node.env"
kh patch node "$NODE2" --subresource=status --type=merge \
  -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"},{\"type\":\"Hostname\",\"address\":\"$NODE2\"}]}}" > /dev/null
kh taint node "$NODE2" node.kubernetes.io/not-ready:NoSchedule- > /dev/null 2>&1 || true
kh taint node "$NODE2" --overwrite "$CONTROLLER_ONLY=true:NoSchedule" > /dev/null
kh label node "$NODE2" --overwrite "$CONTROLLER_ONLY=true" > /dev/null
ts "node $NODE2 Ready in network namespace $NETNS2 (tainted $CONTROLLER_ONLY)"

# ---------- images ----------
SNAP=$(awk -F'"' '/snapshotter = /{print $2; exit}' "$LAB/containerd.toml")
SNAP2=$(awk -F'"' '/snapshotter = /{print $2; exit}' "$LAB2/containerd.toml")
imp() { ctr -a "$KL_CONTAINERD_SOCK" -n k8s.io images import --snapshotter "${SNAP:-overlayfs}" "$1" >> "$RUN/logs/images.log" 2>&1; }
imp2() { ctr -a "$KL2_CONTAINERD_SOCK" -n k8s.io images import --snapshotter "${SNAP2:-overlayfs}" "$1" >> "$RUN/logs/images.log" 2>&1; }
imp "$IMAGE_TAR"; imp2 "$IMAGE_TAR"
while read -r ref file; do
  case $ref in */sig-storage/*|"$BUSYBOX_IMAGE") imp "$E2E_HOME/images/$file"; imp2 "$E2E_HOME/images/$file" ;; esac
done < "$E2E_HOME/images/images.txt"
want=(localhost/csi-relay:0.1.0 $BUSYBOX_IMAGE
      $(kubectl kustomize "$KIT/overlay" | awk '/image: registry/{print $2}' | sort -u))
for sock in "$KL_CONTAINERD_SOCK" "$KL2_CONTAINERD_SOCK"; do
  have=$(ctr -a "$sock" -n k8s.io images ls -q)
  for i in "${want[@]}"; do grep -qxF "$i" <<< "$have" || die "image $i missing after import into $sock"; done
done
ts "images imported: ${#want[@]}"

# ---------- member cluster: what deploy/member/ says, plus storage ----------
"$E2E_ENV/member-identity.sh" "$MKC" "$RUN/kustomize/member1.kubeconfig" "$MEMBER_NAME" > "$RUN/logs/member-apply.log" 2>&1 \
  || { cat "$RUN/logs/member-apply.log"; die "member-identity.sh"; }
km apply -f - > /dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: { name: standard }
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
reclaimPolicy: Retain
---
apiVersion: v1
kind: Node
metadata:
  name: $MEMBER_NODE
  labels: { kubernetes.io/hostname: $MEMBER_NODE }
EOF
# Enough for check.sh and ha.sh's claims (Retain: a released PV is not bound again), in one apply.
for n in $(seq 1 "$MEMBER_PVS"); do
  mkdir -p "$RUN/member-disk/pv$n"
  cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: { name: kit-pv-$n }
spec:
  capacity: { storage: 1Gi }
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: standard
  hostPath: { path: $RUN/member-disk/pv$n, type: Directory }
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - { key: kubernetes.io/hostname, operator: In, values: [$MEMBER_NODE] }
EOF
done | km apply -f - > /dev/null
kubectl --kubeconfig "$RUN/kustomize/member1.kubeconfig" auth can-i create persistentvolumeclaims -n default > /dev/null \
  || die "member1 kubeconfig cannot create PVCs"
ts "member ready: deploy/member + admission policy applied, token kubeconfig, class standard, $MEMBER_PVS hostPath PVs"

# ---------- host: snapshot CRDs (deploy/ runs csi-snapshotter), then the kit ----------
kh apply -f "$E2E_HOME/snapshot-crds/" > /dev/null
kh wait --for=condition=Established crd --all --timeout=60s > /dev/null

K=$KUBELET_DIR
BASE=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$KIT/overlay" "$RUN/kustomize")
cat > "$RUN/kustomize/kustomization.yaml" <<EOF
# Generated by tests/deploy-kit/up.sh for $RUN.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $BASE   # tests/deploy-kit/overlay (kustomize wants a relative path)
secretGenerator:
  - name: csi-relay-members
    namespace: csi-relay
    behavior: replace
    files: [$MEMBER_NAME=member1.kubeconfig]
    options: { disableNameSuffixHash: true }
patches:
  - path: kubelet-dir.yaml
    target: { group: apps, version: v1, kind: DaemonSet, name: csi-relay-node }
  - path: controller-run.yaml
  - path: node-run.yaml
EOF
# The kubeletDir knob (docs/members.md: install on another kubelet root dir).
cat > "$RUN/kustomize/kubelet-dir.yaml" <<EOF
- { op: test, path: /spec/template/spec/volumes/0/name, value: plugin-dir }
- { op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: $K/plugins/relay.csi.dev }
- { op: test, path: /spec/template/spec/volumes/1/name, value: registration-dir }
- { op: replace, path: /spec/template/spec/volumes/1/hostPath/path, value: $K/plugins_registry }
- { op: test, path: /spec/template/spec/volumes/2/name, value: kubelet-dir }
- { op: replace, path: /spec/template/spec/volumes/2/hostPath/path, value: $K }
- { op: test, path: /spec/template/spec/containers/0/volumeMounts/2/name, value: kubelet-dir }
- { op: replace, path: /spec/template/spec/containers/0/volumeMounts/2/mountPath, value: $K }
- { op: add, path: /spec/template/spec/containers/0/args/-, value: --plugins-dir=$K/plugins }
- { op: test, path: /spec/template/spec/containers/1/name, value: node-driver-registrar }
- { op: replace, path: /spec/template/spec/containers/1/args/1, value: --kubelet-registration-path=$K/plugins/relay.csi.dev/csi.sock }
EOF
# In-cluster clients find the API server through KUBERNETES_SERVICE_HOST/PORT, which name the
# Service IP 10.0.0.1: nothing serves it here (no kube-proxy), and from the host network it
# would leave the machine. Every container gets the API server's own address instead.
API_ENV="[{name: KUBERNETES_SERVICE_HOST, value: \"127.0.0.1\"}, {name: KUBERNETES_SERVICE_PORT, value: \"$HOST_PORT\"}]"
cat > "$RUN/kustomize/controller-run.yaml" <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: { name: csi-relay-controller, namespace: csi-relay }
spec:
  template:
    spec:
      # Node 2 is for the controller only.
      tolerations: [{ key: $CONTROLLER_ONLY, operator: Exists, effect: NoSchedule }]
      containers:
$(for c in csi-relay csi-provisioner csi-attacher csi-resizer csi-snapshotter liveness-probe; do echo "        - { name: $c, env: $API_ENV }"; done)
EOF
cat > "$RUN/kustomize/node-run.yaml" <<EOF
# The node plugin's state on this run's disk, not /var/lib/csi-relay; the member node's "disk"
# (hostPath member PVs) visible to the plugin at the same path.
apiVersion: apps/v1
kind: DaemonSet
metadata: { name: csi-relay-node, namespace: csi-relay-node }
spec:
  template:
    spec:
      # deploy/node.yaml tolerates every taint (a node plugin belongs on every node); node 2 of the
      # kit is for the controller only, and has no kubelet dir at the path patched above.
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms: [{ matchExpressions: [{ key: $CONTROLLER_ONLY, operator: DoesNotExist }] }]
      containers:
        - name: csi-relay
          env: $API_ENV
          volumeMounts:
            - { name: member-disk, mountPath: $RUN/member-disk }
        - { name: node-driver-registrar, env: $API_ENV }
        - { name: liveness-probe, env: $API_ENV }
      volumes:
        - name: state
          hostPath: { path: $RUN/node-state, type: DirectoryOrCreate }
        - name: member-disk
          hostPath: { path: $RUN/member-disk, type: Directory }
EOF
kubectl kustomize "$RUN/kustomize" > "$RUN/kustomize/rendered.yaml"
if [[ $INSTALL == helm ]]; then
  # The same kit through the chart (deploy/ is also a Helm chart): the values that make what the
  # two Kustomize layers above make.
  mkdir -p "$RUN/helm"
  cat > "$RUN/helm/values.yaml" <<EOF
# Generated by tests/deploy-kit/up.sh for $RUN: the kit's overlay and layer above, as values.
images: { csi-relay: "localhost/csi-relay:0.1.0" }
imagePullPolicy: Never
healthAddress: 127.0.0.1
controller:
  tolerations: [{ key: $CONTROLLER_ONLY, operator: Exists, effect: NoSchedule }]
  extraEnv: $API_ENV
node:
  kubeletDir: $K
  stateDir: $RUN/node-state
  extraEnv: $API_ENV
  affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: $CONTROLLER_ONLY, operator: DoesNotExist }] }] } } }
  extraVolumes: [{ name: member-disk, hostPath: { path: $RUN/member-disk, type: Directory } }]
  extraVolumeMounts: [{ name: member-disk, mountPath: $RUN/member-disk }]
EOF
  # The release's namespace, made first with the Pod Security level the controller keeps
  # (README.md): the chart never makes it, and a privileged pod must be refused there.
  kh create namespace csi-relay > /dev/null
  kh label namespace csi-relay pod-security.kubernetes.io/enforce=restricted > /dev/null
  "$HELM" --kubeconfig "$HKC" install csi-relay "$REPO/deploy" -f "$RUN/helm/values.yaml" \
    --set-file "membersSecret.kubeconfigs.$MEMBER_NAME=$RUN/kustomize/member1.kubeconfig" > "$RUN/logs/kit-apply.log" 2>&1 \
    || { cat "$RUN/logs/kit-apply.log"; die "helm install"; }
  echo "helm $HELM" > "$RUN/installed-by"
  ts "helm install csi-relay deploy/ -n $HELM_NAMESPACE ($("$HELM" version --short))"
else
  kh apply -k "$RUN/kustomize" > "$RUN/logs/kit-apply.log" 2>&1 || { cat "$RUN/logs/kit-apply.log"; die "kubectl apply -k"; }
  echo kustomize > "$RUN/installed-by"
  ts "kubectl apply -k $RUN/kustomize: $(wc -l < "$RUN/logs/kit-apply.log") objects"
fi

# ---------- wait for the kit ----------
kh -n csi-relay-node rollout status daemonset/csi-relay-node --timeout=180s > /dev/null || {
  kh -n csi-relay-node get pods -o wide; kh -n csi-relay-node describe pods | tail -40; die "node DaemonSet not ready"; }
ts "node pod Ready: $(kh -n csi-relay-node get pods -l app=csi-relay-node -o name)"
kh -n csi-relay rollout status deployment/csi-relay-controller --timeout=180s > /dev/null || {
  kh -n csi-relay get pods -o wide; kh -n csi-relay describe pods -l app=csi-relay-controller | tail -40; die "controller Deployment not ready"; }
# One replica per node.
[[ "$(kh -n csi-relay get pods -l app=csi-relay-controller -o jsonpath='{.items[*].spec.nodeName}' | tr ' ' '\n' | sort | tr '\n' ' ')" == "$NODE $NODE2 " ]] \
  || { kh -n csi-relay get pods -o wide; die "the two controller replicas are not one on each node"; }
# Ready says only that the containers started: the relay leads (and serves controller calls) once
# it holds its Lease and has read the member (it exits on a refusal, e.g. RBAC in the member).
waitfor 60 "controller leading" sh -c "CP=\$(kubectl --kubeconfig '$HKC' -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.holderIdentity}'); kubectl --kubeconfig '$HKC' -n csi-relay logs \${CP%_*} -c csi-relay | grep -q 'leading: controller calls are served'" || {
  kh -n csi-relay logs -l app=csi-relay-controller -c csi-relay --tail=20; die "controller not leading"; }
CP=$(kh -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.holderIdentity}'); CP=${CP%_*}
ts "controller pods Ready, one per node; leading: $CP on $(kh -n csi-relay get pod "$CP" -o jsonpath='{.spec.nodeName}')"
waitfor 60 "CSINode $NODE with relay.csi.dev" sh -c \
  "[ \"\$(kubectl --kubeconfig '$HKC' get csinode $NODE -o jsonpath='{.spec.drivers[?(@.name==\"relay.csi.dev\")].nodeID}')\" = $NODE ]"
waitfor 30 "node label topology.relay.csi.dev/member" sh -c \
  "[ \"\$(kubectl --kubeconfig '$HKC' get node $NODE -o jsonpath='{.metadata.labels.topology\.relay\.csi\.dev/member}')\" = $MEMBER_NAME ]"
ts "driver registered on $NODE (CSINode topology keys: $(kh get csinode $NODE -o jsonpath='{.spec.drivers[0].topologyKeys}'))"
kh -n csi-relay get pods -o wide; kh -n csi-relay-node get pods -o wide
ts "up.sh done"
