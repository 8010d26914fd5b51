#!/bin/bash
# down.sh RUN_DIR: undoes up.sh. Workloads first, while the kit still runs, so that CSI teardown
# (NodeUnpublish/NodeUnstage, ControllerUnpublish, DeleteVolume) happens; then the kit, the
# kubelet node and scheduler (kubelet-node-down.sh), both control planes (cluster-down.sh --wipe),
# the shared LAB_DIR mount; then checks nothing is left: no mounts or loop devices under RUN_DIR,
# no process of this run. Logs stay in RUN_DIR/logs. Exit 1 if something is left.
set -uo pipefail
RUN=${1:?usage: down.sh RUN_DIR}
[[ -d $RUN ]] || { echo "no such dir $RUN" >&2; exit 1; }
RUN=$(cd "$RUN" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mkdir -p "$RUN/logs"
exec > >(tee -a "$RUN/logs/down.log") 2>&1
ts "down.sh $RUN"
rc=0
api_up() { kh get --raw /readyz > /dev/null 2>&1; }

# ---------- 1. user workloads, through CSI, while the kit runs ----------
if api_up; then
  for ns in "$USER_NS" "$HA_NS" "$SNAP_NS"; do
    kh get ns "$ns" > /dev/null 2>&1 || continue
    kh -n "$ns" delete volumesnapshots --all --wait=true --timeout=60s > /dev/null 2>&1
    kh -n "$ns" delete pods --all --grace-period=1 --wait=true --timeout=90s > /dev/null 2>&1
    kh -n "$ns" delete pvc --all --wait=true --timeout=90s > /dev/null 2>&1
  done
  waitfor 90 "relay PVs gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$HKC' get pv -o jsonpath='{.items[?(@.spec.csi.driver==\"relay.csi.dev\")].metadata.name}')\" ]" || rc=1
  waitfor 60 "VolumeAttachments gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$HKC' get volumeattachment -o name)\" ]" || rc=1
  for ns in "$USER_NS" "$HA_NS" "$SNAP_NS"; do kh delete ns "$ns" --wait=false > /dev/null 2>&1; done
  ts "user workloads deleted"
  # ---------- 2. the kit ----------
  if [[ -s $RUN/kustomize/kustomization.yaml ]]; then
    for ns in csi-relay csi-relay-node; do
      for p in $(kh -n $ns get pods -o name 2>/dev/null); do
        kh -n $ns logs --all-containers --prefix "$p" > "$RUN/logs/$(basename "$p").log" 2>&1
      done
    done
    read -r by helm < "$RUN/installed-by" 2>/dev/null || by=kustomize
    if [[ $by == helm ]]; then
      # Whatever helm.sh left installed (a release of either helm major; none after its uninstall).
      if "$helm" --kubeconfig "$HKC" status csi-relay > /dev/null 2>&1; then
        "$helm" --kubeconfig "$HKC" uninstall csi-relay --wait --timeout 90s > "$RUN/logs/kit-delete.log" 2>&1 || rc=1
      fi
      # The release's namespace, which up.sh made (the chart never does), with the last helm
      # test's pod in it.
      kh delete namespace csi-relay --wait=false > /dev/null 2>&1 || true
    else
      kh delete -k "$RUN/kustomize" --wait=true --timeout=90s > "$RUN/logs/kit-delete.log" 2>&1 || rc=1
    fi
    waitfor 60 "csi-relay pods gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$HKC' get pods -n csi-relay -o name 2>/dev/null)\$(kubectl --kubeconfig '$HKC' get pods -n csi-relay-node -o name 2>/dev/null)\" ]" || rc=1
    ts "kit deleted ($by)"
  fi
fi

# ---------- 3. kubelet nodes + scheduler ----------
if [[ -d $LAB2/state || -d $LAB2/pids ]]; then
  # A node frozen by a test that failed midway is thawed first, or it could not be stopped.
  for f in "$LAB2"/pids/*.pid; do [[ -s $f ]] && kill -CONT "$(cat "$f")" 2>/dev/null; done
  [[ -s $RUN/frozen.pids ]] && xargs -r kill -CONT < "$RUN/frozen.pids" 2>/dev/null
  if api_up; then "$KL/kubelet-node-down.sh" "$LAB2" "$HKC" "$NODE2" > "$RUN/logs/kubelet-node2-down.log" 2>&1 || rc=1
  else "$KL/kubelet-node-down.sh" "$LAB2" > "$RUN/logs/kubelet-node2-down.log" 2>&1 || rc=1; fi
  ts "kubelet node 2 down ($(tail -1 "$RUN/logs/kubelet-node2-down.log"))"
fi
if [[ -n "$(mounts_under "$LAB2")" ]]; then
  for mp in $(mounts_under "$LAB2"); do
    [[ $mp == "$LAB2" ]] || echo "warning: left mounted by node-down: $mp"
    umount "$mp" 2>/dev/null || umount -l "$mp" || rc=1
  done
fi
[[ -e /run/netns/$NETNS2 ]] && { ip netns delete "$NETNS2" || rc=1; }
if [[ -d $LAB/state || -d $LAB/pids ]]; then
  if api_up; then "$KL/kubelet-node-down.sh" "$LAB" "$HKC" "$NODE" > "$RUN/logs/kubelet-node-down.log" 2>&1 || rc=1
  else "$KL/kubelet-node-down.sh" "$LAB" > "$RUN/logs/kubelet-node-down.log" 2>&1 || rc=1; fi
  ts "kubelet node and scheduler down ($(tail -1 "$RUN/logs/kubelet-node-down.log"))"
fi
if [[ -n "$(mounts_under "$LAB")" ]]; then
  for mp in $(mounts_under "$LAB"); do
    [[ $mp == "$LAB" ]] || echo "warning: left mounted by node-down: $mp"
    umount "$mp" 2>/dev/null || umount -l "$mp" || rc=1
  done
fi

# ---------- 4. control planes ----------
for c in "$HOST" "$MEMBER"; do
  if [[ -d $E2E_HOME/run/$c/pids ]]; then
    "$E2E_ENV/cluster-down.sh" "$c" --wipe > "$RUN/logs/cluster-down-$c.log" 2>&1 || rc=1
    mkdir -p "$RUN/logs/$c"; cp -r "$E2E_HOME/run/$c/logs/." "$RUN/logs/$c/" 2>/dev/null
    rm -rf -- "${E2E_HOME:?}/run/$c" "$E2E_HOME/run/$c.kubeconfig"
  fi
done
ts "control planes down"

# ---------- 5. nothing left ----------
left=$(mounts_under "$RUN"; [[ -e $CTRD_STATE ]] && mounts_under "$CTRD_STATE"; [[ -e $CTRD_STATE2 ]] && mounts_under "$CTRD_STATE2")
[[ -n $left ]] && { echo "LEFT: mounts:"; echo "$left"; rc=1; }
loops=$(losetup -a 2>/dev/null | grep -F "$RUN" || true)
[[ -n $loops ]] && { echo "LEFT: loop devices:"; echo "$loops"; rc=1; }
[[ -e $CTRD_STATE ]] && { echo "LEFT: $CTRD_STATE"; rc=1; }
[[ -e $CTRD_STATE2 ]] && { echo "LEFT: $CTRD_STATE2"; rc=1; }
[[ -e /run/netns/$NETNS2 ]] && { echo "LEFT: network namespace $NETNS2"; rc=1; }
procs=$(ps -eo pid=,args= | grep -E -- "$LAB|$CTRD_STATE|$CTRD_STATE2|run/$HOST[/.]|run/$MEMBER[/.]|--secure-port=($HOST_PORT|$((HOST_PORT+3))|$MEMBER_PORT|$((MEMBER_PORT+3))|$SCHED_PORT)( |$)" | grep -v grep || true)
[[ -n $procs ]] && { echo "LEFT: processes:"; echo "$procs"; rc=1; }
for p in $HOST_PORT $((HOST_PORT+1)) $MEMBER_PORT $((MEMBER_PORT+1)) $SCHED_PORT $KL_PORT $KL_PORT2 9808 9809; do
  ss -Hltn "sport = :$p" | grep -q . && { echo "LEFT: port $p listening"; rc=1; }
done
rm -rf -- "$RUN/node-state" "$RUN/member-disk" "$RUN/kustomize" "$RUN"/csi-relay-0.1.0.tar
[[ $rc == 0 ]] && ts "down.sh done: nothing left" || ts "down.sh done WITH LEFTOVERS (rc=$rc)"
exit $rc
