#!/bin/bash
# kubelet-node-up.sh KUBECONFIG NODE_NAME PORT LAB_DIR
#   Runs a real kubelet (plus its own containerd) as Node NODE_NAME of the cluster in KUBECONFIG.
#   Everything lives under LAB_DIR except containerd's state dir (CTRD_STATE, short path for sockets),
#   the kubelet's hard-wired pod log dirs (/var/log/pods, /var/log/containers) and shim sockets that
#   containerd 1.6 always puts in /run/containerd/s/.
#   Ports: kubelet https = PORT (bound to KUBELET_ADDRESS), kubelet healthz = PORT+1 (127.0.0.1).
#   Layout: LAB_DIR/{containerd/ (root), containerd.toml, cni/{bin,net.d}, images/*.tar, kubelet/ (--root-dir),
#           kubelet-config.yaml, logs/{containerd,kubelet}.log, pids/NAME.{pid,exe,start}, state/sysctl.orig, node.env}
#   CSI: driver socket dirs go in LAB_DIR/kubelet/plugins/<driver>/, registration sockets in LAB_DIR/kubelet/plugins_registry/.
#   Stop with kubelet-node-down.sh LAB_DIR [KUBECONFIG NODE_NAME].
# Env knobs (defaults in brackets):
#   BIN_DIR      dir with `kubelet` and a static `pause` binary            [LAB_DIR/bin]
#   BUSYBOX      static busybox binary for the busybox image              [$(command -v busybox)]
#   CNI_BIN_DIR  stock CNI plugins (needs `loopback`)                      [first of /usr/lib/cni /opt/cni/bin]
#   CTRD_STATE   containerd state dir (holds containerd.sock)             [/run/kl-containerd]
#   SNAPSHOTTER  overlayfs | native                                       [overlayfs if a test overlay mount works]
#   NODE_IP      --node-ip [127.0.0.1]. The kubelet refuses loopback here, so the Node gets no address until
#                you patch it (../README.md: network rule). Never set the machine's own address or any other
#                one outside a network namespace your tests made.
#   KUBELET_ADDRESS  kubelet https bind address                           [127.0.0.1]
#   KUBELET_CLIENT_CA  CA for clients of the kubelet API (x509 authn; authz by SubjectAccessReview)
#                                                                         [the CA in KUBECONFIG]
#   PAUSE_IMAGE / BUSYBOX_IMAGE                                          [localhost/pause:3.9 / localhost/busybox:1.35]
#   KUBELET_V    kubelet log level [2]; READY_TIMEOUT seconds [120]; KUBELET_EXTRA extra kubelet flags
#   POD_FORWARD  JSON {"namespaces": [NS...], "in": [PORT...], "out": [PORT...]}: pods of those namespaces
#                reach the node's 127.0.0.1:PORT ("in", e.g. API servers) on their own loopback, and the node
#                reaches theirs ("out", e.g. a health port), without hostNetwork (podlocal-forward.py)  [unset]
#   POD_NETWORK  a network namespace name (/run/netns/NAME) the caller made: pods get an address in
#                10.88.0.0/16 on a bridge there, and reach the pods of every kubelet given the same NAME
#                (cni-podlocal.py "podnet")                                                      [unset]
#   POD_LOG_DIR  run containerd and the kubelet in a mount namespace of their own where /var/log/pods and
#                /var/log/containers are POD_LOG_DIR/{pods,containers}: needed when another kubelet runs on
#                the machine, since every kubelet's container GC deletes the pod log dirs of pods it does
#                not know, and a container whose log dir is gone cannot be (re)started. LAB_DIR is then
#                bound onto itself and made rshared, so CSI mounts made outside still reach the kubelet's
#                containers and Bidirectional mounts of its pods reach the host.     [unset: host's dirs]
set -Eeuo pipefail
KC=${1:?usage: kubelet-node-up.sh KUBECONFIG NODE_NAME PORT LAB_DIR}
NODE=${2:?usage: kubelet-node-up.sh KUBECONFIG NODE_NAME PORT LAB_DIR}
PORT=${3:?usage: kubelet-node-up.sh KUBECONFIG NODE_NAME PORT LAB_DIR}
LAB=${4:?usage: kubelet-node-up.sh KUBECONFIG NODE_NAME PORT LAB_DIR}
T0=$(date +%s.%N)
SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$LAB"; LAB=$(cd "$LAB" && pwd); KC=$(readlink -f "$KC")
source "$SCRIPTS/kl-lib.sh"

