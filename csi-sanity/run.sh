#!/usr/bin/env bash
# Runs the official csi-sanity suite against a fresh `csi-relay serve --mode all`
# with every optional feature switched on. Needs root (mounts) and a
# csi-sanity binary on PATH (or CSI_SANITY=/path/to/csi-sanity).
set -euo pipefail
cd "$(dirname "$0")/.."

sanity=${CSI_SANITY:-$(command -v csi-sanity || true)}
if [ -z "$sanity" ]; then
  echo "skipped: no csi-sanity binary (build kubernetes-csi/csi-test cmd/csi-sanity, or set CSI_SANITY)" >&2
  exit 2
fi

# The spec whose capabilities to advertise comes from the suite inside the
# binary (spec.sh says how, and stops when it cannot tell).
spec=$(csi-sanity/spec.sh "$sanity") || exit 2

work=$(mktemp -d /tmp/csi-relay-sanity.XXXXXX)
cargo build --release --locked
./target/release/csi-relay serve \
  --endpoint "unix://$work/csi.sock" --node-id sanity-node --state-dir "$work/state" \
  --max-volumes-per-node 8 --mutable-parameters iops,tier --csi-spec "$spec" &
pid=$!
cleanup() {
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$work/csi.sock" ] && break; sleep 0.1; done

printf 'iops: "3000"\ntier: gold\n' > "$work/mutable.yaml"
"$sanity" \
  --csi.endpoint "$work/csi.sock" \
  --csi.mountdir "$work/mount" --csi.stagingdir "$work/staging" \
  --csi.testnodevolumeattachlimit \
  --csi.testvolumemutableparameters "$work/mutable.yaml" \
  --csi.testvolumesize 67108864 \
  "$@"
echo "after the suite: mounts and loop devices left under $work:"
grep -c "$work" /proc/self/mountinfo || true
losetup -a | grep -c "$work" || true
