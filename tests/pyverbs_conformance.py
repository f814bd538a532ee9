#!/usr/bin/python3
"""rdma-core's own pyverbs tests (python3-pyverbs, rdma-core v44) against our libibverbs.so.1.

usage: pyverbs_conformance.py LIBIBVERBS_SO README_MD [TEST_MODULE...]   (Bazel passes the runfiles paths)

python3-pyverbs ships the tests in /usr/share/doc/rdma-core/tests, some gzipped. They are extracted into
$TEST_TMPDIR/pyverbs/tests (the folder must be named "tests": the modules import tests.base and tests.utils), and each
test module runs in its own /usr/bin/python3 child (only Debian's interpreter imports Debian's pyverbs) as
`run_tests.py --dev uroce0 --gid 0 -v` would run it, with our library first on LD_LIBRARY_PATH. A child records every
unittest case as one JSON line as soon as it ends, so a hang or crash loses only the case that was running; the parent
kills a child after CHILD_TIMEOUT_S and reports the running case as failed. The JUnit file is rewritten after every
module, so even a run Bazel stops at its timeout leaves the results so far.

Every unittest case becomes one JUnit test case in $XML_OUTPUT_FILE (tests/junit_count.py counts them): passed,
failed (failure or error), or skipped with unittest's reason. A skip is accepted only when EXPECTED_SKIPS names its
reason and the README's support table holds the row that says why; any other skip is reported as a failure, so a
capability that silently stops working cannot hide behind a skip.
"""
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import unittest
import xml.etree.ElementTree as ET

PY = "/usr/bin/python3"
RDMA_CORE_TESTS = "/usr/share/doc/rdma-core/tests"
DEVICE_ARGS = ["--dev", "uroce0", "--gid", "0", "-v"]
CHILD_TIMEOUT_S = 120  # a module takes 1-5 s here; a hang costs this much, the rest still runs

# The device-generic modules of rdma-core v44's suite (the others need mlx5, efa, CUDA, librdmacm or a raw ethernet port).
DEFAULT_MODULES = [
    "test_device", "test_pd", "test_mr", "test_cq", "test_cq_events", "test_cqex", "test_qp", "test_qpex", "test_addr",
    "test_atomic", "test_relaxed_ordering", "test_fork", "test_odp", "test_shared_pd", "test_parent_domain",
    "test_tag_matching", "test_rdmacm",
]

# Skips that are honest: (regex on the unittest case id, regex on its skip reason, text of the README support-table
# row that explains it). Both must match, so a case that starts skipping for a new reason, or a new case that skips
# for an old reason, fails.
EXPECTED_SKIPS = [
    (r"tests\.test_qp\.QPTest\.test_.*raw.*", r"Create Raw Packet QP (with|without) (extended )?attrs is not supported",
     "alternate paths / APM, rate limits (non-zero), RAW_PACKET QPs"),
    (r"tests\.test_qpex\.QpExTestCase\.test_qp_ex_rc_atomic_write", r"Extended QP is not supported on this device",
     "ATOMIC_WRITE (IBA 1.5, `IBV_QP_EX_WITH_ATOMIC_WRITE`) | not supported"),
    # The CQ with IBV_WC_EX_WITH_TM_INFO is refused before the test looks at tm_caps.
    (r"tests\.test_tag_matching\..*", r"Extended CQ is not supported|Tag matching is not supported",
     "tag matching (`IBV_SRQT_TM` SRQs, `IBV_WC_EX_WITH_TM_INFO` CQs; `tm_caps` all zero) | not supported"),
    (r"tests\.test_mr\.DmaBuf.*",
     r"Allocating dmabuf is not supported by /dev/dri/renderD\d+|Device /dev/dri/renderD\d+ is not present",
     "dma-buf MRs (`ibv_reg_dmabuf_mr`) | not supported"),
    # pyverbs finds the device's IP address through /sys/class/infiniband/<dev>/device/net/, which the per-process
    # device (this run's) has no entry in; tests/host_device_test.sh runs them on the host device, which has one.
    (r"tests\.test_rdmacm\..*", r"Device uroce0 doesn't have net interface",
     "rdma-core's pyverbs rdmacm tests look for the device's netdev in sysfs"),
    # A host condition, not the device's: the row says so, and the cases pass where pages are reserved.
    (r"tests\.(test_odp|test_parent_domain)\..*huge.*", r"There are no huge pages of size 2M allocated",
     "rdma-core's huge-page tests need pages reserved on the host"),
]