[[ "$NODE" =~ ^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$ ]] || { echo "bad NODE_NAME" >&2; exit 2; }
[[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT > 1024 && PORT < 65534 )) || { echo "bad PORT" >&2; exit 2; }
[[ -r $KC ]] || { echo "kubeconfig $KC not readable" >&2; exit 2; }
BIN_DIR=$(readlink -f "${BIN_DIR:-$LAB/bin}")
BUSYBOX=${BUSYBOX:-$(command -v busybox || true)}
if [[ -z ${CNI_BIN_DIR:-} ]]; then for d in /usr/lib/cni /opt/cni/bin; do [[ -x $d/loopback ]] && { CNI_BIN_DIR=$d; break; }; done; fi
CTRD_STATE=${CTRD_STATE:-/run/kl-containerd}
NODE_IP=${NODE_IP-127.0.0.1}; [[ $NODE_IP == auto ]] && NODE_IP=""
KUBELET_ADDRESS=${KUBELET_ADDRESS:-127.0.0.1}
PAUSE_IMAGE=${PAUSE_IMAGE:-localhost/pause:3.9}
BUSYBOX_IMAGE=${BUSYBOX_IMAGE:-localhost/busybox:1.35}
KUBELET_V=${KUBELET_V:-2}; READY_TIMEOUT=${READY_TIMEOUT:-120}
SOCK=$CTRD_STATE/containerd.sock
CONTAINERD=$(readlink -f "$(command -v containerd)"); CTR=$(command -v ctr); RUNC=${RUNC:-$(readlink -f "$(command -v runc)")}
KUBELET=$BIN_DIR/kubelet; PAUSE_BIN=$BIN_DIR/pause

# ---------- preflight ----------
for f in "$KUBELET" "$PAUSE_BIN" "$BUSYBOX" "$CONTAINERD" "$RUNC" "$CNI_BIN_DIR/loopback"; do
  [[ -x $f ]] || { echo "missing executable: '$f'" >&2; exit 2; }
done
for f in "$PAUSE_BIN" "$BUSYBOX"; do
  if LC_ALL=C ldd "$f" >/dev/null 2>&1; then echo "$f is dynamically linked; a static binary is needed" >&2; exit 2; fi
done
for c in ip nsenter python3 kubectl mount umount ss; do command -v $c >/dev/null || { echo "need $c" >&2; exit 2; }; done
for n in containerd kubelet; do
  if kl_alive $n; then echo "$n already running (pid $(cat $LAB/pids/$n.pid)); run kubelet-node-down.sh first" >&2; exit 1; fi
done
for p in $PORT $((PORT+1)); do
  if ss -Hltn "sport = :$p" | grep -q .; then echo "port $p already in use" >&2; exit 1; fi
done
[[ -S $SOCK ]] && { echo "$SOCK exists (another containerd, or leftovers: run kubelet-node-down.sh)" >&2; exit 1; }
if [[ -n "$(kl_mounts_under "$LAB/kubelet" "$LAB/containerd" "$CTRD_STATE")" ]]; then
  echo "mounts left under $LAB or $CTRD_STATE; run kubelet-node-down.sh first" >&2; exit 1; fi
if [[ -n ${POD_LOG_DIR:-} && -z ${KL_OWN_MOUNT_NS:-} ]]; then
  mkdir -p "$LAB/state" "$POD_LOG_DIR/pods" "$POD_LOG_DIR/containers"; POD_LOG_DIR=$(cd "$POD_LOG_DIR" && pwd)
  # The bind targets must exist on the host; remember whether they did (node-down rmdirs them).
  for d in /var/log/pods /var/log/containers; do [[ -e $d ]] && echo "existed $d"; done > "$LAB/state/host-dirs"
  mkdir -p /var/log/pods /var/log/containers
  echo "$POD_LOG_DIR" > "$LAB/state/pod-log-dir"
  if ! findmnt -rn -o TARGET --mountpoint "$LAB" > /dev/null; then mount --bind "$LAB" "$LAB"; fi
  mount --make-rshared "$LAB"
  KL_OWN_MOUNT_NS=1 exec unshare --mount --propagation unchanged -- sh -c \
    'mount --bind "$0/pods" /var/log/pods && mount --bind "$0/containers" /var/log/containers && exec "$@"' \
    "$POD_LOG_DIR" "$0" "$@"
