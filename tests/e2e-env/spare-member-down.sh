#!/usr/bin/env bash
# spare-member-down.sh RUN_DIR: undoes spare-member-up.sh (also a partial
# one, and twice): its processes by their recorded PIDs, newest first, then
# its control plane, wiped. The member is gone for good afterwards.
set -uo pipefail
RUN=${1:?usage: SPARE_MEMBER=NAME spare-member-down.sh RUN_DIR}
NAME=${SPARE_MEMBER:?set SPARE_MEMBER}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
[[ -d $RUN ]] || exit 0
rc=0
LAB_DIR=$RUN/$NAME
for f in $(ls -t "$LAB_DIR"/pids/*.pid 2>/dev/null); do
  ( LAB=$LAB_DIR; source "$HERE/kubelet/kl-lib.sh"; kl_stop "$(basename "$f" .pid)" 15 ) || rc=1
done
mkdir -p "$RUN/logs"
"$HERE/cluster-down.sh" "$NAME" --wipe >> "$RUN/logs/cluster-down-$NAME.log" 2>&1 || rc=1
rm -rf "$LAB_DIR/state" "$LAB_DIR/hostpath.sock" "$E2E_HOME/run/$NAME-relay.kubeconfig" "$E2E_HOME/run/$NAME-relay-node.kubeconfig" "$E2E_HOME/run/$NAME-relay.kubeconfig.kustomize"
exit $rc
