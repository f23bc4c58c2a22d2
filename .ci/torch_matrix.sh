#!/usr/bin/env bash
# The supported torch range (README, "Requirements"): the whole suite on the floor (2.11, the
# release GPU images ship) and on the newest release (2.15), each in a venv of its own, on the CPU.
# Logs go to .ci/torch_matrix/torch-VERSION.log (the last lines are committed with each run).
#   bash .ci/torch_matrix.sh 2.11.0 2.15.0
# These releases come from the package index as CUDA builds (~530 MB each); a pip cap on this
# machine's torch (/etc/xdg/pip) is bypassed with PIP_CONFIG_FILE=/dev/null.
set -uo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(2.11.0 2.15.0)
for version in "${versions[@]}"; do
  venv=".venv-torch-$version"
  python3 -m venv "$venv"
  PIP_CONFIG_FILE=/dev/null "$venv/bin/pip" install -q "torch==$version" \
    && PIP_CONFIG_FILE=/dev/null "$venv/bin/pip" install -q -e '.[dev]' \
    && "$venv/bin/python" -m pytest -n 2 -p no:cacheprovider > ".ci/torch_matrix/torch-$version.log" 2>&1
  echo "torch $version: exit $?"
done
