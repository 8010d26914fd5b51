#!/usr/bin/env bash
# run.sh [TEST FILTER...]: the member end-to-end and Kosmos suites with the
# oldest sidecar set csi-relay still supports (docs/development.md, "What
# was run"): the two-cluster environment, Kosmos and the seed's demo started
# from $E2E_HOME with the sidecars and member driver of $OLDEST_HOME in
# place of $E2E_HOME/bin's, then `cargo test` of those suites.
#
# $OLDEST_HOME (default $E2E_HOME/oldest) holds, built as
# tests/e2e-env/README.md says for the newest:
#   bin/csi-provisioner (external-provisioner v3.4.1), bin/csi-attacher
#   (external-attacher v4.2.0), bin/csi-resizer (external-resizer v1.10.1),
#   bin/csi-snapshotter and bin/snapshot-controller (external-snapshotter
#   v7.0.2), bin/csi-node-driver-registrar (node-driver-registrar v2.7.0),
#   bin/hostpathplugin (csi-driver-host-path v1.15.0); snapshot-crds/ (the
#   CRDs of external-snapshotter v7.0.2, client/config/crd).
# Everything else comes from $E2E_HOME. Nothing is downloaded or built;
# without the binaries it prints "skipped: <why>" and exits 2. Root.
set -Eeuo pipefail
cd "$(dirname "$0")/../.."
: "${E2E_HOME:?set E2E_HOME}"
OLD=${OLDEST_HOME:-$E2E_HOME/oldest}
for b in csi-provisioner csi-attacher csi-resizer csi-snapshotter snapshot-controller csi-node-driver-registrar hostpathplugin; do
  [[ -x $OLD/bin/$b ]] || { echo "skipped: no $OLD/bin/$b (set OLDEST_HOME)" >&2; exit 2; }
done
[[ -d $OLD/snapshot-crds ]] || { echo "skipped: no $OLD/snapshot-crds" >&2; exit 2; }
[[ -x $E2E_HOME/bin/kube-apiserver ]] || { echo "skipped: no $E2E_HOME/bin/kube-apiserver" >&2; exit 2; }

# An E2E_HOME of links: $E2E_HOME's, the oldest set over it; its own run/.
# Hard links: the scripts stop what they started only if /proc/PID/exe is
# the path they ran (a symlink resolves elsewhere); hence inside $E2E_HOME,
# on its filesystem.
H=$(mktemp -d "$E2E_HOME/.oldest-run.XXXXXX")
mkdir "$H/bin"
ln "$E2E_HOME"/bin/* "$H/bin/"
ln -f "$OLD"/bin/* "$H/bin/"
for d in images kosmos-crds; do [[ -e $E2E_HOME/$d ]] && ln -s "$E2E_HOME/$d" "$H/$d"; done
ln -s "$OLD/snapshot-crds" "$H/snapshot-crds"
down() {
  E2E_HOME=$H tests/e2e-env/env-down.sh > /dev/null 2>&1 || true
  rm -rf "$H"
}
trap down EXIT
export E2E_HOME=$H PATH=$H/bin:$PATH
for b in csi-provisioner csi-attacher csi-resizer csi-node-driver-registrar hostpathplugin; do
  echo "$b: $("$H/bin/$b" --version 2>&1 | head -1)"
done
tests/e2e-env/env-up.sh > /dev/null
# shellcheck disable=SC1091
source "$E2E_HOME/run/env/env.sh"
# shellcheck disable=SC1091
source tests/e2e-env/suite-env.sh
export RELAY_KOSMOS_RACES=${RELAY_KOSMOS_RACES:-30}
# The seed's demo only: global storage runs with the newest set.
export RELAY_GLOBAL_STORAGE=${RELAY_GLOBAL_STORAGE:-skip}
start=$(date +%s)
filters=("$@")
((${#filters[@]})) || filters=(member_e2e kosmos_e2e kosmos_demo_e2e)
LOG=${OLDEST_LOG:-$(mktemp /tmp/relay-oldest-test.XXXXXX.log)}
cargo test --locked --test suite -- "${filters[@]}" --nocapture 2>&1 |
  tee "$LOG" | grep --line-buffered -E "^(test |figure:|skipped|test result)|panicked at"
rc=${PIPESTATUS[0]}
echo "oldest sidecar set: cargo test exit $rc in $(( $(date +%s) - start )) s; the whole output: $LOG"
exit "$rc"
