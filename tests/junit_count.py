"""Counts test cases in Bazel's per-target JUnit XML (bazel-testlogs/<pkg>/<name>/test.xml).

usage: junit_count.py RUN_NAME TESTLOGS_DIR //pkg:target...
Prints one line per failing or missing case, then a last line "PASSED FAILED SKIPPED".
A target without test.xml (it did not build, or crashed before writing it) counts as one failure.
"""
import glob
import os
import sys
import xml.etree.ElementTree as ET


def skip_reason(case) -> str:
    """The message of a skipped case (gtest: "file:line\nreason"), without the location."""
    skipped = case.find("skipped")
    message = (skipped.get("message") or skipped.text or "") if skipped is not None else ""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and ":" in lines[0] and lines[0].rsplit(":", 1)[1].isdigit():
        lines = lines[1:]
    return " ".join(lines) or "no reason given"


def main() -> int:
    run, testlogs, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    passed = failed = skipped = 0
    for label in targets:
        pkg, name = label[2:].split(":", 1)
        # One test.xml per target, or one per shard (shard_K_of_N/) / run (run_K_of_N/).
        base = os.path.join(testlogs, pkg, name)
        xml_paths = [os.path.join(base, "test.xml")] if os.path.exists(os.path.join(base, "test.xml")) else sorted(
            glob.glob(os.path.join(base, "shard_*_of_*", "test.xml")))
        # Left-overs of an earlier --runs_per_test run sit beside the shard folders: count only the plain ones.
        plain = [p for p in xml_paths if "_run_" not in p]
        xml_paths = plain or xml_paths
        cases = []
        broken = None
        for xml_path in xml_paths:
            try:
                cases += list(ET.parse(xml_path).getroot().iter("testcase"))
            except (OSError, ET.ParseError) as e:
                broken = f"{xml_path}: {e.__class__.__name__}"
        if not xml_paths or broken:
            print(f"[{run}] FAILED {label}: no test results ({broken or 'no test.xml'})")
            failed += 1
            continue
        if not cases:
            print(f"[{run}] FAILED {label}: ran no test case")
            failed += 1
            continue
        skip_reasons = {}  # reason -> number of cases skipped for it
        for case in cases:
            case_name = f"{label} {case.get('classname', '')}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                print(f"[{run}] FAILED {case_name}")
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None or case.get("status") == "notrun":
                skipped += 1
                reason = skip_reason(case)
                skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
            else:
                passed += 1
        for reason, count in skip_reasons.items():
            print(f"[{run}] SKIPPED {label}: {count} case(s): {reason}")
    print(f"[{run}] {passed} passed, {failed} failed, {skipped} skipped")
    print(passed, failed, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
