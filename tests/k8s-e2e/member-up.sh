#!/usr/bin/env bash
# member-up.sh RUN_DIR: part (b) on an environment env-up.sh RUN_DIR already
# made without MEMBER=1 (same as env-up.sh with MEMBER=1; see member-up.inc.sh).
# env-down.sh RUN_DIR undoes both.
set -Eeuo pipefail
RUN=${1:?usage: member-up.sh RUN_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${E2E_HOME:?set E2E_HOME}"
source "$E2E_HOME/run/env/env.sh"
source "$HERE/settings.sh"
RUN=$(cd "$RUN" && pwd); LAB=$RUN/lab
[[ -s $RUN/env.sh ]] || { echo "run env-up.sh $RUN first" >&2; exit 2; }
source "$LAB/node.env"
RELAY_BIN=$(readlink -f "${RELAY_BIN:-$HERE/../../target/release/csi-relay}")
RELAY_LOG=${RELAY_LOG:-csi_relay=debug}
B=$E2E_HOME/bin
SNAPSHOT_CRDS=${SNAPSHOT_CRDS:-$E2E_HOME/snapshot-crds}
SNAP=$(sed -n 's/^export K8SE2E_SNAPSHOTS=//p' "$RUN/env.sh")
GROUP_GATE=""; ((SNAP)) && GROUP_GATE=--feature-gates=CSIVolumeGroupSnapshot=true
source "$HERE/../env-lib.sh"
lab() { ( source "$KL/kl-lib.sh"; "$@" ); }
source "$HERE/member-up.inc.sh"
sed -i 's/^export K8SE2E_MEMBER=.*/export K8SE2E_MEMBER=1/' "$RUN/env.sh"
