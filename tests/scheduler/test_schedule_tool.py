#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-schedule: the --json report has the documented keys under "baseline"
and "scheduled" and a full order; the scheduled figures are no worse than the
program order's within the budget; bad usage exits 2 and bad input exits 1,
each with a message naming the problem."""
import json
import os
import subprocess
import sys
import tempfile

tool, graph = sys.argv[1], sys.argv[2]


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def main():
    r = run(graph, "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    keys = ["peak_bytes", "makespan_us", "exposed_comm_us", "collectives_hidden",
            "collectives_total"]
    for side in ("baseline", "scheduled"):
        for k in keys:
            assert k in rep[side], (side, k)
    order = rep["scheduled"]["order"]
    with open(graph) as f:
        ops = [o["name"] for o in json.load(f)["ops"]]
    assert sorted(order) == sorted(ops) and len(order) == len(ops)
    b, s = rep["baseline"], rep["scheduled"]
    assert s["exposed_comm_us"] < b["exposed_comm_us"], (b, s)
    assert s["peak_bytes"] <= rep["budget_bytes"], rep
    assert s["collectives_total"] == b["collectives_total"] == 12

    r = run(graph, "--run", "--time-scale", "0.05", "--json")
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)["run"]
    assert ran["mismatches"] == 0, ran
    assert ran["measured_peak_bytes"] == ran["predicted_peak_bytes"], ran
    env = dict(os.environ)
    env.pop("GCA_SIM_DEVICES", None)  # --ranks sets it
    r = subprocess.run([tool, graph, "--run", "--ranks", "4", "--time-scale", "0.01", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)["run"]
    assert ran["mismatches"] == 0 and ran["measured_peak_bytes"] == ran["predicted_peak_bytes"], ran
    r = run(graph, "--run", "--ranks", "3")
    assert r.returncode == 1 and "does not fit 3 ranks" in r.stderr, r.stderr
    r = run(graph, "--run", "--time-scale", "0")
    assert r.returncode == 2 and "--time-scale '0'" in r.stderr, r.stderr

    r = run(graph, "--budget", "1GiB", "--budget-ratio", "0.1")
    assert r.returncode == 2 and "exclude" in r.stderr, r.stderr
    r = run(graph, "--policy", "fastest")
    assert r.returncode == 2 and "--policy 'fastest'" in r.stderr, r.stderr
    r = run("/nonexistent/graph.json")
    assert r.returncode == 1 and "cannot open /nonexistent/graph.json" in r.stderr, r.stderr
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write('{"format": "gca-opgraph/1", "buffers": [}')
        bad = f.name
    try:
        r = run(bad)
        assert r.returncode == 1 and "offset 40: expected a value" in r.stderr, r.stderr
    finally:
        os.unlink(bad)
    r = run(graph)
    assert r.returncode == 0 and "scheduled" in r.stdout, r.stdout
    print("gca-schedule: ok")


if __name__ == "__main__":
    main()
