# env-lib.sh: what the project's environment scripts (tests/*/env-up.sh)
# share. Sourced; starts the clock ts() measures from.
T0=$(date +%s.%N)
ts() { printf '[%6.2fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="$T0" 'BEGIN{print a-b}')" "$*"; }
waitfor() { # waitfor SECONDS WHAT CMD... : polls CMD every 0.2 s
  local t=$1 what=$2 i; shift 2
  for ((i = 0; i < t * 5; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "timed out after ${t}s waiting for: $what" >&2; return 1
}
sidecar_gates() { # sidecar_gates CONTAINER KUBECONFIG: the extra args deploy/ gives sidecar CONTAINER
  # (csi-resizer, ...) on that cluster's Kubernetes, so a sidecar run here as a process runs as
  # deploy/ runs it: deploy/kubernetes-1.28-1.31's gates for 1.28 to 1.31, none from 1.32 on.
  local minor component
  component="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/kubernetes-1.28-1.31/kustomization.yaml"
  minor=$(kubectl --kubeconfig "$2" version -o json 2>/dev/null | jq -r '.serverVersion.minor' | tr -dc 0-9)
  [[ -n $minor ]] || { echo "sidecar_gates: no server version from $2" >&2; return 1; }
  ((minor < 32)) || return 0
  # The component's patches: a test op naming the container, then the arg it adds.
  awk -v c="$1" '$1 == "value:" { if ($2 ~ /^--feature-gates=/) { if (name == c) print $2 } else name = $2 }' "$component"
}
kubelet_client_ca() { # kubelet_client_ca CLUSTER_CA OUT: the x509 client CA bundle a kubelet needs so that its
  # API server, started with APISERVER_EXTRA's client cert (tests/k8s-e2e/apiserver-extra.sh), may
  # reach it (port-forward, exec, logs): the cluster CA, plus that cert's CA when the cluster CA did
  # not sign it. Prints OUT's path.
  local crt
  cat "$1" > "$2"
  crt=$(tr ' ' '\n' <<< "${APISERVER_EXTRA:-}" | sed -n 's/^--kubelet-client-certificate=//p')
  if [[ -n $crt ]] && ! openssl verify -CAfile "$1" "$crt" > /dev/null 2>&1 &&
    [[ -s $(dirname "$crt")/kubelet-client-ca.crt ]]; then
    cat "$(dirname "$crt")/kubelet-client-ca.crt" >> "$2"
  fi
  echo "$2"
}
node_on_loopback() { # node_on_loopback KUBECONFIG NODE: its InternalIP 127.0.0.1, which the kubelet refuses
  # as --node-ip and so leaves alone, for the API server's calls to it (APISERVER_EXTRA prefers InternalIP).
  kubectl --kubeconfig "$1" patch node "$2" --subresource=status --type=merge \
    -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"127.0.0.1\"},{\"type\":\"Hostname\",\"address\":\"$2\"}]}}" > /dev/null
}
