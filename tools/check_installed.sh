#!/usr/bin/env bash
# The documented commands against an installed decoctl (make test-installed): run from a folder outside the source
# tree, with the environment that holds the wheels first on PATH. $1: the source tree (for the example C controllers
# and prompts, which a user copies; nothing is imported from it).
set -euo pipefail
ROOT=$(cd "$1" && pwd)
step() { printf '\n== %s\n' "$*"; }

step "decoctl is the installed one"
python - "$ROOT" <<'EOF'
import sys
from pathlib import Path

import decoctl
import decoctl_models
import decoctl_speculative

root = Path(sys.argv[1])
for module in (decoctl, decoctl_speculative, decoctl_models):
    where = Path(module.__file__).resolve()
    if root in where.parents and "site-packages" not in where.parts:
        sys.exit(f"{module.__name__} was imported from the source tree ({where}), not from the installed wheel")
print("decoctl", decoctl.__version__, "from", Path(decoctl.__file__).parent)
EOF
decoctl --version

step "plugins and models"
decoctl plugins | tee plugins.txt
grep -q "speculative *decoctl-speculative 0" plugins.txt
decoctl models
decoctl models info pycode-small

step "generate"
decoctl generate "def fibonacci(n):" -m pycode-small -n 16
decoctl generate "import os" -m pycode-small -c speculative -o drafter=prompt-lookup -n 16

step "a short bench"
decoctl bench -m pycode-small -n 8 --repeats 1 --contenders greedy,raw-ort

step "serve answers a request"
decoctl serve -m pycode-small --port 0 --threads 1 > serve.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
python - <<'EOF'
import json
import re
import time
import urllib.request
from pathlib import Path

deadline = time.monotonic() + 60
port = None
while time.monotonic() < deadline and port is None:
    found = re.search(r"http://127\.0\.0\.1:(\d+)", Path("serve.log").read_text())
    port = found and int(found.group(1))
    time.sleep(0.2)
if port is None:
    raise SystemExit("decoctl serve did not say where it listens:\n" + Path("serve.log").read_text())
body = json.dumps({"model": "pycode-small", "prompt": "def add(a, b):", "max_tokens": 8}).encode()
while True:
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
        )
        answer = json.load(urllib.request.urlopen(request, timeout=30))
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
print("completion:", repr(answer["choices"][0]["text"]))
assert answer["usage"]["completion_tokens"] > 0
EOF
kill $SERVER
wait $SERVER 2>/dev/null || true
trap - EXIT

step "a C controller built against the installed header"
cp -r "$ROOT/examples/c_controller" c_controller
rm -rf c_controller/build
make -s -C c_controller ABI="$(python -m decoctl.abi --include-dir)"
decoctl generate -m pycode-small -c ./c_controller/build/libgreedy.so:greedy "def f(x):" -n 8
echo
echo "installed: every documented command ran"
