#!/bin/sh
# A push's gate (plait push --gate-command examples/healthy.sh): exit 0 when every
# task of the job in service discovery answers HTTP on /, 1 otherwise. The job is
# PLAIT_JOB (set by plait push), else the first argument, else web.
#   PLAIT: the plait command (default: .venv/bin/plait, else plait on PATH)
set -eu
job="${PLAIT_JOB:-${1:-web}}"
plait="${PLAIT:-.venv/bin/plait}"
[ -x "$plait" ] || plait=plait
"$plait" discover "$job" -o json | python3 -c '
import json, sys, urllib.request
endpoints = [e["endpoint"] for e in json.load(sys.stdin)["endpoints"]]
if not endpoints:
    sys.exit("no endpoint in discovery")
for endpoint in endpoints:
    try:
        urllib.request.urlopen(f"http://{endpoint}/", timeout=2)
    except OSError as exc:
        sys.exit(f"{endpoint} does not answer: {exc}")
print(f"{len(endpoints)} endpoints answer")
'
