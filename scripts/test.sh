#!/usr/bin/env bash
# The test suite: `bash scripts/test.sh [pytest args]`. Exits non-zero when a test fails.
source "$(dirname "$0")/setup-env.sh"
python -m pytest "$@"
