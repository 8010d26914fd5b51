#!/bin/bash
# kubelet-node-down.sh LAB_DIR [KUBECONFIG NODE_NAME]
#   Undoes kubelet-node-up.sh: (with KUBECONFIG+NODE_NAME: deletes the node's pods while the kubelet still runs,
#   so volumes get NodeUnpublish/NodeUnstage, then deletes the Node), stops the kubelet and containerd by their
#   recorded PIDs, removes leftover CRI containers, stops leftover container processes and shims (PIDs from containerd's init.pid records),
#   then every other process recorded in LAB_DIR/pids (kube-scheduler-up.sh, csi-hostpath-up.sh), unmounts
#   everything under LAB_DIR/{kubelet,containerd,csi} and the containerd state dir, removes /var/log/pods and
#   /var/log/containers entries that appeared since node-up (assumes no other kubelet on the host), restores the kernel tunables the kubelet changed, rmdirs the (empty) host dirs the run
#   created (/var/log/pods, /var/log/containers, /run/containerd/s, /sys/fs/cgroup/*/k8s.io), deletes the state.
#   Keeps LAB_DIR/bin, LAB_DIR/scripts and LAB_DIR/logs. Refuses to delete anything while a mount remains.
# Env: DRAIN_TIMEOUT seconds to wait for the node's pods to go [90]
set -uo pipefail
LAB=${1:?usage: kubelet-node-down.sh LAB_DIR [KUBECONFIG NODE_NAME]}
KC=${2:-}; NODE=${3:-}
SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -d $LAB ]] || { echo "no such dir $LAB" >&2; exit 1; }
LAB=$(cd "$LAB" && pwd)
source "$SCRIPTS/kl-lib.sh"
CTRD_STATE=$(cat "$LAB/state/ctrd_state" 2>/dev/null || true)
SOCK=${CTRD_STATE:+$CTRD_STATE/containerd.sock}
CTR=$(command -v ctr || true)
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-90}
rc=0

