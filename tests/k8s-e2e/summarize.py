#!/usr/bin/env python3
"""summarize.py JUNIT_XML... [--runtime S] [--specs]: the e2e suite's junit
report(s) as a table per test suite (provisioning, volumes, snapshottable, ...):
passed / failed / skipped, the skip reasons (counted), the failed specs.
Several reports (shards run in parallel) are merged by spec name: a spec that
ran in one shard counts as it ran there; "not run" (filtered out by focus or
skip list, or not reached) only when it ran nowhere."""
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

args = sys.argv[1:]
if not args:
    sys.exit(__doc__)
paths = [a for a in args if a.endswith(".xml")]
runtime = None
if "--runtime" in args:
    runtime = args[args.index("--runtime") + 1]
list_specs = "--specs" in args

NOT_RUN = "not run (excluded by focus/skip list, or not reached)"
RANK = {"failed": 3, "passed": 2, "skipped": 1, "notrun": 0}
best = {}
for path in paths:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"warning: {path}: {e}", file=sys.stderr)
        continue
    for tc in root.iter("testcase"):
        name = tc.get("name", "")
        if tc.find("failure") is not None or tc.find("error") is not None:
            el = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            st = ("failed", (el.get("message") or el.text or "").strip().splitlines()[:3])
        elif tc.find("skipped") is not None:
            msg = tc.find("skipped").get("message") or ""
            st = ("skipped", msg) if msg.strip() not in ("", "skipped") else ("notrun", NOT_RUN)
        else:
            st = ("passed", None)
        t = float(tc.get("time") or 0)
        if name not in best or RANK[st[0]] > RANK[best[name][0][0]]:
            best[name] = (st, t)
suites = defaultdict(lambda: {"passed": 0, "failed": 0, "skipped": 0, "time": 0.0,
                              "reasons": Counter(), "failures": []})
pat = re.compile(r"\[Testpattern: (?P<pattern>[^\]]*(?:\][^\s\]][^\]]*)*)\] (?P<suite>\S+)")


def short_reason(msg):
    msg = (msg or "").strip().splitlines()[0] if msg else ""
    msg = re.sub(r"^skipped - ", "", msg)
    msg = re.sub(r"e2e-[a-z0-9-]+", "<ns>", msg)
    return msg[:140]


passed_specs = []
for name, ((status, detail), t) in sorted(best.items()):
    if "External Storage" not in name:
        continue
    m = pat.search(name)
    suite = m.group("suite") if m else "(other)"
    suite = re.sub(r"\[.*$", "", suite) or suite
    s = suites[suite]
    s["time"] += t
    if status == "failed":
        s["failed"] += 1
        s["failures"].append((name, detail))
    elif status in ("skipped", "notrun"):
        s["skipped"] += 1
        s["reasons"][short_reason(detail)] += 1
    else:
        s["passed"] += 1
        passed_specs.append((t, name))

tot = Counter()
print(f"{'suite':<34} {'passed':>6} {'failed':>6} {'skipped':>7} {'time s':>7}")
for name in sorted(suites):
    s = suites[name]
    print(f"{name:<34} {s['passed']:>6} {s['failed']:>6} {s['skipped']:>7} {s['time']:>7.0f}")
    for k in ("passed", "failed", "skipped", "time"):
        tot[k] += s[k]
print(f"{'TOTAL':<34} {tot['passed']:>6} {tot['failed']:>6} {tot['skipped']:>7} {tot['time']:>7.0f}"
      + (f"   (wall {runtime} s)" if runtime else ""))
print("\nSkip reasons per suite:")
for name in sorted(suites):
    for reason, n in suites[name]["reasons"].most_common():
        print(f"  {name}: {n} x {reason}")
print("\nFailed specs:" if any(s["failures"] for s in suites.values()) else "\nFailed specs: none")
for name in sorted(suites):
    for spec, msg in suites[name]["failures"]:
        print(f"  - {spec}")
        for line in msg:
            print(f"      {line[:200]}")
if list_specs:
    print("\nPassed specs (seconds):")
    for t, name in passed_specs:
        print(f"  {t:6.0f}  {name}")
