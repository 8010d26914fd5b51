#!/bin/bash
# cluster-up.sh NAME PORT_BASE
#   Starts an independent etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 only.
#   Ports:  kube-apiserver https  = PORT_BASE
#           etcd client (http)    = PORT_BASE+1
#           etcd peer   (http)    = PORT_BASE+2
#           kube-controller-manager https (healthz/metrics) = PORT_BASE+3
#   ValidatingAdmissionPolicy served (v1beta1 on v1.28): deploy/member/admission-v1beta1 installs there.
#   State:  $E2E_HOME/run/NAME/{pki,etcd,logs,pids,*.kubeconfig}
#   Output: $E2E_HOME/run/NAME.kubeconfig  (admin, group system:masters, client cert)
#   Stop with: $(dirname "$0")/cluster-down.sh NAME [--wipe]
# Notes: no kubelet/scheduler. Fake Nodes need annotation volumes.kubernetes.io/controller-managed-attach-detach=true
#   (+ a CSINode with the driver's nodeID) for the attach/detach controller; set pod.spec.nodeName yourself.
#   KCM_CONTROLLERS='*,-nodelifecycle' stops heartbeat-less fake nodes being tainted / their pods evicted (~5 min).
# Env knobs: KCM_CONTROLLERS (default "*"), KCM_USE_SA_CREDS (default true), APISERVER_EXTRA, KCM_EXTRA, V (log level, default 2),
#   AUDIT=1: the API server logs every finished request (user, user agent, verb, resource; no bodies) to
#   $R/logs/audit.log (policy: audit-policy.yaml beside this script), for counting requests by caller.
set -euo pipefail
NAME=${1:?usage: cluster-up.sh NAME PORT_BASE}
PORT_BASE=${2:?usage: cluster-up.sh NAME PORT_BASE}
[[ "$NAME" =~ ^[a-z0-9][a-z0-9-]*$ ]] || { echo "bad NAME" >&2; exit 2; }
[[ "$PORT_BASE" =~ ^[0-9]+$ ]] && (( PORT_BASE > 1024 && PORT_BASE < 65530 )) || { echo "bad PORT_BASE" >&2; exit 2; }

H=${E2E_HOME:?set E2E_HOME to the folder holding bin/ and run/}; BIN=$H/bin; R=$H/run/$NAME
API_PORT=$PORT_BASE; ETCD_PORT=$((PORT_BASE+1)); PEER_PORT=$((PORT_BASE+2)); KCM_PORT=$((PORT_BASE+3))
V=${V:-2}
mkdir -p $R/pki $R/logs $R/pids $R/etcd
AUDIT_ARGS=
# An earlier run's log would pass for this one's.
rm -f $R/logs/audit.log $R/logs/audit-*.log
if [[ ${AUDIT:-0} == 1 ]]; then
  # One file for the whole run: a maxsize of 0 means 100 MB to the API
  # server's log rotation, and a count across a rotation loses requests.
  AUDIT_ARGS="--audit-policy-file=$(cd "$(dirname "$0")" && pwd)/audit-policy.yaml --audit-log-path=$R/logs/audit.log --audit-log-format=json --audit-log-maxsize=1000000"
fi
chmod 700 $R/etcd

alive() { # alive PIDFILE EXPECTED_BINARY
  local f=$1 exe=$2 pid
  [[ -s $f ]] || return 1
  pid=$(cat $f); [[ -d /proc/$pid ]] || return 1
  [[ "$(readlink /proc/$pid/exe 2>/dev/null)" == "$exe"* ]]
}
for c in etcd kube-apiserver kube-controller-manager; do
  exe=$BIN/$c; [[ $c == etcd ]] && exe=$(readlink -f "$(command -v etcd)")
  if alive $R/pids/$c.pid "$exe"; then echo "cluster $NAME: $c already running (pid $(cat $R/pids/$c.pid)); run cluster-down.sh $NAME first" >&2; exit 1; fi
done
for p in $API_PORT $ETCD_PORT $PEER_PORT $KCM_PORT; do
  if ss -Hltn "sport = :$p" | grep -q .; then echo "port $p already in use" >&2; exit 1; fi
done

# ---------- PKI (generated once per cluster name; reused on restart) ----------
P=$R/pki
if [[ ! -s $P/ca.crt ]]; then
  ( cd $P
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj "/CN=$NAME-ca" 2>/dev/null
    cat > apiserver.ext <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
    mk() { # mk NAME SUBJ EXTFILE
      openssl req -newkey rsa:2048 -nodes -keyout $1.key -out $1.csr -subj "$2" 2>/dev/null
      openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out $1.crt -days 3650 -extfile $3 2>/dev/null
      rm -f $1.csr
    }
    mk apiserver "/CN=kube-apiserver" apiserver.ext
    mk admin "/O=system:masters/CN=admin" client.ext
    mk kcm "/CN=system:kube-controller-manager" client.ext
    # front-proxy (aggregation layer) CA + client, as kubeadm does
    openssl req -x509 -newkey rsa:2048 -nodes -keyout front-proxy-ca.key -out front-proxy-ca.crt -days 3650 -subj "/CN=$NAME-front-proxy-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout front-proxy-client.key -out front-proxy-client.csr -subj "/CN=front-proxy-client" 2>/dev/null
    openssl x509 -req -in front-proxy-client.csr -CA front-proxy-ca.crt -CAkey front-proxy-ca.key -CAcreateserial -out front-proxy-client.crt -days 3650 -extfile client.ext 2>/dev/null
    rm -f front-proxy-client.csr
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    echo "$(openssl rand -hex 16),admin,admin,system:masters" > token.csv
    chmod 600 *.key token.csv )
