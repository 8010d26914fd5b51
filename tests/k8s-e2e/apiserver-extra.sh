#!/usr/bin/env bash
# apiserver-extra.sh PKI_DIR: prints the APISERVER_EXTRA the two-cluster
# env-up.sh must be started with so that the API server can reach a kubelet
# on 127.0.0.1 (kubectl exec/logs/port-forward, which the e2e suite uses):
#   export APISERVER_EXTRA="$(tests/k8s-e2e/apiserver-extra.sh /some/dir/pki)"
#   tests/e2e-env/env-up.sh
# Why its own CA: env-up.sh starts host and member in parallel with the same
# APISERVER_EXTRA, and on a fresh machine neither cluster's PKI exists before
# its cluster-up.sh makes it. So this makes (once, kept across runs) a small CA
# and a client certificate "kube-apiserver-kubelet-client" in group
# system:masters, before env-up; both API servers present it to kubelets, and
# env-up.sh (tests/k8s-e2e) gives the kubelet that CA (plus the cluster CA) as
# its x509 client CA bundle. The kubelet authorizes the request by a
# SubjectAccessReview, which system:masters passes.
set -euo pipefail
P=${1:?usage: apiserver-extra.sh PKI_DIR}
mkdir -p "$P"; P=$(cd "$P" && pwd)
if [[ ! -s $P/kubelet-client.crt ]]; then
  ( cd "$P"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout kubelet-client-ca.key -out kubelet-client-ca.crt \
      -days 3650 -subj "/CN=k8s-e2e-kubelet-client-ca" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' > client.ext
    openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    openssl x509 -req -in kubelet-client.csr -CA kubelet-client-ca.crt -CAkey kubelet-client-ca.key \
      -CAcreateserial -out kubelet-client.crt -days 3650 -extfile client.ext 2>/dev/null
    rm -f kubelet-client.csr client.ext; chmod 600 ./*.key )
fi
echo "--kubelet-preferred-address-types=InternalIP --kubelet-client-certificate=$P/kubelet-client.crt --kubelet-client-key=$P/kubelet-client.key"
