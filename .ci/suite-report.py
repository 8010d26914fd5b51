#!/usr/bin/env python3
"""suite-report.py REPORT: one line per suite (a module of tests/suite whose
tests run alone: the real-cluster suites and the fuzz campaign) from the JSON
lines the test binary appended to REPORT (tests/suite/common/report.rs):
passed, failed or skipped with the reason, and its seconds."""
import json
import sys
from collections import OrderedDict


def main(path):
    suites = OrderedDict()
    try:
        with open(path, encoding="utf-8") as f:
            for raw in f:
                raw = raw.strip()
                if not raw:
                    continue
                try:
                    t = json.loads(raw)
                except ValueError:
                    print(f"suite report: unreadable line {raw[:80]!r}")
                    continue
                suite = t["test"].split("::", 1)[0]
                suites.setdefault(suite, []).append(t)
    except FileNotFoundError:
        print("suite report: none written (cargo test stopped before the suite binary ran)")
        return
    print("\n== suites (real clusters and the fuzz campaign), in the order they ended ==")
    total = 0.0
    for suite, tests in suites.items():
        secs = sum(t["seconds"] for t in tests)
        total += secs
        failed = [t["test"].split("::")[-1] for t in tests if t["outcome"] == "failed"]
        skipped = [t for t in tests if t["outcome"] == "skipped"]
        n = len(tests)
        if failed:
            verdict = f"FAILED ({len(failed)} of {n} tests: {', '.join(failed)})"
        elif skipped and len(skipped) == n:
            reasons = sorted({t["why"] for t in skipped})
            verdict = "skipped: " + "; ".join(reasons)
        elif skipped:
            parts = sorted({f'{t["test"].split("::")[-1]}: {t["why"]}' for t in skipped})
            verdict = f"passed, {len(skipped)} of {n} tests skipped ({'; '.join(parts)})"
        else:
            verdict = f"passed ({n} test{'s' if n != 1 else ''})"
        print(f"{suite:<28} {secs:>7.0f} s  {verdict}")
    print(f"{'(all of them)':<28} {total:>7.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
