#!/usr/bin/env bash
# The test suite: `bash scripts/test.sh [pytest args]`. Exits non-zero when a test fails.
source "$(dirname "$0")/setup-env.sh"
# The report test opens the HTML report in a real headless browser: Debian's chromium.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
python -m pytest "$@"
