#!/usr/bin/env bash
# demo-down.sh RUN_DIR: undoes demo-up.sh (also a partial one): the host
# node drained (so the relay's node calls unwind) and stopped with its
# scheduler, the member provisioners stopped, their classes and namespaces
# deleted. Every process by its recorded PID. env-down.sh runs it first.
set -uo pipefail
RUN=${1:?usage: demo-down.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
D=$RUN/demo
[[ -d $D ]] || exit 0
rc=0
if [[ -d $D/lab ]]; then
  "$KL/kubelet-node-down.sh" "$D/lab" "$HOST_KUBECONFIG" $DEMO_NODE > "$D/logs/kubelet-node-down.log" 2>&1 || rc=1
fi
for f in $(ls -t "$D"/pids/*.pid 2>/dev/null); do
  ( LAB=$D; source "$KL/kl-lib.sh"; kl_stop "$(basename "$f" .pid)" 15 ) || rc=1
done
km delete storageclass $OPENEBS_CLASS $LOCAL_PATH_CLASS --ignore-not-found > /dev/null 2>&1 || true
km delete namespace openebs local-path-storage --ignore-not-found --wait=false > /dev/null 2>&1 || true
left=$(awk '{print $5}' /proc/self/mountinfo | grep -F "$D" || true)
[[ -z $left ]] || { echo "mounts left under $D: $left" >&2; rc=1; }
exit $rc