# ---------- 1. drain through the API while the kubelet still runs ----------
if [[ -n $KC && -n $NODE ]]; then
  k() { kubectl --kubeconfig "$KC" "$@"; }
  if kl_alive kubelet; then
    k delete pods -A --field-selector "spec.nodeName=$NODE" --wait=false >/dev/null 2>&1
    for ((i=0;i<DRAIN_TIMEOUT;i++)); do
      n=$(k get pods -A --field-selector "spec.nodeName=$NODE" -o name 2>/dev/null | wc -l)
      [[ $n == 0 ]] && break; sleep 1
    done
    [[ ${n:-0} != 0 ]] && kl_log "warning: $n pod(s) still on $NODE after ${DRAIN_TIMEOUT}s; force-deleting"
    # let the attach/detach controller detach (ControllerUnpublish) while the CSI sidecars still run
    for ((i=0;i<45;i++)); do
      [[ -z "$(k get volumeattachment -o jsonpath="{.items[?(@.spec.nodeName==\"$NODE\")].metadata.name}" 2>/dev/null)" ]] && break; sleep 1
    done
  fi
  k delete pods -A --field-selector "spec.nodeName=$NODE" --force --grace-period=0 >/dev/null 2>&1
  k delete node "$NODE" --ignore-not-found --wait=false >/dev/null 2>&1 && kl_log "deleted Node $NODE"
fi

# ---------- 2. kubelet ----------
kl_stop kubelet 20

# ---------- 3. leftover CRI containers (stopped through containerd itself) ----------
if kl_alive containerd && [[ -n $CTR && -S $SOCK ]]; then
  c() { "$CTR" -a "$SOCK" -n k8s.io "$@"; }
  for t in $(c tasks ls -q 2>/dev/null); do c tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  sleep 1
  for t in $(c tasks ls -q 2>/dev/null); do c tasks delete -f "$t" >/dev/null 2>&1 || rc=1; done
  for ctr in $(c containers ls -q 2>/dev/null); do c containers rm "$ctr" >/dev/null 2>&1; done
fi

# ---------- 4. containerd, then every other process recorded in LAB_DIR/pids (newest first: CSI sidecars, scheduler...) ----------
kl_stop containerd 20
for f in $(ls -t "$LAB"/pids/*.pid 2>/dev/null); do n=$(basename "$f" .pid); kl_stop "$n" 10; done

# ---------- 5. container processes / shims containerd did not clean up ----------
# PIDs come from containerd's own records: <state>/io.containerd.runtime.v2.task/<ns>/<id>/init.pid; a process is only
# killed if its cgroup path names that container id; its shim (= its parent) only if it is containerd-shim-runc-v2
# serving our socket.
if [[ -n $CTRD_STATE && -d $CTRD_STATE/io.containerd.runtime.v2.task ]]; then
  shims=()
  for d in "$CTRD_STATE"/io.containerd.runtime.v2.task/*/*/; do
    [[ -d $d ]] || continue
    id=$(basename "$d")
    if [[ -s $d/init.pid ]]; then
      p=$(cat "$d/init.pid")
      if [[ -d /proc/$p ]] && grep -qF "/$id" /proc/$p/cgroup 2>/dev/null; then
        pp=$(awk '{print $4}' /proc/$p/stat 2>/dev/null)
        if [[ -n $pp && "$(readlink -f /proc/$pp/exe 2>/dev/null)" == *containerd-shim-runc-v2 ]] && \
           tr '\0' ' ' < /proc/$pp/cmdline | grep -qF -- "-address $SOCK "; then shims+=("$pp"); fi
        kill -KILL "$p" && kl_log "killed leftover container init $p ($id)"
      fi
    fi
  done
  for pp in $(printf '%s\n' "${shims[@]}" | sort -u); do
    kill -TERM "$pp" 2>/dev/null; sleep 1; [[ -d /proc/$pp ]] && kill -KILL "$pp"; kl_log "stopped leftover shim $pp"
  done
  for d in "$CTRD_STATE"/io.containerd.runtime.v2.task/*/*/; do   # shim sockets live outside the state dir
    [[ -s $d/address ]] || continue
    a=$(cat "$d/address"); a=${a#unix://}; [[ $a == /run/containerd/s/* && -S $a ]] && rm -f -- "$a"
    for c in /sys/fs/cgroup/*/k8s.io/"$(basename "$d")"; do [[ -d $c ]] && rmdir "$c" 2>/dev/null; done
  done
fi

# ---------- 6. mounts ----------
if ! kl_umount_all "$LAB/kubelet" "$LAB/containerd" "$LAB/csi" ${CTRD_STATE:+"$CTRD_STATE"}; then
  echo "mounts remain; NOT deleting state:" >&2; kl_mounts_under "$LAB/kubelet" "$LAB/containerd" "$LAB/csi" ${CTRD_STATE:+"$CTRD_STATE"} >&2
  exit 1
fi

# ---------- 7. the kubelet's hard-wired pod log dirs: remove entries that did not exist before node-up ----------
# (With POD_LOG_DIR they are that dir's, the whole of which is this node's.)
if [[ -s $LAB/state/pod-log-dir ]]; then
  pld=$(cat "$LAB/state/pod-log-dir"); rm -rf -- "$pld/pods" "$pld/containers"; rmdir "$pld" 2>/dev/null || true
elif [[ -f $LAB/state/var-log.before ]]; then
  for l in /var/log/pods/* /var/log/containers/*; do
    [[ -e $l || -L $l ]] || continue
    grep -qxF "$(basename "$l")" "$LAB/state/var-log.before" || rm -rf -- "$l"
  done
fi

# ---------- 8. kernel tunables ----------
if [[ -s $LAB/state/sysctl.orig ]]; then
  while read -r s v; do
    [[ "$(cat /proc/sys/$s)" == "$v" ]] || { echo "$v" > /proc/sys/$s && kl_log "restored $s=$v"; }
  done < "$LAB/state/sysctl.orig"
fi

# ---------- 9. host dirs the run created (only if empty), state ----------
if [[ -f $LAB/state/host-dirs ]]; then
  for d in /var/log/pods /var/log/containers /run/containerd/s /run/containerd /sys/fs/cgroup/*/k8s.io; do
    [[ -d $d ]] && ! grep -qxF "existed $d" "$LAB/state/host-dirs" && rmdir "$d" 2>/dev/null && kl_log "removed empty $d"
  done
fi
# LAB_DIR's own bind (POD_LOG_DIR) goes last: it must outlive every mount below it.
if [[ -s $LAB/state/pod-log-dir ]] && findmnt -rn -o TARGET --mountpoint "$LAB" > /dev/null; then
  umount "$LAB" || umount -l "$LAB" || rc=1
fi
rm -rf -- "$LAB"/{kubelet,containerd,csi,cni,images,pids,state} "$LAB"/{containerd.toml,kubelet-config.yaml,node.env}
[[ -n $CTRD_STATE && -d $CTRD_STATE ]] && rm -rf -- "$CTRD_STATE"
kl_log "node down ($LAB cleaned; logs kept in $LAB/logs)"
exit $rc
