#!/usr/bin/env bash
# Copy a run folder's measurement files (no weights) into docs/results/: `bash scripts/keep_measurements.sh RUN DEST`.
# Kept: the run's config, splits, log, summary, parity, pipeline state, policy, eval results, diagnostics.
set -euo pipefail
run="$1"; dest="$2"
mkdir -p "$dest"
for f in config.yaml splits.json train_log.jsonl summary.json parity.json pipeline.json policy.json diagnostics.json; do
  [ -f "$run/$f" ] && cp "$run/$f" "$dest/"
done
if [ -d "$run/eval" ]; then mkdir -p "$dest/eval" && cp "$run"/eval/results.{json,md} "$dest/eval/" 2>/dev/null || true; fi
