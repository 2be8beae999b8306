#!/usr/bin/env bash
# The main job: `reskip compress` on the bundled default model (SmolLM2-135M-Instruct) and data, into
# runs/compress (rerun the same command to resume it; `bash scripts/run.sh --out DIR` for another folder).
# It prints the report and where the compressed model and its report are.
source "$(dirname "$0")/setup-env.sh"
reskip compress --out runs/compress "$@"
