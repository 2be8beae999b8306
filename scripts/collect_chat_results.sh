#!/usr/bin/env bash
# Copy the measurement files of the healing-data experiment's runs (no weights) into docs/results/chat/:
# each arm's compress.json, blocks.json, report.json/.md, heal/summary.json, heal/train_log.jsonl,
# heal/config.yaml and its self-written data's settings and summary; each side-by-side table's results.json/table.md.
set -euo pipefail
src=${1:-runs/chat}
dst=docs/results/chat
mkdir -p "$dst"
for arm in "$src"/*/; do
  name=$(basename "$arm")
  [ "$name" = data ] && continue
  out="$dst/$name"
  mkdir -p "$out"
  for f in compress.json blocks.json report.json report.md results.json table.md heal/summary.json \
           heal/train_log.jsonl heal/config.yaml self-data/settings.json self-data/summary.json \
           prompt-data/settings.json prompt-data/summary.json; do
    [ -f "$arm/$f" ] && { mkdir -p "$out/$(dirname "$f")"; cp "$arm/$f" "$out/$f"; }
  done
  rmdir "$out" 2>/dev/null || true
done
for f in "$src"/data/*/settings.json "$src"/data/*/summary.json; do
  [ -f "$f" ] && { d="$dst/data/$(basename "$(dirname "$f")")"; mkdir -p "$d"; cp "$f" "$d/"; }
done
grep -rlF "$PWD/" "$dst" | xargs -r sed -i "s#$PWD/##g"   # paths relative to the checkout
echo "copied into $dst"
