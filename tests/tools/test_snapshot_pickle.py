#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-snapshot --pickle: a gca snapshot (written by gca-replay --snapshot)
converted to PyTorch's pickle reads back with Python's pickle under a
restricted unpickler (no class may be loaded) equal, field by field and figure
by figure, to the JSON snapshot; gca-replay reads that pickle back as a
PyTorch snapshot and gca-snapshot renders it as it renders the JSON; a pickle
that would run code is refused. Usage: test_snapshot_pickle.py GCA_REPLAY
GCA_SNAPSHOT."""
import io
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile

replay, snapshot_tool = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="gca-snappk-")


class Restricted(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused %s.%s" % (module, name))


def main():
    rng = random.Random(3)
    csv = os.path.join(tmp, "t.csv")
    live, nxt = [], 0x7F0000000000
    with open(csv, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for i in range(300):
            if live and rng.random() < 0.4:
                p, s = live.pop(rng.randrange(len(live)))
                f.write("1,00:00:00.%06d,free,0x%x,%d,0x0\n" % (i, p, s))
            else:
                s = rng.choice([512, 8192, 1 << 20, 5 << 20])
                f.write("1,00:00:00.%06d,allocate,0x%x,%d,0x0\n" % (i, nxt, s))
                live.append((nxt, s))
                nxt += s + 4096
    snap = os.path.join(tmp, "snap.json")
    r = subprocess.run([replay, csv, "--no-progress", "--repeat", "0", "--snapshot", snap],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    pk = os.path.join(tmp, "snap.pickle")
    r = subprocess.run([snapshot_tool, snap, "--pickle", pk], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    with open(snap) as f:
        want = json.load(f)
    with open(pk, "rb") as f:
        got = Restricted(io.BytesIO(f.read())).load()
    assert got == want, "the pickle differs from the JSON snapshot"
    for key in ("segments", "device_traces", "allocator_settings"):
        assert key in got, key
    assert len(got["device_traces"][0]) > 0
    # gca-replay reads it back as a PyTorch snapshot
    r = subprocess.run([replay, pk, "--no-progress", "--repeat", "0", "--json", "--lenient"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["torch_reserved_bytes"] == sum(s["total_size"] for s in got["segments"]), rep
    # gca-snapshot renders the pickle as it renders the JSON
    a = subprocess.run([snapshot_tool, snap, "--text"], capture_output=True, text=True)
    b = subprocess.run([snapshot_tool, pk, "--text"], capture_output=True, text=True)
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert a.stdout == b.stdout, (a.stdout, b.stdout)
    html = os.path.join(tmp, "snap.html")
    r = subprocess.run([snapshot_tool, pk, "-o", html], capture_output=True, text=True)
    assert r.returncode == 0 and os.path.getsize(html) > 1000, r.stderr
    marker = os.path.join(tmp, "ran")

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + marker,))

    evil = os.path.join(tmp, "evil.pickle")
    with open(evil, "wb") as f:
        pickle.dump({"segments": [Evil()], "device_traces": []}, f, protocol=4)
    r = subprocess.run([snapshot_tool, evil, "--text"], capture_output=True, text=True)
    assert r.returncode == 2 and "STACK_GLOBAL" in r.stderr and "refused" in r.stderr, r.stderr
    assert not os.path.exists(marker)
    r = subprocess.run([snapshot_tool, csv, "--pickle", pk], capture_output=True, text=True)
    assert r.returncode == 2 and "json" in r.stderr, r.stderr
    print("snapshot pickle: ok (%d bytes of JSON, %d of pickle)" %
          (os.path.getsize(snap), os.path.getsize(pk)))


if __name__ == "__main__":
    main()
