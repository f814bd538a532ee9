"""Counts test cases in Bazel's per-target JUnit XML (bazel-testlogs/<pkg>/<name>/test.xml).

usage: junit_count.py RUN_NAME TESTLOGS_DIR //pkg:target...
Prints one line per failing or missing case, then a last line "PASSED FAILED SKIPPED".
A target without test.xml (it did not build, or crashed before writing it) counts as one failure.
"""
import os
import sys
import xml.etree.ElementTree as ET


def main() -> int:
    run, testlogs, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    passed = failed = skipped = 0
    for label in targets:
        pkg, name = label[2:].split(":", 1)
        xml_path = os.path.join(testlogs, pkg, name, "test.xml")
        try:
            root = ET.parse(xml_path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"[{run}] FAILED {label}: no test results ({e.__class__.__name__})")
            failed += 1
            continue
        cases = list(root.iter("testcase"))
        if not cases:
            print(f"[{run}] FAILED {label}: ran no test case")
            failed += 1
            continue
        for case in cases:
            case_name = f"{label} {case.get('classname', '')}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                print(f"[{run}] FAILED {case_name}")
                failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None or case.get("status") == "notrun":
                skipped += 1
            else:
                passed += 1
    print(f"[{run}] {passed} passed, {failed} failed, {skipped} skipped")
    print(passed, failed, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