fi
mkdir -p "$LAB"/{logs,pids,state,images,cni/bin,cni/net.d,containerd,kubelet} "$CTRD_STATE"
echo "$CTRD_STATE" > "$LAB/state/ctrd_state"
# host paths outside LAB_DIR that containerd/kubelet create: remember which existed, node-down rmdirs the others if empty
if [[ ! -e $LAB/state/host-dirs || -n ${KL_OWN_MOUNT_NS:-} ]]; then
  for d in /var/log/pods /var/log/containers /run/containerd /run/containerd/s /sys/fs/cgroup/*/k8s.io; do
    [[ -z ${KL_OWN_MOUNT_NS:-} || $d != /var/log/* ]] || continue   # recorded before the bind
    [[ -e $d ]] && echo "existed $d"
  done >> "$LAB/state/host-dirs"
  # the kubelet writes container logs to /var/log/pods/<ns>_<pod>_<uid>/ (hard-wired in 1.26); node-down removes entries not listed here
  ls -A /var/log/pods /var/log/containers 2>/dev/null > "$LAB/state/var-log.before" || true
fi

# on failure, undo what this run started
trap 'echo "kubelet-node-up failed; stopping what was started" >&2; "$SCRIPTS/kubelet-node-down.sh" "$LAB" >&2 || true' ERR

# ---------- kernel tunables the kubelet will overwrite: remember them for node-down ----------
if [[ ! -s $LAB/state/sysctl.orig ]]; then
  for s in $KL_SYSCTLS; do echo "$s $(cat /proc/sys/$s)"; done > "$LAB/state/sysctl.orig"
fi

# ---------- images (OCI archives, no registry) ----------
IMG=$LAB/images
python3 "$SCRIPTS/mkimage.py" --tag "$PAUSE_IMAGE" --out "$IMG/pause.tar" \
  --file "$PAUSE_BIN:/pause:755" --entrypoint '["/pause"]' >/dev/null
BBARGS=(--file "$BUSYBOX:/bin/busybox:755" --dir tmp:1777 --dir etc --dir root:700 --dir var --dir proc --dir sys --dir dev)
for a in sh ash sleep cat echo ls mount umount df dd sync mkdir rm touch cp mv ln stat test '[' true false \
         grep sed awk head tail wc tr find xargs id env hostname ps kill date du printf seq md5sum sha256sum tee uname; do
  BBARGS+=(--link "bin/$a:busybox")
done
python3 "$SCRIPTS/mkimage.py" --tag "$BUSYBOX_IMAGE" --out "$IMG/busybox.tar" "${BBARGS[@]}" --cmd '["sh"]' >/dev/null

# ---------- CNI: pods get eth0 as an isolated in-pod veth pair (nothing on the host) ----------
ln -sfn "$SCRIPTS/cni-podlocal.py" "$LAB/cni/bin/podlocal"
ln -sfn "$CNI_BIN_DIR/loopback" "$LAB/cni/bin/loopback"
# POD_FORWARD: loopback ports between the node and pods of some namespaces (podlocal-forward.py).
FORWARD=
if [[ -n ${POD_FORWARD:-} ]]; then
  FORWARD=$(python3 -c 'import json,sys; f=json.loads(sys.argv[1]); f["pidDir"]=sys.argv[2]; print(", \"forward\": " + json.dumps(f))' "$POD_FORWARD" "$LAB/pids")
fi
PODNET=
if [[ -n ${POD_NETWORK:-} ]]; then
  [[ -e /run/netns/$POD_NETWORK ]] || { echo "POD_NETWORK: no network namespace /run/netns/$POD_NETWORK" >&2; exit 2; }
  PODNET=", \"podnet\": \"$POD_NETWORK\""
fi
cat > "$LAB/cni/net.d/10-podlocal.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "podlocal", "plugins": [{"type": "podlocal", "subnet": "10.88.0.0/16"$FORWARD$PODNET}]}
EOF

# ---------- snapshotter ----------
if [[ -z ${SNAPSHOTTER:-} ]]; then
  t=$LAB/containerd/.ovl-test; mkdir -p $t/{l,u,w,m}
  if mount -t overlay overlay -o lowerdir=$t/l,upperdir=$t/u,workdir=$t/w $t/m 2>/dev/null; then umount $t/m; SNAPSHOTTER=overlayfs
  else SNAPSHOTTER=native; fi
  rm -rf "$t"
fi

# ---------- containerd ----------
# Without CAP_SYS_RESOURCE (sandboxed VMs) runc cannot lower oom_score_adj: the kubelet asks -998 for every
# pod sandbox and runc init dies ("can't get final child's PID from pipe: EOF"). restrict_oom_score_adj makes
# containerd clamp it to its own value.
RESTRICT_OOM=false
(( (0x$(awk '/^CapEff/{print $2}' /proc/self/status) >> 24) & 1 )) || RESTRICT_OOM=true
cat > "$LAB/containerd.toml" <<EOF
version = 2
root = "$LAB/containerd"
state = "$CTRD_STATE"
oom_score = 0
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[debug]
  level = "info"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$LAB/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    disable_apparmor = true
    enable_selinux = false
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = $RESTRICT_OOM
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$LAB/cni/bin"
      conf_dir = "$LAB/cni/net.d"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "$SNAPSHOTTER"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "$RUNC"
          Root = "$CTRD_STATE/runc"
          SystemdCgroup = false
EOF
kl_start containerd "$LAB/logs/containerd.log" "$CONTAINERD" --config "$LAB/containerd.toml"
for ((i=0;i<60;i++)); do
  "$CTR" -a "$SOCK" version >/dev/null 2>&1 && break
  kl_alive containerd || { echo "containerd exited; see $LAB/logs/containerd.log" >&2; false; }
  sleep 0.5
done
"$CTR" -a "$SOCK" version >/dev/null
for f in "$IMG/pause.tar" "$IMG/busybox.tar"; do
  "$CTR" -a "$SOCK" -n k8s.io images import --snapshotter "$SNAPSHOTTER" "$f" >> "$LAB/logs/containerd.log" 2>&1
done
# The list is read whole first: `ctr ... | grep -q` under pipefail fails when grep's early exit
# hits ctr with SIGPIPE.
images=$("$CTR" -a "$SOCK" -n k8s.io images ls -q)
for want in "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"; do
  grep -qxF "$want" <<< "$images" || { echo "image $want not imported" >&2; false; }
done
T_CTRD=$(date +%s.%N)

# ---------- kubelet ----------
CA_FILE=$LAB/state/kubelet-client-ca.crt
if [[ -n ${KUBELET_CLIENT_CA:-} ]]; then cp "$KUBELET_CLIENT_CA" "$CA_FILE"
else
  ca=$(kubectl config view --kubeconfig "$KC" --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  if [[ -n $ca ]]; then echo "$ca" | base64 -d > "$CA_FILE"
  else cp "$(kubectl config view --kubeconfig "$KC" --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')" "$CA_FILE"; fi
fi
cat > "$LAB/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $KUBELET_ADDRESS
port: $PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((PORT+1))
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $CA_FILE}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
protectKernelDefaults: false
volumePluginDir: $LAB/kubelet/volume-plugins
resolvConf: ""
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 50
nodeStatusUpdateFrequency: 10s
containerLogMaxSize: 1Mi
containerLogMaxFiles: 2
EOF
KARGS=(--config="$LAB/kubelet-config.yaml" --kubeconfig="$KC" --root-dir="$LAB/kubelet" --cert-dir="$LAB/kubelet/pki"
  --container-runtime-endpoint="unix://$SOCK" --containerd="$SOCK" --pod-infra-container-image="$PAUSE_IMAGE"
  --hostname-override="$NODE" --v="$KUBELET_V")
[[ -n $NODE_IP ]] && KARGS+=(--node-ip="$NODE_IP")
kl_start kubelet "$LAB/logs/kubelet.log" "$KUBELET" "${KARGS[@]}" ${KUBELET_EXTRA:-}

ready=""
for ((i=0;i<READY_TIMEOUT*2;i++)); do
  kl_alive kubelet || { echo "kubelet exited; see $LAB/logs/kubelet.log" >&2; false; }
  r=$(kubectl --kubeconfig "$KC" get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)
  [[ $r == True ]] && { ready=1; break; }
  sleep 0.5
done
[[ -n $ready ]] || { echo "node $NODE not Ready after ${READY_TIMEOUT}s; see $LAB/logs/kubelet.log" >&2; false; }
T_READY=$(date +%s.%N)
trap - ERR

cat > "$LAB/node.env" <<EOF
export KL_NODE=$NODE
export KL_KUBECONFIG=$KC
export KL_LAB=$LAB
export KL_CONTAINERD_SOCK=$SOCK
export KL_KUBELET_ROOT=$LAB/kubelet
export KL_PLUGINS_DIR=$LAB/kubelet/plugins
export KL_REGISTRATION_DIR=$LAB/kubelet/plugins_registry
export KL_PAUSE_IMAGE=$PAUSE_IMAGE
export KL_BUSYBOX_IMAGE=$BUSYBOX_IMAGE
EOF
dt() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }
echo "node $NODE Ready: containerd+images $(dt $T0 $T_CTRD)s, kubelet start->Ready $(dt $T_CTRD $T_READY)s (total $(dt $T0 $T_READY)s); snapshotter=$SNAPSHOTTER"
echo "pids: containerd=$(cat $LAB/pids/containerd.pid) kubelet=$(cat $LAB/pids/kubelet.pid); env: $LAB/node.env; logs: $LAB/logs"
