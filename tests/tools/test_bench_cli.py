#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-bench's command line: a bad --rounds or --seconds exits 2 naming the
value, and a short run (tiny windows, two rounds) writes JSON that says how
many windows each figure is the median of and has every table with figures
for gca, the 2-process ceiling included. A partner process that cannot start
leaves that figure out with the reason and nothing else; `gca-bench
--partner` answers its protocol with the benchmark's own loop and reports a
failure of it. Every other way a partner fails, and the protocol's refusals,
are test_bench_procs.c's (scripted partners, no benchmark run each).
Usage: test_bench_cli.py GCA_BENCH."""
import json
import os
import subprocess
import sys
import tempfile

bench = sys.argv[1]
# glibc's peer pairs of 8 and 64 MiB map fresh pages each time; meson's
# MALLOC_PERTURB_ would fill every one of them, minutes for a short run
env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}


def run(*args, extra=None, stdin=None):
    e = dict(env, **(extra or {}))
    return subprocess.run([bench, *args], capture_output=True, text=True, timeout=100, env=e,
                          input=stdin)


for bad in ["0", "16", "2x", "", "-1"]:
    r = run("--rounds", bad)
    assert r.returncode == 2, (bad, r.returncode, r.stderr)
    assert f"--rounds '{bad}' is not a whole number in [1, 15]" in r.stderr, (bad, r.stderr)
r = run("--seconds", "0")
assert r.returncode == 2 and "--seconds '0' is not in (0, 60]" in r.stderr, r.stderr

r = run("--seconds", "0.002", "--rounds", "2", "--json")
assert r.returncode == 0, r.stderr
rep = json.loads(r.stdout)
assert rep["rounds"] == 2, rep["rounds"]
assert rep["seconds_per_measurement"] == 0.002
assert [row["size"] for row in rep["results"]] == [512, 4096, 65536, 1 << 20, 8 << 20, 64 << 20]
for row in rep["results"]:
    for key in ("gca_ns_1t", "gca_ns_2t", "malloc_ns_1t", "exact_ns_1t"):
        assert row[key] > 0, (row["size"], key, row[key])
assert [t["threads"] for t in rep["threads"]] == [1, 2, 4, 8], rep["threads"]
assert all(t["gca_mpairs_per_s"] > 0 for t in rep["threads"]), rep["threads"]
assert {p["pattern"] for p in rep["patterns"]} == {"alternating_4k_12k", "mixed_512b_1m"}
for p in rep["patterns"]:
    for key in ("gca_ns", "exact_ns", "malloc_ns", "gca_ns_2t", "exact_ns_2t", "malloc_ns_2t"):
        assert p[key] > 0, (p["pattern"], key, p[key])
    assert "ratio_jemalloc_1t" in p and "ratio_jemalloc_2t" in p, p
procs = rep["processes"]
assert procs["count"] == 2 and "error" not in procs, procs
assert procs["gca_scaling"] > 0 and procs["gca_mpairs_per_s"] > 0, procs
assert procs["gca_mpairs_per_s_alone"] > 0, procs
assert "ceiling is left out" not in r.stderr, r.stderr
r = run("--seconds", "0.002", "--rounds", "1")
assert r.returncode == 0, r.stderr
assert "each figure the median of 1 windows" in r.stdout, r.stdout[:300]
assert "2 processes at once, each the 1-thread gca loop" in r.stdout, r.stdout

# a partner that cannot start: the figure is left out, with why, and the run goes on
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "missing")
    why = f"cannot start partner 0 ('{path} --partner'): No such file or directory"
    r = run("--seconds", "0.002", "--rounds", "1", "--json", extra={"GCA_BENCH_PARTNER": path})
    assert r.returncode == 0, (path, r.stderr)
    assert f"gca-bench: the 2-process ceiling is left out: {why}" in r.stderr, (why, r.stderr)
    rep = json.loads(r.stdout)
    assert rep["processes"] == {"count": 2, "error": why}, rep["processes"]
    assert all(t["gca_mpairs_per_s"] > 0 for t in rep["threads"]), rep["threads"]

# the partner's side of the protocol, on a pipe, with the benchmark's loop
sim = {"GCA_DEVICE": "sim"}
r = run("--partner", extra=sim, stdin="run 0.002\ngo\nrun 0.002\ngo\n")
lines = r.stdout.splitlines()
assert r.returncode == 0 and len(lines) == 4, (r.returncode, r.stdout, r.stderr)
assert lines[0] == lines[2] == "ready", lines
assert all(l.startswith("ns ") and float(l[3:]) > 0 for l in (lines[1], lines[3])), lines
r = run("--partner", extra=dict(sim, GCA_SIM_FAULTS="stream_create:nth=1"), stdin="run 0.002\n")
assert r.returncode == 1, (r.returncode, r.stdout)
assert r.stdout.startswith("error bench partner: stream_create: "), r.stdout
assert "injected" in r.stdout, r.stdout
print("gca-bench command line: ok")
