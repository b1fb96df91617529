"""``plait bench cli``: what a person or a script waits for at the command line.

A ``plait serve --sim-agents`` in its own process (``plait.bench.api.Server``), and
the ``plait`` command run as a person runs it, one process per call, the API found
through ``PLAIT_URL``/``PLAIT_TOKEN``:

* ``cli_deploy_ms``: the median wall time of ``sequential`` runs of
  ``plait job deploy`` of an unchanged spec (the job exists: the call stores
  nothing new), each a whole process from start to exit;
* ``cli_parallel_deploys_per_s``: ``parallel`` deploys of distinct one-task jobs
  from ``shells`` shells at once, each shell running its share one after another;
  the rate is the deploys over the wall time of the whole batch, with YAML spec
  files; ``cli_parallel_deploys_per_s_json`` the same with JSON spec files (read
  without a YAML parser). Every job is checked to be stored afterwards.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from plait.bench.api import Server

SPEC = """name: {name}
entitlement: bench
task_count: 1
resources: {{cpu: 0.1, memory_gb: 0.1}}
command: serve
"""


def _plait() -> list[str]:
    """The ``plait`` command beside this interpreter (a venv's), else the module."""
    script = Path(sys.executable).parent / "plait"
    return [str(script)] if script.exists() else [sys.executable, "-m", "plait.cli.main"]


def run(sequential: int = 20, parallel: int = 200, shells: int = 8,
        machines: int = 400) -> dict[str, Any]:
    plait = _plait()
    with Server(machines, tick=0.1) as server, tempfile.TemporaryDirectory() as tmp:
        server.entitlement()
        env = {**os.environ, "PLAIT_URL": server.url, "PLAIT_TOKEN": server.token,
               "PLAIT_CONFIG": str(Path(tmp) / "config.yaml")}
        first = Path(tmp) / "web.yaml"
        first.write_text(SPEC.format(name="cli-web"))

        def deploy(path: Path) -> tuple[float, int, str]:
            started = time.perf_counter()
            done = subprocess.run([*plait, "job", "deploy", str(path)], env=env,
                                  capture_output=True, stdin=subprocess.DEVNULL)
            return time.perf_counter() - started, done.returncode, done.stderr.decode()[-300:]

        _, code, why = deploy(first)  # creates it
        if code != 0:
            raise RuntimeError(f"plait job deploy failed: {why}")
        times = []
        failures = 0
        for _ in range(sequential):
            took, code, why = deploy(first)
            times.append(took)
            failures += code != 0
        errors: list[str] = []

        def burst(prefix: str, as_json: bool) -> float:
            """``parallel`` deploys of new jobs from ``shells`` shells: the wall time."""
            specs = []
            for i in range(parallel):
                name = f"{prefix}{i:04d}"
                path = Path(tmp) / f"{name}.{'json' if as_json else 'yaml'}"
                path.write_text(json.dumps(yaml.safe_load(SPEC.format(name=name)))
                                if as_json else SPEC.format(name=name))
                specs.append(path)

            def shell(share: list[Path]) -> None:
                for path in share:
                    _, code, why = deploy(path)
                    if code != 0:
                        errors.append(why)

            workers = [threading.Thread(target=shell, args=(specs[k::shells],))
                       for k in range(shells)]
            started = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            return time.perf_counter() - started

        wall = burst("cli-", as_json=False)
        wall_json = burst("cli-json-", as_json=True)
        listed = httpx.get(f"{server.url}/v1/jobs", timeout=60,
                           headers={"Authorization": f"Bearer {server.token}"}).json()["jobs"]
        stored = sum(1 for j in listed if j["name"].startswith(("cli-0", "cli-json-")))
    ms = sorted(t * 1000 for t in times)
    return {
        "cli_deploy_ms": round(statistics.median(ms), 1),
        "cli_deploy_min_ms": round(ms[0], 1), "cli_deploy_max_ms": round(ms[-1], 1),
        "sequential": sequential, "sequential_failures": failures,
        "cli_parallel_deploys_per_s": round(parallel / wall, 1),
        "cli_parallel_deploys_per_s_json": round(parallel / wall_json, 1),
        "parallel": parallel, "shells": shells, "parallel_failures": len(errors),
        "parallel_jobs_stored": stored, "parallel_wall_s": round(wall, 2),
        "first_error": errors[0] if errors else None,
    }
