#!/bin/bash
# helm.sh RUN_DIR: the chart's life on the kit that `KIT_INSTALL=helm up.sh RUN_DIR` installed with
# helm v4 (E2E_HOME/bin/helm), then again with helm v3 (E2E_HOME/bin/helm3):
#   1. `helm test`: csi-relay check in a pod with the controller's identity, exit 0;
#   2. `helm upgrade` changing a value (logFormat=json), with v4 while a claim with a pod arrives
#      every 2 s (ha.sh's case 2): the pods roll one at a time, no claim waits more than 20 s to be
#      Bound or attached; every relay container then runs with --log-format=json;
#   3. `helm rollback` to the first revision: the flag is gone again;
#   4. a user's claim and pod with data, then `helm uninstall`: every object of the chart is gone
#      but the CRD and the RelayVolumes (docs/operations.md); the pod still runs on its mount;
#   5. installed again with the other helm major: the new controller finds the volume (its
#      RelayVolume), the pod reads its data, and deleting pod and claim goes through CSI to the end
#      (nothing left in host or member).
# Prints PASS per step with figures; exit 1 on the first failure. Leaves the last install in place
# (down.sh uninstalls it).
set -Eeuo pipefail
RUN=${1:?usage: helm.sh RUN_DIR}
RUN=$(cd "$RUN" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exec > >(tee -a "$RUN/logs/helm.log") 2>&1
T_START=$(date +%s.%N)
ts "helm.sh $RUN"
trap 'ts "FAIL at line $LINENO: $BASH_COMMAND"; kh get pods -A -o wide' ERR
pass() { ts "PASS: $*"; }
HELM3=${KIT_HELM3:-$E2E_HOME/bin/helm3}
[[ -x $HELM && -x $HELM3 ]] || die "need $HELM and $HELM3"
read -r by _ < "$RUN/installed-by"
[[ $by == helm ]] || die "the kit was not installed with helm (KIT_INSTALL=helm up.sh)"
VALUES=(-f "$RUN/helm/values.yaml" --set-file "membersSecret.kubeconfigs.$MEMBER_NAME=$RUN/kustomize/member1.kubeconfig")
NS=$USER_NS
kh create ns "$NS" > /dev/null 2>&1 || true

relay_args() { # the args of every csi-relay container of the kit, one pod a line
  kh get pods -n csi-relay -l app=csi-relay-controller -o json | jq -r '.items[].spec.containers[] | select(.name=="csi-relay") | .args | join(" ")'
  kh get pods -n csi-relay-node -l app=csi-relay-node -o json | jq -r '.items[].spec.containers[] | select(.name=="csi-relay") | .args | join(" ")'
}
ready() { # the controller leading and the node plugin registered, as up.sh waits for them
  kh -n csi-relay-node rollout status daemonset/csi-relay-node --timeout=180s > /dev/null
  kh -n csi-relay rollout status deployment/csi-relay-controller --timeout=180s > /dev/null
  waitfor 90 "a leading controller" sh -c "CP=\$(kubectl --kubeconfig '$HKC' -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$CP\" ] && kubectl --kubeconfig '$HKC' -n csi-relay logs \${CP%_*} -c csi-relay | grep -q 'leading: controller calls are served'"
  waitfor 60 "CSINode $NODE with relay.csi.dev" sh -c \
    "[ \"\$(kubectl --kubeconfig '$HKC' get csinode $NODE -o jsonpath='{.spec.drivers[?(@.name==\"relay.csi.dev\")].nodeID}')\" = $NODE ]"
}
chart_objects() { # what the chart renders with the kit's values, as KIND/NAMESPACE/NAME
  "$1" template csi-relay "$REPO/deploy" "${VALUES[@]}" --skip-tests --include-crds \
    | kh create --dry-run=client -o json -f - \
    | jq -r 'if .kind=="List" then .items[] else . end | "\(.kind)/\(.metadata.namespace // "")/\(.metadata.name)"'
}
left_of() { # which of the chart's objects still exist
  local kind ns name
  while IFS=/ read -r kind ns name; do
    if [[ -n $ns ]]; then kh -n "$ns" get "$kind" "$name" > /dev/null 2>&1 && echo "$kind/$ns/$name"
    else kh get "$kind" "$name" > /dev/null 2>&1 && echo "$kind//$name"; fi
  done < <(chart_objects "$1")
  return 0
}

cycle() { # cycle HELM OTHER under-load|plain: steps 1-5 with HELM, the reinstall with OTHER
  local helm=$1 other=$2 v
  v=$("$helm" version --short)
  # ---------- 1. helm test ----------
  local t0; t0=$(date +%s.%N)
  "$helm" --kubeconfig "$HKC" test csi-relay --timeout 120s > "$RUN/logs/helm-test.log" 2>&1 \
    || { cat "$RUN/logs/helm-test.log"; kh -n csi-relay logs csi-relay-check; die "helm test ($v)"; }
  local summary; summary=$(kh -n csi-relay logs csi-relay-check | tail -1)
  [[ $summary == *" 0 problem(s), 0 not checked" ]] || { kh -n csi-relay logs csi-relay-check; die "check: $summary"; }
  pass "$v: helm test in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: $summary"

  # ---------- 2. helm upgrade under load ----------
  local rev; rev=$("$helm" --kubeconfig "$HKC" history csi-relay -o json | jq '.[-1].revision')
  local upgrade="'$helm' --kubeconfig '$HKC' upgrade csi-relay '$REPO/deploy' -f '$RUN/helm/values.yaml' --set-file 'membersSecret.kubeconfigs.$MEMBER_NAME=$RUN/kustomize/member1.kubeconfig' --set logFormat=json"
  if [[ $3 == under-load ]]; then
    HA_CASES=2 HA_ROLL_NAME="$v: helm upgrade --set logFormat=json" HA_ROLL="$upgrade" "$KIT/ha.sh" "$RUN"
  else
    t0=$(date +%s.%N)
    bash -c "$upgrade --wait --timeout 180s" > "$RUN/logs/helm-upgrade.log" 2>&1 || { cat "$RUN/logs/helm-upgrade.log"; die "helm upgrade ($v)"; }
    ts "$v: helm upgrade --wait took $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
  fi
  ready
  [[ -z "$(relay_args | grep -v -- '--log-format=json')" ]] || { relay_args; die "a relay container without --log-format=json after the upgrade"; }
  pass "$v: upgraded to revision $((rev + 1)): every csi-relay container runs with --log-format=json"

  # ---------- 3. helm rollback ----------
  "$helm" --kubeconfig "$HKC" rollback csi-relay "$rev" --wait --timeout 180s > "$RUN/logs/helm-rollback.log" 2>&1 \
    || { cat "$RUN/logs/helm-rollback.log"; die "helm rollback ($v)"; }
  ready
  [[ -z "$(relay_args | grep -- '--log-format')" ]] || { relay_args; die "--log-format still set after the rollback"; }
  pass "$v: rolled back to revision $rev (now revision $((rev + 2))): no --log-format again"

  # ---------- 4. a volume in use, then helm uninstall ----------
  kh apply -f - > /dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: kept, namespace: $NS }
spec:
  storageClassName: $CLASS
  accessModes: [ReadWriteOnce]
  resources: { requests: { storage: 16Mi } }
---
apiVersion: v1
kind: Pod
metadata: { name: kept, namespace: $NS }
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["sh", "-c", "[ -f /data/token ] || echo kept-$$ > /data/token; exec sleep 100000"]
      volumeMounts: [{ name: data, mountPath: /data }]
  volumes:
    - name: data
      persistentVolumeClaim: { claimName: kept }
EOF
  kh -n "$NS" wait pod/kept --for=condition=Ready --timeout=120s > /dev/null
  local token; token=$(kh -n "$NS" exec kept -- cat /data/token)
  local pv; pv=$(kh -n "$NS" get pvc kept -o jsonpath='{.spec.volumeName}')
  local vid; vid=$(kh get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')
  t0=$(date +%s.%N)
  "$helm" --kubeconfig "$HKC" uninstall csi-relay --wait --timeout 180s > "$RUN/logs/helm-uninstall.log" 2>&1 \
    || { cat "$RUN/logs/helm-uninstall.log"; die "helm uninstall ($v)"; }
  # The chart's node namespace goes; the release's own (csi-relay, up.sh made it) stays, with
  # only the last `helm test` pod in it (helm keeps a test hook's pod for its logs; the next
  # helm test replaces it).
  waitfor 120 "namespace csi-relay-node and the controller pods gone" sh -c \
    "! kubectl --kubeconfig '$HKC' get ns csi-relay-node > /dev/null 2>&1 && [ -z \"\$(kubectl --kubeconfig '$HKC' -n csi-relay get pods -l app=csi-relay-controller -o name)\" ]"
  [[ "$(kh -n csi-relay get pods -o name)" == "pod/csi-relay-check" ]] \
    || { kh -n csi-relay get pods; die "after helm uninstall, pods other than the last helm test's in csi-relay"; }
  local left; left=$(left_of "$helm")
  [[ $left == "CustomResourceDefinition//relayvolumes.relay.csi.dev" ]] || die "after helm uninstall, left: $left"
  local rvs; rvs=$(kh get relayvolumes -o name | wc -l)
  kh get relayvolumes -o jsonpath='{.items[*].spec.volumeId}' | tr ' ' '\n' | grep -qxF "$vid" || die "RelayVolume of $vid gone with the uninstall"
  kh -n "$NS" exec kept -- cat /data/token | grep -qxF "$token" || die "pod kept lost its data"
  pass "$v: helm uninstall in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: of the chart's objects only the CRD is left, with $rvs RelayVolume(s); pod kept still reads its data"

  # ---------- 5. installed again with the other major ----------
  local v2; v2=$("$other" version --short)
  t0=$(date +%s.%N)
  "$other" --kubeconfig "$HKC" install csi-relay "$REPO/deploy" "${VALUES[@]}" > "$RUN/logs/helm-reinstall.log" 2>&1 \
    || { cat "$RUN/logs/helm-reinstall.log"; die "helm install ($v2)"; }
  echo "helm $other" > "$RUN/installed-by"
  ready
  local took; took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  # The new controller rebuilt the volume from its RelayVolume: it unpublishes and deletes it.
  kh -n "$NS" exec kept -- cat /data/token | grep -qxF "$token" || die "pod kept lost its data after the reinstall"
  kh -n "$NS" delete pod kept --grace-period=1 --wait=true --timeout=120s > /dev/null
  kh -n "$NS" delete pvc kept --wait=true --timeout=120s > /dev/null
  waitfor 120 "PV $pv gone" sh -c "! kubectl --kubeconfig '$HKC' get pv $pv > /dev/null 2>&1"
  waitfor 60 "the RelayVolume of $vid gone" sh -c \
    "! kubectl --kubeconfig '$HKC' get relayvolumes -o jsonpath='{.items[*].spec.volumeId}' | tr ' ' '\n' | grep -qxF '$vid'"
  waitfor 60 "no VolumeAttachment of $pv" sh -c \
    "[ -z \"\$(kubectl --kubeconfig '$HKC' get volumeattachment -o jsonpath='{.items[?(@.spec.source.persistentVolumeName==\"$pv\")].metadata.name}')\" ]"
  [[ -z "$(km get pvc -A -l app.kubernetes.io/managed-by=csi-relay -o name)" ]] || die "member claims left: $(km get pvc -A -o name)"
  pass "$v2: installed again over the kept CRD, ready ${took} s later; it served volume $vid from its RelayVolume: the pod read its data, and its deletion went through CSI to the end (no PV, attachment, RelayVolume or member claim left)"
}

# The upgrade under load once (it is the same rollout whichever helm sends it).
cycle "$HELM" "$HELM3" under-load
cycle "$HELM3" "$HELM" plain
kh delete ns "$NS" --wait=false > /dev/null 2>&1 || true
ts "helm.sh done"