fi

mkkubeconfig() { # mkkubeconfig FILE USER CERT KEY
  cat > $1 <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $NAME
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 $P/ca.crt)
contexts:
- name: $NAME
  context: {cluster: $NAME, user: $2}
current-context: $NAME
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 $3)
    client-key-data: $(base64 -w0 $4)
EOF
  chmod 600 $1
}
mkkubeconfig $R/admin.kubeconfig admin $P/admin.crt $P/admin.key
mkkubeconfig $R/kcm.kubeconfig system:kube-controller-manager $P/kcm.crt $P/kcm.key
cp $R/admin.kubeconfig $H/run/$NAME.kubeconfig

# on any failure below, stop whatever this run started
trap 'echo "cluster-up $NAME failed; stopping what was started" >&2; "$(dirname "$0")/cluster-down.sh" $NAME' ERR
start() { # start NAME CMD... ; setsid so it survives this shell; pid file holds the binary's own pid
  local n=$1; shift
  echo "=== $(date -u +%FT%TZ) cluster-up $NAME starting $n" >>$R/logs/$n.log
  setsid "$@" >>$R/logs/$n.log 2>&1 < /dev/null &
  echo $! > $R/pids/$n.pid
}
waitfor() { # waitfor COMPONENT TIMEOUT CMD...   (fails early if the component's process died)
  local d=$1 t=$2; shift 2
  for ((i=0;i<t;i++)); do
    "$@" >/dev/null 2>&1 && return 0
    [[ -d /proc/$(cat $R/pids/$d.pid) ]] || { echo "$d exited early; see $R/logs/$d.log" >&2; return 1; }
    sleep 1
  done
  echo "timeout waiting for $d (see $R/logs)" >&2; return 1
}

# ---------- etcd ----------
start etcd etcd --name $NAME --data-dir $R/etcd \
  --listen-client-urls http://127.0.0.1:$ETCD_PORT --advertise-client-urls http://127.0.0.1:$ETCD_PORT \
  --listen-peer-urls http://127.0.0.1:$PEER_PORT --initial-advertise-peer-urls http://127.0.0.1:$PEER_PORT \
  --initial-cluster $NAME=http://127.0.0.1:$PEER_PORT --initial-cluster-token $NAME-etcd \
  --log-level warn
waitfor etcd 60 curl -sf http://127.0.0.1:$ETCD_PORT/health

# ---------- kube-apiserver ----------
start kube-apiserver $BIN/kube-apiserver \
  --bind-address=127.0.0.1 --secure-port=$API_PORT --advertise-address=127.0.0.1 \
  --endpoint-reconciler-type=none \
  --etcd-servers=http://127.0.0.1:$ETCD_PORT --etcd-prefix=/registry \
  --tls-cert-file=$P/apiserver.crt --tls-private-key-file=$P/apiserver.key \
  --client-ca-file=$P/ca.crt --token-auth-file=$P/token.csv \
  --requestheader-client-ca-file=$P/front-proxy-ca.crt --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --proxy-client-cert-file=$P/front-proxy-client.crt --proxy-client-key-file=$P/front-proxy-client.key \
  --service-account-key-file=$P/sa.pub --service-account-signing-key-file=$P/sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.0.0.0/24 \
  --authorization-mode=Node,RBAC --allow-privileged=true \
  --feature-gates=ValidatingAdmissionPolicy=true --runtime-config=admissionregistration.k8s.io/v1beta1=true \
  --profiling=false --v=$V ${APISERVER_EXTRA:-} $AUDIT_ARGS
waitfor kube-apiserver 180 kubectl --kubeconfig $R/admin.kubeconfig get --raw /readyz

# ---------- kube-controller-manager ----------
start kube-controller-manager $BIN/kube-controller-manager \
  --bind-address=127.0.0.1 --secure-port=$KCM_PORT \
  --kubeconfig=$R/kcm.kubeconfig --authentication-kubeconfig=$R/kcm.kubeconfig --authorization-kubeconfig=$R/kcm.kubeconfig \
  --leader-elect=false --cluster-name=$NAME \
  --controllers="${KCM_CONTROLLERS:-*}" \
  --use-service-account-credentials=${KCM_USE_SA_CREDS:-true} \
  --service-account-private-key-file=$P/sa.key --root-ca-file=$P/ca.crt \
  --cluster-signing-cert-file=$P/ca.crt --cluster-signing-key-file=$P/ca.key \
  --profiling=false --v=$V ${KCM_EXTRA:-}
waitfor kube-controller-manager 120 curl -skf https://127.0.0.1:$KCM_PORT/healthz

echo "cluster $NAME up: apiserver https://127.0.0.1:$API_PORT etcd :$ETCD_PORT kcm :$KCM_PORT"
echo "kubeconfig: $H/run/$NAME.kubeconfig   logs: $R/logs   pids: $(cd $R/pids && for f in *.pid; do printf '%s=%s ' ${f%.pid} $(cat $f); done)"
