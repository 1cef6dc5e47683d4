"""Print every skipped test of a pytest JUnit XML report with its reason; exit 1 when a reason
matches no line of the allow-list file (regular expressions, ``#`` comments), else 0.

Usage: python .ci/check_skips.py REPORT.xml ALLOW_LIST
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET


def allowed_patterns(path: str) -> list[re.Pattern[str]]:
    with open(path, encoding="utf-8") as fh:
        lines = [line.strip() for line in fh]
    return [re.compile(line) for line in lines if line and not line.startswith("#")]


def skipped(report: str) -> list[tuple[str, str]]:
    """(test id, reason) of every skipped test in the report."""
    out = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for skip in case.findall("skipped"):
            if skip.get("type") == "pytest.xfail":
                continue
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            reason = skip.get("message") or (skip.text or "").strip()
            out.append((name, reason.removeprefix("Skipped: ") if hasattr(reason, "removeprefix") else reason))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    patterns = allowed_patterns(argv[2])
    unexpected = 0
    items = skipped(argv[1])
    for name, reason in items:
        ok = any(p.search(reason) for p in patterns)
        unexpected += not ok
        print(f"{'skipped (allowed)' if ok else 'SKIPPED, NOT ALLOWED'}: {name}: {reason}", file=sys.stderr)
    if unexpected:
        print(f".ci/run: {unexpected} test(s) skipped for a reason not on the allow-list {argv[2]}: "
              "make them run here, or add the reason there with a comment saying why", file=sys.stderr)
        return 1
    print(f".ci/run: {len(items)} skipped test(s), all allowed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
