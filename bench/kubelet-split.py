#!/usr/bin/env python3
"""kubelet-split.py KUBELET_LOG NAMESPACE [FIRST LAST]: where a pod-start run's
time went on a real kubelet, from the kubelet's own log (klog, -v=2 or more),
per CSI driver, median and max over the pods p<FIRST>..p<LAST> of
relay-pod-start's namespace NAMESPACE:

  seen -> attach check   the pod reaches the kubelet (SyncLoop ADD) until it
                         checks the volume is attached
                         (VerifyControllerAttachedVolume started): for an
                         attachable driver the kubelet waits there until its
                         next node status update has reported the volume in
                         use (every nodeStatusUpdateFrequency, 10 s)
  attach check -> set up the driver's part: the check, NodeStageVolume,
                         NodePublishVolume (MountVolume.SetUp succeeded)
  set up -> started      sandbox and container start (ContainerStarted)
"""
import collections
import re
import statistics
import sys


def stamp(line):
    m = re.match(r"[IWE]\d{4} (\d+):(\d+):([\d.]+)", line)
    return int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]) if m else None


def main():
    if len(sys.argv) not in (3, 5):
        sys.exit(__doc__)
    log, ns = sys.argv[1], sys.argv[2]
    first, last = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) == 5 else (0, 1 << 30)
    events = collections.defaultdict(dict)
    with open(log, errors="replace") as f:
        for line in f:
            t = stamp(line)
            if t is None:
                continue
            m = re.search(r'pods=\["%s/(p\d+)"\]' % re.escape(ns), line)
            if m and "SyncLoop ADD" in line:
                events[m[1]].setdefault("seen", t)
                continue
            m = re.search(r'pod="%s/(p\d+)"' % re.escape(ns), line)
            if not m:
                continue
            e = events[m[1]]
            csi = re.search(r"kubernetes\.io/csi/([^^\s\\\"]+)\^", line)
            if "VerifyControllerAttachedVolume started" in line and csi:
                e.setdefault("check", t)
                e["driver"] = csi[1]
            elif "MountVolume.SetUp succeeded" in line and "kubernetes.io/csi" in line:
                e.setdefault("setup", t)
            elif "ContainerStarted" in line:
                e.setdefault("started", t)
    spans = collections.defaultdict(lambda: collections.defaultdict(list))
    for pod, e in events.items():
        if not first <= int(pod[1:]) <= last:
            continue
        if not all(k in e for k in ("seen", "check", "setup", "started", "driver")):
            continue
        s = spans[e["driver"]]
        s["seen -> attach check"].append(e["check"] - e["seen"])
        s["attach check -> set up"].append(e["setup"] - e["check"])
        s["set up -> started"].append(e["started"] - e["setup"])
        s["seen -> started"].append(e["started"] - e["seen"])
    if not spans:
        sys.exit(f"no pod of {ns} with every milestone in {log}")
    for driver, s in sorted(spans.items()):
        n = len(next(iter(s.values())))
        parts = ", ".join(
            f"{k} {statistics.median(v):.2f} s (max {max(v):.2f})" for k, v in s.items()
        )
        print(f"{driver} ({n} pods): {parts}")


if __name__ == "__main__":
    main()