def expected_skip_row(case_id, reason, readme):
    """The README row text that explains a skip, or None when the skip is not an accepted one."""
    for id_pattern, reason_pattern, row in EXPECTED_SKIPS:
        if re.fullmatch(id_pattern, case_id) and re.fullmatch(reason_pattern, reason) and row in readme:
            return row
    return None


def extract_tests(dest, modules):
    """Copies the suite's support modules and the chosen test modules into dest, gunzipping *.py.gz."""
    os.makedirs(dest, exist_ok=True)
    for name in sorted(os.listdir(RDMA_CORE_TESTS)):
        stem = name[:-3] if name.endswith(".gz") else name
        if not stem.endswith(".py"):
            continue
        # __init__.py imports every test_*.py beside it: keep only the chosen ones.
        if stem.startswith("test_") and stem[:-3] not in modules:
            continue
        src = os.path.join(RDMA_CORE_TESTS, name)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(src, "rb") as f, open(os.path.join(dest, stem), "wb") as out:
            shutil.copyfileobj(f, out)
    missing = [m for m in modules if not os.path.exists(os.path.join(dest, m + ".py"))]
    return missing


# ---------------------------------------------------------------- child: runs one module, one JSON line per case

class JsonLinesResult(unittest.TextTestResult):
    """TextTestResult (the -v output in the test log) that also appends each finished case to a JSON-lines file."""

    def __init__(self, stream, descriptions, verbosity, *, sink):
        super().__init__(stream, descriptions, verbosity)
        self._sink = sink
        self._started = 0.0

    def _record(self, test, status, message=""):
        line = {"id": test.id(), "status": status, "message": message, "seconds": time.monotonic() - self._started}
        self._sink.write(json.dumps(line) + "\n")
        self._sink.flush()

    def startTest(self, test):
        self._started = time.monotonic()
        self._sink.write(json.dumps({"running": test.id()}) + "\n")
        self._sink.flush()
        super().startTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        # setUpClass / module-level errors arrive with a _ErrorHolder, whose id() names the fixture.
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "failed", "expected failure: " + self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "passed")


def run_child(tests_dir, module, results_path):
    # As run_tests.py does: the suite's own argument parser takes --dev/--gid, unittest gets the rest.
    sys.path[:0] = [tests_dir, os.path.dirname(tests_dir)]
    sys.argv = ["run_tests.py"] + DEVICE_ARGS
    from args_parser import parser
    parser.parse_args()
    import importlib
    mod = importlib.import_module("tests." + module)
    suite = unittest.defaultTestLoader.loadTestsFromModule(mod)
    with open(results_path, "a") as sink:
        runner = unittest.TextTestRunner(
            stream=sys.stderr, verbosity=2,
            resultclass=lambda *a, **kw: JsonLinesResult(*a, sink=sink, **kw))
        runner.run(suite)
        sink.write(json.dumps({"done": module}) + "\n")
    return 0


# ---------------------------------------------------------------- parent: prepares, runs each module, writes JUnit

def sanitizer_preload(lib):
    """The sanitizer runtimes a --config=asan/tsan build of our library needs loaded first (python is not sanitized)."""
    try:
        out = subprocess.run(["ldd", lib], capture_output=True, text=True, check=False).stdout
    except OSError:
        return []
    return [m.group(1) for m in re.finditer(r"^\s*lib(?:asan|tsan|ubsan|lsan)\S*\s*=>\s*(/\S+)", out, re.M)]


