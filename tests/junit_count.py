"""Counts the test cases of one `bazel test` invocation from its Build Event Protocol file.

usage: junit_count.py RUN_NAME BEP_JSON_FILE //pkg:target...

BEP_JSON_FILE is what `bazel test --build_event_json_file=FILE` wrote: it names, per target, the status Bazel gave it
in this invocation (testSummary.overallStatus) and the test.xml each run/shard/attempt wrote (testResult). Only those
files are read, so a test.xml left in bazel-testlogs by an earlier run never counts.

Prints one line per failing, skipped (with the reason) or flaky target, then a last line "PASSED FAILED SKIPPED FLAKY".
A target fails as a whole when it has no result in this invocation (it did not build, or Bazel stopped first), when
Bazel's status for it is anything but PASSED or FLAKY (FAILED, TIMEOUT, INCOMPLETE, ...) without a failing case saying
why, or when its results are unreadable or hold no case. A FLAKY target (it failed, then passed on a later
--flaky_test_attempts attempt) is neither failed nor passed: its cases are counted as flaky and the target is named.
"""
import json
import sys
import urllib.parse
import xml.etree.ElementTree as ET


def read_events(path):
    """The testSummary status and the test.xml of the last attempt of each run/shard, per label."""
    status = {}
    attempts = {}  # label -> {(run, shard): (attempt, xml path or None)}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            event = json.loads(line)
            ident = event.get("id", {})
            if "testSummary" in ident:
                status[ident["testSummary"]["label"]] = event.get("testSummary", {}).get("overallStatus", "NO_STATUS")
            elif "testResult" in ident:
                tid = ident["testResult"]
                xml = None
                for output in event.get("testResult", {}).get("testActionOutput", []):
                    if output.get("name") == "test.xml":
                        xml = urllib.parse.unquote(urllib.parse.urlparse(output.get("uri", "")).path) or None
                key = (tid.get("run", 1), tid.get("shard", 1))
                runs = attempts.setdefault(tid["label"], {})
                attempt = tid.get("attempt", 1)
                if key not in runs or runs[key][0] < attempt:
                    runs[key] = (attempt, xml)
    return status, attempts


def skip_reason(case) -> str:
    """The message of a skipped case (gtest: "file:line\nreason"), without the location."""
    skipped = case.find("skipped")
    message = (skipped.get("message") or skipped.text or "") if skipped is not None else ""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and ":" in lines[0] and lines[0].rsplit(":", 1)[1].isdigit():
        lines = lines[1:]
    return " ".join(lines) or "no reason given"


def main() -> int:
    run, bep, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    passed = failed = skipped = flaky = 0
    try:
        status, attempts = read_events(bep)
    except (OSError, ValueError) as e:
        status, attempts = {}, {}
        print(f"[{run}] cannot read Bazel's build events {bep}: {e.__class__.__name__}: {e}")
    for label in targets:
        if label not in status:
            print(f"[{run}] FAILED {label}: no result in this run (did not build, or Bazel stopped before it)")
            failed += 1
            continue
        xml_paths = [xml for _, (_, xml) in sorted(attempts.get(label, {}).items())]
        cases = []
        broken = None
        for xml_path in xml_paths:
            try:
                if xml_path is None:
                    raise OSError("no test.xml")
                cases += list(ET.parse(xml_path).getroot().iter("testcase"))
            except (OSError, ET.ParseError) as e:
                broken = f"{xml_path}: {e.__class__.__name__}"
        if not xml_paths or broken:
            print(f"[{run}] FAILED {label}: {status[label]}, no readable test results ({broken or 'no test.xml'})")
            failed += 1
            continue
        skip_reasons = {}  # reason -> number of cases skipped for it
        target_failed = target_passed = 0
        for case in cases:
            case_name = f"{label} {case.get('classname', '')}.{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                print(f"[{run}] FAILED {case_name}")
                target_failed += 1
            elif case.get("result") == "skipped" or case.find("skipped") is not None or case.get("status") == "notrun":
                skipped += 1
                reason = skip_reason(case)
                skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
            else:
                target_passed += 1
        for reason, count in skip_reasons.items():
            print(f"[{run}] SKIPPED {label}: {count} case(s): {reason}")
        if status[label] == "FLAKY" and target_failed == 0:
            # Failed, then passed on a later attempt (--flaky_test_attempts): the cases of the attempt that counts
            # passed, but only on a retry, so they are counted apart, and the target is named so the flake gets looked
            # at.
            print(f"[{run}] FLAKY {label}: failed an attempt, passed on a later one ({target_passed} case(s))")
            flaky += target_passed
            target_passed = 0
        elif status[label] != "PASSED" and target_failed == 0:
            # A timeout, a crash after the last case, or a flaky pass on a later attempt: the cases do not say it.
            print(f"[{run}] FAILED {label}: Bazel says {status[label]}")
            target_failed = 1
        elif not cases:
            print(f"[{run}] FAILED {label}: ran no test case")
            target_failed = 1
        failed += target_failed
        passed += target_passed
    print(f"[{run}] {passed} passed, {failed} failed, {skipped} skipped, {flaky} flaky")
    print(passed, failed, skipped, flaky)
    return 0


if __name__ == "__main__":
    sys.exit(main())
