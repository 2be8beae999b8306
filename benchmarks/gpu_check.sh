#!/usr/bin/env bash
# The prepared GPU check, one script and one call:
#   bash benchmarks/gpu_check.sh OUT                    # on one GPU: under 9 minutes on an H200
#   bash benchmarks/gpu_check.sh --device cpu --tiny OUT  # its CPU dry run (a few minutes; a test runs it)
# Nothing is downloaded: the backbones are random weights of architectures the package ships (Qwen3-1.7B on the
# GPU, a 12-layer SmolLM2-135M in the dry run). Items, each one JSON line on stdout and OUT/<item>.json, its
# whole output in OUT/<item>.log:
#   environment - torch, transformers, the device;
#   cuda_tests  - the tests marked `cuda` on the device: parity exact in bfloat16, the exact KV cache under
#                 skipping, the device runtime's decisions equal to the CPU's;
#   train       - the retrofit training step's tokens/s and model-FLOP utilisation at 8 x 2048 tokens in bfloat16,
#                 and the side-channel's share of a training pass (benchmarks/train_throughput.py);
#   speed       - decode tokens/s at batch 1, 8 and 64 and a 2048-token prefill for the backbone, the retrofit,
#                 static and a fixed-quantile ReSkip at one and two blocks per step (each against the backbone,
#                 measured and FLOP-ideal), the router's overhead, peak memory (benchmarks/speed.py --per-step 1,2).
# The last line is the summary: each item's exit code and the targets read off the results.
set -uo pipefail

DEVICE=cuda
TINY=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:?--device needs a value}"; shift 2 ;;
    --tiny) TINY=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "gpu_check: one results folder, got $OUT and $1" >&2; exit 2; }; OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || { echo "usage: bash benchmarks/gpu_check.sh [--device cpu] [--tiny] OUT" >&2; exit 2; }
mkdir -p "$OUT" || exit 2

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="$(command -v python || command -v python3)"
export HF_HUB_OFFLINE=1 PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT" || exit 2

if [ "$TINY" = 1 ]; then
  MODEL=(--random-config SmolLM2-135M --num-layers 12)
  TRAIN=(--batch 2 --seq-len 64 --repeats 1)
  SPEED=(--batches 1,2 --prompt-len 16 --decode-steps 4 --prefill-len 64 --repeats 1 --per-step 1,2)
  LIMIT=300
else
  MODEL=(--random-config Qwen3-1.7B)
  TRAIN=(--batch 8 --seq-len 2048 --repeats 2)
  SPEED=(--batches 1,8,64 --prompt-len 128 --decode-steps 32 --prefill-len 2048 --repeats 3 --per-step 1,2)
  LIMIT=240
fi

# item NAME SECONDS COMMAND...: run it under a time limit, keep its output, print and write its JSON line
item() {
  local name="$1" limit="$2"; shift 2
  local t0; t0=$(date +%s.%N)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  "$PY" - "$name" "$rc" "$t0" "$OUT/$name.log" "$DEVICE" > "$OUT/$name.json" <<'EOF'
import json, re, sys, time
name, rc, t0, log, device = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(log, encoding="utf-8", errors="replace").read()
result = None
for line in reversed(text.splitlines()):  # the item's own JSON line: its last line that is one
    try:
        result = json.loads(line)
        break
    except ValueError:
        continue
if name == "cuda_tests":
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", text))
    result = {"passed": counts.get("passed", 0), "failed": counts.get("failed", 0) + counts.get("error", 0)
              + counts.get("errors", 0), "skipped": counts.get("skipped", 0)}
print(json.dumps({"item": name, "device": device, "rc": rc, "timed_out": rc in (124, 137),
                  "seconds": round(time.time() - t0, 1), "result": result}))
EOF
  cat "$OUT/$name.json"
}

item environment 60 "$PY" -c "
import json, platform, torch, transformers
cuda = torch.cuda.is_available()
print(json.dumps({'date': __import__('datetime').date.today().isoformat(), 'python': platform.python_version(),
                  'torch': torch.__version__, 'transformers': transformers.__version__, 'cuda': cuda,
                  'gpu': torch.cuda.get_device_name(0) if cuda else None,
                  'gpu_memory_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else None,
                  'cpu_threads': torch.get_num_threads()}))"
RESKIP_TEST_DEVICE="$DEVICE" item cuda_tests "$LIMIT" "$PY" -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider
item train "$LIMIT" "$PY" benchmarks/train_throughput.py "${MODEL[@]}" --device "$DEVICE" --dtypes bfloat16 "${TRAIN[@]}"
item speed "$LIMIT" "$PY" benchmarks/speed.py "${MODEL[@]}" --device "$DEVICE" --dtype bfloat16 "${SPEED[@]}"

"$PY" - "$OUT" > "$OUT/summary.json" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
items = {n: json.loads((out / f"{n}.json").read_text()) for n in ("environment", "cuda_tests", "train", "speed")}
train, speed = items["train"]["result"] or {}, items["speed"]["result"] or {}
prefill = next((v for k, v in speed.items() if k.startswith("prefill_") and isinstance(v, dict)), {})
targets = {
    "cuda_tests_pass": (items["cuda_tests"]["result"] or {}).get("failed", 1) == 0
                       and (items["cuda_tests"]["result"] or {}).get("passed", 0) > 0,
    "train_mfu": train.get("mfu_retrofit_bfloat16"), "train_mfu_min": 0.35,
    # the router with nothing skipped, against the backbone: at most 3% at batch 1, 2% at batch 8 and at the prefill
    "router_overhead_batch_1": speed.get("batch_1", {}).get("router_overhead_no_skip"), "router_overhead_batch_1_max": 0.03,
    "router_overhead_batch_8": speed.get("batch_8", {}).get("router_overhead_no_skip"),
    "router_overhead_prefill": prefill.get("router_overhead_no_skip"), "router_overhead_max": 0.02,
    # one block of the eight skipped, against the bare backbone: the share of its FLOP-ideal speed-up reached
    **{f"{m}_vs_backbone_over_ideal_{where}": row.get(f"{m}_vs_backbone_over_ideal")
       for m in ("static_1", "reskip_1") for where, row in (("batch_8", speed.get("batch_8", {})), ("prefill", prefill))},
    "vs_backbone_over_ideal_min": 0.95,
}
print(json.dumps({"item": "summary", "rc": {n: i["rc"] for n, i in items.items()}, "targets": targets}))
EOF
cat "$OUT/summary.json"
"$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(1 if any(s['rc'].values()) else 0)" "$OUT/summary.json"
