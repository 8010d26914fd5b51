#!/bin/bash
# ha.sh RUN_DIR: the controller's two replicas (one per node of up.sh's kit) failing over, with figures.
#   1. the leading pod killed (SIGKILL of every container of it, through its node's containerd)
#      while a claim with a pod arrives every 2 s: the other replica's first CreateVolume (a claim
#      Bound) and ControllerPublishVolume (a VolumeAttachment attached) after the kill, each within
#      20 s of it; every pod Running;
#   2. `kubectl rollout restart` of the controller while a claim with a pod arrives every 2 s: no
#      claim waits more than 20 s to be Bound, no attachment more than 20 s to be attached, every
#      pod Running;
#   3. node 2 frozen while its replica leads (every process of the node SIGSTOPped: kubelet,
#      containerd, shims, containers, forwarders: nothing answers, nothing is refused) under a
#      burst of 20 claims with pods on node 1: the first claim Bound within 25 s of the freeze,
#      every pod Running; thawed, the old leader steps down (its relay container restarts) and the
#      API servers' audit logs show no write by it took effect after its Lease ran out;
#   4. node 2 cut from the host API only (a DROP rule in its network namespace) while its replica
#      leads, under a claim with a pod every 2 s: it steps down; the member's audit log shows no
#      write by it after its renew deadline (the cut + 7 s); every pod Running.
# Prints PASS/FAIL per case with its figures; exit 1 on the first failure. Leaves no user object.
set -Eeuo pipefail
RUN=${1:?usage: ha.sh RUN_DIR}
RUN=$(cd "$RUN" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$LAB2/node.env"; KL2_CONTAINERD_SOCK=$KL_CONTAINERD_SOCK
source "$LAB/node.env"
exec > >(tee -a "$RUN/logs/ha.log") 2>&1
T_START=$(date +%s.%N)
ts "ha.sh $RUN"
NS=$HA_NS
HA=$RUN/ha; rm -rf "$HA"; mkdir -p "$HA"
# HA_CASES="1 3" runs some of the cases; HA_ROLL (a shell command, named HA_ROLL_NAME) rolls the
# controller in case 2 instead of `kubectl rollout restart`.
pass() { ts "PASS: $*"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }
thaw() { [[ -s $RUN/frozen.pids ]] && { xargs -r kill -CONT < "$RUN/frozen.pids" 2>/dev/null || true; rm -f "$RUN/frozen.pids"; }; }
trap 'ts "FAIL at line $LINENO: $BASH_COMMAND"; thaw; kh get pods -A -o wide; kh -n csi-relay get lease' ERR
leader() { local h; h=$(kh -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.holderIdentity}'); echo "${h%_*}"; }
node_of() { kh -n csi-relay get pod "$1" -o jsonpath='{.spec.nodeName}'; }
sock_of() { [[ $1 == "$NODE2" ]] && echo "$KL2_CONTAINERD_SOCK" || echo "$KL_CONTAINERD_SOCK"; }
# The relay process of node 2's replica (a frozen or cut node's kubelet cannot report a restart).
relay_pid2() { pgrep -f "csi-relay serve --mode=controller .*--node-id=$NODE2( |$)" | head -1; }
# exited_by PID SECONDS: the time PID was seen gone (polled every 0.1 s), or fails.
exited_by() {
  local i
  for ((i=0; i<$2*10; i++)); do kill -0 "$1" 2>/dev/null || { now; return 0; }; sleep 0.1; done
  return 1
}
relay_restarts() { kh -n csi-relay get pod "$1" -o jsonpath='{.status.containerStatuses[?(@.name=="csi-relay")].restartCount}'; }

kh create ns "$NS" > /dev/null 2>&1 || true
waitfor 30 "default ServiceAccount in $NS" kh -n "$NS" get sa default

# claim+pod N, on node 1 (node 2 is tainted controller-only); its creation time in HA/created.
claim() {
  kh apply -f - > /dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: { name: ha-$1, namespace: $NS }
spec:
  storageClassName: $CLASS
  accessModes: [ReadWriteOnce]
  resources: { requests: { storage: 16Mi } }
---
apiVersion: v1
kind: Pod
metadata: { name: ha-$1, namespace: $NS }
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: $BUSYBOX_IMAGE
      imagePullPolicy: Never
      command: ["sh", "-c", "echo $1 > /data/id && exec sleep 100000"]
      volumeMounts: [{ name: data, mountPath: /data }]
  volumes:
    - name: data
      persistentVolumeClaim: { claimName: ha-$1 }
EOF
  echo "ha-$1 $(now)" >> "$HA/created"
}

# Every 0.5 s, the first time each claim is Bound and each attachment attached (by the claim it
# serves), into HA/bound and HA/attached: "NAME TIME".
watch_start() {
  : > "$HA/bound"; : > "$HA/attached"; touch "$HA/watching"
  (
    while [[ -e $HA/watching ]]; do
      t=$(now)
      kh -n "$NS" get pvc -o json 2>/dev/null | jq -r '.items[] | select(.status.phase=="Bound") | "\(.metadata.name) \(.spec.volumeName)"' > "$HA/pvc.now" || true
      kh get volumeattachment -o json 2>/dev/null | jq -r '.items[] | select(.status.attached==true) | .spec.source.persistentVolumeName' > "$HA/va.now" || true
      while read -r name pv; do
        grep -q "^$name " "$HA/bound" || echo "$name $t" >> "$HA/bound"
        if grep -qxF "$pv" "$HA/va.now"; then grep -q "^$name " "$HA/attached" || echo "$name $t" >> "$HA/attached"; fi
      done < "$HA/pvc.now"
      sleep 0.5
    done
  ) &
  WATCHER=$!
}
watch_stop() { rm -f "$HA/watching"; wait "$WATCHER" 2>/dev/null || true; }
at() { awk -v n="$2" '$1==n {print $2; exit}' "$1"; }

# load SECONDS FIRST: a claim with a pod every 2 s, numbered from FIRST; sets LAST.
load() {
  local until n=$2
  until=$(awk -v a="$(now)" -v d="$1" 'BEGIN{printf "%.3f", a+d}')
  while awk -v a="$(now)" -v u="$until" 'BEGIN{exit !(a<u)}'; do
    claim "$n"; n=$((n+1)); sleep 2
  done
  LAST=$((n-1))
}

all_running() { # all_running FIRST LAST SECONDS
  waitfor "$3" "pods ha-$1..ha-$2 Running" sh -c \
    "[ \"\$(kubectl --kubeconfig '$HKC' -n $NS get pods -o json | jq '[.items[] | select(.status.phase==\"Running\")] | length')\" -ge $(($2-$1+1)) ]"
}

clean() { # everything of this script's namespace, through CSI
  kh -n "$NS" delete pods --all --grace-period=1 --wait=true --timeout=120s > /dev/null
  kh -n "$NS" delete pvc --all --wait=true --timeout=120s > /dev/null
  waitfor 120 "relay PVs of $NS gone" sh -c "[ -z \"\$(kubectl --kubeconfig '$HKC' get pv -o json | jq -r '.items[] | select(.spec.claimRef.namespace==\"$NS\") | .metadata.name')\" ]"
  rm -f "$HA/created"
}

# waits: per claim created in [FIRST, LAST], seconds from creation to Bound and to attached
report_waits() {
  local n name c b a worst_b=0 worst_a=0
  for ((n=$1; n<=$2; n++)); do
    name=ha-$n; c=$(at "$HA/created" "$name"); b=$(at "$HA/bound" "$name"); a=$(at "$HA/attached" "$name")
    [[ -n $b && -n $a ]] || { echo "claim $name: bound '${b}' attached '${a}'"; return 1; }
    worst_b=$(awk -v w="$worst_b" -v x="$(secs "$c" "$b")" 'BEGIN{print (x>w)?x:w}')
    worst_a=$(awk -v w="$worst_a" -v x="$(secs "$c" "$a")" 'BEGIN{print (x>w)?x:w}')
  done
  echo "$worst_b $worst_a"
}

# Moves the lead to node 2: the leader on node 1 stopped (gracefully: it gives its Lease up, and
# the standby, watching the Lease, takes it before the stopped pod's successor has started; a few
# tries in case the successor wins all the same).
lead_on_node2() {
  local try L
  for try in 1 2 3; do
    L=$(leader)
    [[ $(node_of "$L") == "$NODE2" ]] && break
    kh -n csi-relay delete pod "$L" --wait=true --timeout=60s > /dev/null
    waitfor 60 "a new leader" sh -c "h=\$(kubectl --kubeconfig '$HKC' -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.holderIdentity}'); [ -n \"\$h\" ] && [ \"\${h%_*}\" != $L ]"
    kh -n csi-relay rollout status deployment/csi-relay-controller --timeout=120s > /dev/null
  done
  [[ $(node_of "$(leader)") == "$NODE2" ]] || { echo "the lead did not move to $NODE2"; return 1; }
  # Serving: its sidecars past their Probe loop and leading.
  waitfor 60 "the attacher's Lease on the leader's pod" sh -c "h=\$(kubectl --kubeconfig '$HKC' -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.holderIdentity}'); [ \"\$(kubectl --kubeconfig '$HKC' -n csi-relay get lease external-attacher-leader-relay-csi-dev -o jsonpath='{.spec.holderIdentity}')\" = \${h%_*} ]"
}

CASES=${HA_CASES:-1 2 3 4}   # which of the cases below run
# ---------- 1. the leading pod killed under a steady load ----------
if [[ " $CASES " == *" 1 "* ]]; then
OLD=$(leader); OLD_NODE=$(node_of "$OLD"); RESTARTS=$(relay_restarts "$OLD")
watch_start
load 6 1
T_KILL=$(now)
ids=$(kh -n csi-relay get pod "$OLD" -o jsonpath='{.status.containerStatuses[*].containerID}' | sed 's#containerd://##g')
for id in $ids; do ctr -a "$(sock_of "$OLD_NODE")" -n k8s.io tasks kill -s SIGKILL "$id" > /dev/null 2>&1 || true; done
load 30 4
all_running 1 "$LAST" 120
watch_stop
NEW=$(leader)
[[ $NEW != "$OLD" ]] || { echo "the killed pod $OLD leads again"; false; }
first_b=; first_a=
for ((n=1; n<=LAST; n++)); do
  b=$(at "$HA/bound" "ha-$n"); a=$(at "$HA/attached" "ha-$n")
  if [[ -z $first_b ]] && awk -v b="$b" -v k="$T_KILL" 'BEGIN{exit !(b>k)}'; then first_b=$(secs "$T_KILL" "$b"); fi
  if [[ -z $first_a ]] && awk -v b="$a" -v k="$T_KILL" 'BEGIN{exit !(b>k)}'; then first_a=$(secs "$T_KILL" "$a"); fi
done
awk -v b="$first_b" -v a="$first_a" 'BEGIN{exit !(b!="" && a!="" && b<=20 && a<=20)}' \
  || { echo "after the kill: first Bound ${first_b}s, first attached ${first_a}s (limit 20 s)"; false; }
pass "leading pod $OLD ($OLD_NODE) killed: $NEW ($(node_of "$NEW")) served its first CreateVolume ${first_b}s and ControllerPublishVolume ${first_a}s after the kill; $LAST pods Running; the killed pod's relay restarted ($RESTARTS -> $(relay_restarts "$OLD")) as standby"
echo "case1 first_bound=$first_b first_attached=$first_a" >> "$HA/figures"
clean
fi

# ---------- 2. rollout restart under a steady load ----------
if [[ " $CASES " == *" 2 "* ]]; then
watch_start
load 50 100 & LOADER=$!
sleep 6
T_ROLL=$(now)
if [[ -n ${HA_ROLL:-} ]]; then   # another command that rolls the controller (helm.sh: helm upgrade)
  bash -c "$HA_ROLL" > "$HA/roll.log" 2>&1 || { cat "$HA/roll.log"; false; }
else
  kh -n csi-relay rollout restart deployment/csi-relay-controller > /dev/null
fi
kh -n csi-relay rollout status deployment/csi-relay-controller --timeout=180s > /dev/null
T_ROLLED=$(now)
wait $LOADER
LAST=$(sed -n 's/^ha-\([0-9]*\) .*/\1/p' "$HA/created" | sort -n | tail -1)
all_running 100 "$LAST" 120
watch_stop
read -r worst_b worst_a < <(report_waits 100 "$LAST")
awk -v b="$worst_b" -v a="$worst_a" 'BEGIN{exit !(b<=20 && a<=20)}' \
  || { echo "rollout: a claim waited ${worst_b}s to bind, ${worst_a}s to attach (limit 20 s)"; false; }
pass "${HA_ROLL_NAME:-rollout restart} ($(secs "$T_ROLL" "$T_ROLLED")s): $((LAST-99)) claims, longest wait from create to Bound ${worst_b}s, to attached ${worst_a}s; all Running; leader now $(leader)"
echo "case2 claims=$((LAST-99)) worst_bound=$worst_b worst_attached=$worst_a rollout=$(secs "$T_ROLL" "$T_ROLLED")" >> "$HA/figures"
clean
fi

# ---------- 3. node 2 frozen while it leads, under a burst ----------
if [[ " $CASES " == *" 3 "* ]]; then
lead_on_node2
OLD=$(leader); OLD_PID=$(relay_pid2)
[[ -n $OLD_PID ]] || { echo "no relay process of $NODE2"; false; }
AUDIT_HOST=$E2E_HOME/run/$HOST/logs/audit.log; AUDIT_MEMBER=$E2E_HOME/run/$MEMBER/logs/audit.log
frozen_pids() { # every process of node 2: recorded ones, its containerd's shims and all their descendants
  local roots p
  roots=$(cat "$LAB2"/pids/*.pid 2>/dev/null; pgrep -f "containerd-shim.*$CTRD_STATE2" || true)
  descend() { echo "$1"; for c in $(pgrep -P "$1" || true); do descend "$c"; done; }
  for p in $roots; do descend "$p"; done | sort -un
}
watch_start
burst=()
for n in $(seq 200 219); do claim "$n" & burst+=($!); done
wait "${burst[@]}"
frozen_pids > "$RUN/frozen.pids"
xargs -r kill -STOP < "$RUN/frozen.pids"
# From here nothing of node 2 runs: the reference for "no write after the freeze".
T_FREEZE=$(now); FREEZE_ISO=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
all_running 200 219 180
T_ALL=$(now)
watch_stop
NEW=$(leader)
# The Lease ran out for the frozen leader when the new one took it.
RAN_OUT=$(kh -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.acquireTime}')
TOOK=$(secs "$T_FREEZE" "$(date -d "$RAN_OUT" +%s.%N)")
awk -v t="$TOOK" 'BEGIN{exit !(t<=25)}' || { echo "the new leader took the Lease ${TOOK}s after the freeze (limit 25 s)"; false; }
T_THAW=$(now); thaw
T_DOWN=$(exited_by "$OLD_PID" 30) || { echo "the thawed old leader's relay (pid $OLD_PID) still runs"; false; }
# The API servers' record: no write by the old leader's relay (its user agent names its pod) took
# effect after its Lease ran out (when the new leader took it). What it sent before it froze can
# arrive at the thaw (held by the frozen node's own network path): each such write must have been
# refused (RelayVolumes: the CRD's leader-term rule; member objects: already made by the new leader).
late=$(python3 - "$RAN_OUT" "$OLD" "$AUDIT_HOST" "$AUDIT_MEMBER" <<'EOF'
import json, sys
ran_out, pod = sys.argv[1], sys.argv[2]
for path in sys.argv[3:]:
    for line in open(path):
        try: e = json.loads(line)
        except ValueError: continue
        if e.get("verb") in ("get", "list", "watch"): continue
        if "csi-relay/" not in e.get("userAgent", "") or "(%s_" % pod not in e.get("userAgent", ""): continue
        code = e.get("responseStatus", {}).get("code", 0)
        if e.get("requestReceivedTimestamp", "") > ran_out:
            o = e.get("objectRef", {})
            print(path.split("/")[-3], e["verb"], o.get("resource") + ("/" + o["subresource"] if o.get("subresource") else ""), o.get("name"), e["requestReceivedTimestamp"], code)
EOF
)
refused=$(awk '$NF >= 400' <<< "$late" | grep -c . || true)
refused_status=$(awk '$NF >= 400 && $3 == "relayvolumes/status"' <<< "$late" | grep -c . || true)
late=$(awk '$NF < 400' <<< "$late")
[[ -z $late ]] || { echo "writes by the frozen leader that took effect after its Lease ran out ($RAN_OUT):"; echo "$late"; false; }
pass "node 2 frozen while $OLD led, burst of 20 claims: $NEW took the Lease ${TOOK}s after the freeze, all 20 Running after $(secs "$T_FREEZE" "$T_ALL")s; thawed after $(secs "$T_FREEZE" "$T_THAW")s, the old leader stepped down within $(secs "$T_THAW" "$T_DOWN")s; audit logs: no write by it took effect after its Lease ran out ($refused delivered late and refused, $refused_status of them RelayVolume status writes)"
echo "case3 took_lease=$TOOK all_running=$(secs "$T_FREEZE" "$T_ALL") stepped_down_after_thaw=$(secs "$T_THAW" "$T_DOWN") late_refused=$refused" >> "$HA/figures"
clean
fi

# ---------- 4. node 2 cut from the host API only, while its replica leads ----------
# A DROP rule in node 2's own network namespace for the host API port: packets to it vanish (calls
# hang, nothing is refused); the member API stays reachable. Its relay must stop every write, the
# member's included, by 7 s after its last renewal (before the cut), and exit.
if [[ " $CASES " == *" 4 "* ]]; then
lead_on_node2
OLD=$(leader); OLD_PID=$(relay_pid2)
[[ -n $OLD_PID ]] || { echo "no relay process of $NODE2"; false; }
cut_rule=(OUTPUT -o lo -p tcp --dport "$HOST_PORT" -j DROP)
heal() { in2 iptables -D "${cut_rule[@]}" 2>/dev/null || true; }
trap 'ts "FAIL at line $LINENO: $BASH_COMMAND"; heal; thaw; kh get pods -A -o wide; kh -n csi-relay get lease' ERR
watch_start
in2 iptables -A "${cut_rule[@]}"
T_CUT=$(now); CUT_ISO=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
DEADLINE_ISO=$(date -u -d "@$(awk -v t="$T_CUT" 'BEGIN{printf "%.6f", t+7}')" +%Y-%m-%dT%H:%M:%S.%6NZ)
# Claims keep coming while it is cut, as they would.
load 16 300 & LOADER=$!
T_DOWN=$(exited_by "$OLD_PID" 30) || { echo "the cut leader's relay (pid $OLD_PID) still runs"; false; }
wait $LOADER
LAST=$(sed -n 's/^ha-\([0-9]*\) .*/\1/p' "$HA/created" | sort -n | tail -1)
all_running 300 "$LAST" 120
T_ALL=$(now)
watch_stop
NEW=$(leader)
[[ $NEW != "$OLD" ]] || { echo "the cut pod $OLD still leads"; false; }
TOOK4=$(secs "$T_CUT" "$(date -d "$(kh -n csi-relay get lease relay-csi-dev-controller -o jsonpath='{.spec.acquireTime}')" +%s.%N)")
late=$(python3 - "$DEADLINE_ISO" "$OLD" "$AUDIT_MEMBER" <<'EOF'
import json, sys
deadline, pod = sys.argv[1], sys.argv[2]
for line in open(sys.argv[3]):
    try: e = json.loads(line)
    except ValueError: continue
    if e.get("verb") in ("get", "list", "watch"): continue
    if "csi-relay/" not in e.get("userAgent", "") or "(%s_" % pod not in e.get("userAgent", ""): continue
    if e.get("requestReceivedTimestamp", "") > deadline:
        o = e.get("objectRef", {})
        print(e["verb"], o.get("resource"), o.get("name"), e["requestReceivedTimestamp"], e.get("responseStatus", {}).get("code"))
EOF
)
[[ -z $late ]] || { echo "member writes by the cut leader after its renew deadline ($DEADLINE_ISO):"; echo "$late"; false; }
before=$(python3 - "$CUT_ISO" "$OLD" "$AUDIT_MEMBER" <<'EOF'
import json, sys
since, pod = sys.argv[1], sys.argv[2]
n = 0
for line in open(sys.argv[3]):
    try: e = json.loads(line)
    except ValueError: continue
    if e.get("verb") in ("get", "list", "watch"): continue
    if "(%s_" % pod in e.get("userAgent", "") and e.get("requestReceivedTimestamp", "") > since: n += 1
print(n)
EOF
)
heal
trap 'ts "FAIL at line $LINENO: $BASH_COMMAND"; thaw; kh get pods -A -o wide; kh -n csi-relay get lease' ERR
pass "node 2 cut from the host API while $OLD led: it stepped down $(secs "$T_CUT" "$T_DOWN")s after the cut; $NEW took the Lease ${TOOK4}s after it, $((LAST-299)) claims Running after $(secs "$T_CUT" "$T_ALL")s; member audit: $before writes by the cut leader after the cut, none after its renew deadline (cut + 7 s)"
echo "case4 stepped_down=$(secs "$T_CUT" "$T_DOWN") took_lease=$TOOK4 member_writes_after_cut=$before" >> "$HA/figures"
clean
fi
kh delete ns "$NS" --wait=false > /dev/null
cat "$HA/figures"
ts "ha.sh done"
