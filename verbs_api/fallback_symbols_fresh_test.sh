#!/usr/bin/env bash
# Fails when verbs_api/fallback_symbols.cc no longer matches what tools/gen_fallback_symbols.py makes from
# verbs_api/libibverbs.map and /usr/include/infiniband/verbs.h (someone edited the map without regenerating).
set -euo pipefail
cd "${TEST_SRCDIR:?}/${TEST_WORKSPACE:?}"
exec /usr/bin/python3 tools/gen_fallback_symbols.py --check
