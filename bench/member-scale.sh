#!/usr/bin/env bash
# member-scale.sh [VOLUMES]: what VOLUMES (default 10000) member volumes cost
# a csi-relay controller (release build), on the real control planes of
# tests/e2e-env: tests/suite/member_scale_e2e.rs at that size, with the API
# servers' audit logs on so it counts the relay's own requests per volume.
# Prints the test's "figure:" lines. Brings the environment up and down
# itself (env-up refuses when one is up); builds nothing but the test
# (cargo), needs target/release/csi-relay.
# The member's kube-controller-manager gets a higher client rate: its PV
# controller binds each claim with four writes, held to 20 requests/s by
# default (about 4 claims a second; 10,000 would take 40 minutes).
set -Eeuo pipefail
VOLUMES=${1:-10000}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
: "${E2E_HOME:?set E2E_HOME}"
RELAY_BIN=$(readlink -f "${RELAY_BIN:-target/release/csi-relay}")
[[ -x $RELAY_BIN ]] || { echo "missing $RELAY_BIN: cargo build --release" >&2; exit 2; }
trap 'tests/e2e-env/env-down.sh > /dev/null 2>&1 || true' EXIT
AUDIT=1 KCM_EXTRA="--kube-api-qps=500 --kube-api-burst=1000" tests/e2e-env/env-up.sh > /dev/null
source "$E2E_HOME/run/env/env.sh"
export RELAY_E2E_HOST_KUBECONFIG=$HOST_KUBECONFIG RELAY_E2E_MEMBER_KUBECONFIG=$MEMBER_KUBECONFIG \
  RELAY_E2E_MEMBER_STORAGE_CLASS=$MEMBER_STORAGE_CLASS RELAY_E2E_MEMBER_CSI_DRIVER=$MEMBER_CSI_DRIVER \
  RELAY_E2E_MEMBER_RELAY_KUBECONFIG=$MEMBER_RELAY_KUBECONFIG
RELAY_SCALE_VOLUMES=$VOLUMES RELAY_TEST_BINARY=$RELAY_BIN RUST_LOG=${RUST_LOG:-info} \
  cargo test --locked --test suite member_objects_cost_what_the_relay_serves -- --test-threads 1 2>&1 \
  | grep -E '^figure:|test result|panicked|FAILED'
