# JUnit test cases written by shell tests, for tests/junit_count.py (which reads the XML Bazel's $XML_OUTPUT_FILE
# names). Sourced, not run. Cases are appended to the file $JUNIT_CASES (made on first use), so that processes the
# test starts (a part of it run in another namespace) can add theirs; junit_report writes the XML.
#
#   junit_pass NAME                 junit_skip NAME REASON           junit_fail NAME DETAILS
#   junit_check NAME PROBLEMS       passes when PROBLEMS is empty, fails with them otherwise
#   junit_report SUITE              writes $XML_OUTPUT_FILE, prints "N passed, N failed, N skipped"; status 1 on a failure

: "${JUNIT_CASES:=$(mktemp "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/junit-cases.XXXXXX")}"
export JUNIT_CASES

junit_escape() { sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g'; }
junit_pass() {
  printf '<testcase name="%s"/>\n' "$(printf '%s' "$1" | junit_escape)" >>"$JUNIT_CASES"
  echo "PASS $1"
}
junit_skip() {
  printf '<testcase name="%s"><skipped message="%s"/></testcase>\n' "$(printf '%s' "$1" | junit_escape)" \
    "$(printf '%s' "$2" | junit_escape | tr '\n' ' ')" >>"$JUNIT_CASES"
  echo "SKIP $1: $2"
}
junit_fail() {
  printf '<testcase name="%s"><failure message="failed">%s</failure></testcase>\n' \
    "$(printf '%s' "$1" | junit_escape)" "$(printf '%s' "$2" | junit_escape)" >>"$JUNIT_CASES"
  printf 'FAIL %s:\n%s\n' "$1" "$2"
}
junit_check() { if [ -z "$2" ]; then junit_pass "$1"; else junit_fail "$1" "$2"; fi; }
junit_report() {
  local passed failed skipped
  # A failure's details may span lines: count the cases by their opening tags.
  passed=$(grep -c '^<testcase name="[^"]*"/>$' "$JUNIT_CASES")
  failed=$(grep -c '<failure ' "$JUNIT_CASES")
  skipped=$(grep -c '<skipped ' "$JUNIT_CASES")
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites><testsuite name=\"$1\" tests=\"$((passed + failed + skipped))\" failures=\"$failed\"" \
      "skipped=\"$skipped\">"
    cat "$JUNIT_CASES"
    echo '</testsuite></testsuites>'
  } >"${XML_OUTPUT_FILE:-/dev/null}"
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}
