#!/usr/bin/env bash
# Runner fixture: exits with the status given as $1; with "hang" never exits (until Bazel's timeout kills it); with
# "flaky" fails the first time it runs and passes the next, the first run leaving the file $UROCE_FIXTURE_MARKER
# (passed with --test_env) behind.
if [ "$1" = flaky ]; then
  if [ -e "${UROCE_FIXTURE_MARKER:?}" ]; then echo "runner fixture: second attempt passes"; exit 0; fi
  touch "$UROCE_FIXTURE_MARKER"
  echo "runner fixture: first attempt fails"
  exit 1
fi
if [ "$1" = hang ]; then
  echo "runner fixture: hanging until the test timeout"
  exec sleep 600
fi
echo "runner fixture: exiting with $1"
exit "$1"
