#!/usr/bin/env bash
# The main job on the bundled default model and data: `bash scripts/run.sh [reskip run flags]`.
source "$(dirname "$0")/setup-env.sh"
reskip run "$@"