def run_module(module, tests_dir, env, work):
    """Runs one module in a child; returns its cases as dicts (id, status, message, seconds)."""
    results_path = os.path.join(work, module + ".jsonl")
    log_path = os.path.join(work, module + ".log")
    open(results_path, "w").close()
    print(f"=== {module}", flush=True)
    with open(log_path, "w") as log:
        child = subprocess.Popen([PY, os.path.abspath(__file__), "--child", tests_dir, module, results_path],
                                 env=env, cwd=tests_dir, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            rc = child.wait(timeout=CHILD_TIMEOUT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the module's own forked children too (test_fork, multiprocessing)
            rc = child.wait()
            timed_out = True
    with open(log_path) as f:
        log_text = f.read()
    sys.stdout.write(log_text)
    cases, running, done = [], None, False
    with open(results_path) as f:
        for line in f:
            entry = json.loads(line)
            if "running" in entry:
                running = entry["running"]
            elif "done" in entry:
                done = True
            else:
                cases.append(entry)
                running = None
    if not done:
        what = f"timed out after {CHILD_TIMEOUT_S} s" if timed_out else f"exited with status {rc}"
        where = f"while running {running}" if running else "outside any test case"
        cases.append({"id": running or f"tests.{module}.<module>", "status": "failed", "seconds": 0,
                      "message": f"{module} {what} {where}; its output:\n{log_text[-4000:]}"})
    return cases


def write_junit(xml_cases, counts, unfinished=None):
    """Writes the cases so far to $XML_OUTPUT_FILE (Bazel's test.xml), which tests/junit_count.py reads. Until the run
    ends (`unfinished` names the next module) one more case fails, so a run stopped from outside never reads as
    passed."""
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if not xml_path:
        return
    cases = list(xml_cases)
    if unfinished:
        tc = ET.Element("testcase", classname="pyverbs.suite", name="finished")
        ET.SubElement(tc, "failure", message=f"the run stopped before {unfinished} ended")
        cases.append(tc)
    suite = ET.Element("testsuite", name="tests.pyverbs_conformance_test", tests=str(len(cases)),
                       failures=str(counts["failed"] + (1 if unfinished else 0)), skipped=str(counts["skipped"]))
    suite.extend(cases)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(xml_path, encoding="UTF-8", xml_declaration=True)


def main(argv):
    if len(argv) >= 2 and argv[1] == "--child":
        return run_child(argv[2], argv[3], argv[4])
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    lib, readme_path, modules = os.path.abspath(argv[1]), argv[2], argv[3:] or DEFAULT_MODULES
    with open(readme_path) as f:
        readme = f.read()
    work = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "pyverbs")
    shutil.rmtree(work, ignore_errors=True)
    tests_dir = os.path.join(work, "tests")
    xml_cases = []
    counts = {"passed": 0, "failed": 0, "skipped": 0}

    def add_case(case_id, status, message="", seconds=0.0):
        classname, _, name = case_id.rpartition(".")
        tc = ET.Element("testcase", classname="pyverbs." + (classname or "suite"), name=name, time=f"{seconds:.3f}")
        if status == "failed":
            ET.SubElement(tc, "failure", message=message.strip().splitlines()[-1] if message.strip() else "failed").text = message
        elif status == "skipped":
            ET.SubElement(tc, "skipped", message=message)
        xml_cases.append(tc)
        counts[status] += 1

    if not os.path.isdir(RDMA_CORE_TESTS) or not os.access(PY, os.X_OK):
        add_case("setup.python3_pyverbs", "failed", f"{RDMA_CORE_TESTS} or {PY} missing: apt-get install python3-pyverbs")
    else:
        missing = extract_tests(tests_dir, modules)
        for m in missing:
            add_case(f"tests.{m}.<module>", "failed", f"{m}.py(.gz) is not in {RDMA_CORE_TESTS}")
        libdir = os.path.join(work, "lib")
        os.makedirs(libdir)
        os.symlink(lib, os.path.join(libdir, "libibverbs.so.1"))
        env = dict(os.environ, LD_LIBRARY_PATH=libdir, PYTHONDONTWRITEBYTECODE="1")
        preload = sanitizer_preload(lib)
        if preload:
            env["LD_PRELOAD"] = ":".join(preload)
            # The interpreter never frees everything at exit: its leaks are not ours (a later option wins).
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
        for module in modules:
            if module in missing:
                continue
            write_junit(xml_cases, counts, unfinished=module)
            for case in run_module(module, tests_dir, env, work):
                status, message = case["status"], case.get("message", "")
                if status == "skipped":
                    row = expected_skip_row(case["id"], message, readme)
                    if row is None:
                        status, message = "failed", f"skipped for a reason no README support-table row gives: {message}"
                    else:
                        message = f"{message} (README: {row})"
                add_case(case["id"], status, message, case.get("seconds", 0.0))

    write_junit(xml_cases, counts)
    for tc in xml_cases:
        for child in tc:
            if child.tag in ("failure", "skipped"):
                print(f"{child.tag.upper()} {tc.get('classname')}.{tc.get('name')}: {child.get('message')}")
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
