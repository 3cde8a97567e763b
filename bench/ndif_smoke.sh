#!/usr/bin/env bash
# By hand, not in CI: stand up a self-hosted NDIF (PyPI ndif 0.1.2) as far as this machine allows and run the app's
# nnsight traces against it with remote=True (issue 73). Each step prints what it did and stops at the first that
# cannot go on; the README's "nnsight and NDIF" section records one run's output.
#
#   bash bench/ndif_smoke.sh [WORKDIR]          # default /tmp/ndif-smoke
#
# Steps: 1. a Python >= 3.12 (ndif requires it; the app's own is 3.11) in a venv under WORKDIR; 2. pip install
# "ndif[api,ray]==0.1.2" there (torch, ray, redis client, fastapi…); 3. `ndif doctor` (versions, binaries, GPU);
# 4. `ndif start` (redis, rustfs, ray, api), which needs redis-server, a rustfs binary and an NVIDIA GPU; 5. the app's
# traces (bench/ndif_trace.py) with remote=True against http://localhost:8001, compared with remote=False here.
# Whatever step 4 reaches, bench/ndif_trace.py also runs remote="local" (nnsight's serialised dry run), which needs
# no server.
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/ndif-smoke}
mkdir -p "$WORK"
say() { printf '== %s\n' "$*"; }

say "1. a Python >= 3.12 for ndif (this project runs on $(python3 --version 2>&1))"
PY312=""
# on PATH, or a pyenv build (pyenv's shims answer only for the selected version)
for cand in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python3; do
  if "$cand" -c 'import sys; assert (3, 12) <= sys.version_info < (3, 14)' 2>/dev/null; then
    PY312=$(command -v "$cand"); break
  fi
done
if [ -z "$PY312" ]; then say "STOP: no Python 3.12/3.13 here; ndif 0.1.2 requires >=3.12,<3.14"; exit 1; fi
say "using $PY312 ($("$PY312" --version))"
[ -x "$WORK/venv/bin/python" ] || "$PY312" -m venv "$WORK/venv"

say "2. pip install ndif[api,ray]==0.1.2 into $WORK/venv"
if ! "$WORK/venv/bin/python" -m pip install -q "ndif[api,ray]==0.1.2" >"$WORK/install.log" 2>&1; then
  tail -5 "$WORK/install.log"; say "STOP: ndif did not install (log: $WORK/install.log)"; exit 1
fi
"$WORK/venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(ndif|nnsight|torch|ray|transformers) ' | sed 's/^/   /'

say "3. ndif doctor"
"$WORK/venv/bin/ndif" doctor 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | tail -25 | sed 's/^/   /'

say "4. ndif start (redis, rustfs, ray, api)"
if ! "$WORK/venv/bin/ndif" start >"$WORK/start.log" 2>&1; then
  sed 's/\x1b\[[0-9;]*m//g' "$WORK/start.log" | grep -v '^[[:space:]█╗╔║╚═╝]*$' | tail -6 | sed 's/^/   /'
  say "ndif start failed (log: $WORK/start.log)"
fi
UP=0
for _ in $(seq 1 30); do
  if python3 -c 'import urllib.request; urllib.request.urlopen("http://localhost:8001/ping", timeout=2)' 2>/dev/null; then
    UP=1; break
  fi
  sleep 2
done
[ "$UP" = 1 ] && say "the API answers on http://localhost:8001" || say "the API does not answer on http://localhost:8001"

say "5. the app's traces: remote=False, remote='local' and (server up) remote=True"
if [ "$UP" = 1 ]; then
  NDIF_HOST=http://localhost:8001 python3 bench/ndif_trace.py --remote
else
  python3 bench/ndif_trace.py
fi
