#!/usr/bin/env bash
# Runner fixture: exits with the status given as $1, or with "hang" never exits (until Bazel's timeout kills it).
if [ "$1" = hang ]; then
  echo "runner fixture: hanging until the test timeout"
  exec sleep 600
fi
echo "runner fixture: exiting with $1"
exit "$1"
