#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-replay on PyTorch memory snapshot pickles (written here with the standard
library in the structure torch.cuda.memory._snapshot() has): a snapshot and the
RMM CSV of the same program replay to identical figures (free_requested /
free_completed pairs, allocator-side entries, a block live before the recording,
two streams, two devices); PyTorch's reserved bytes are the segments' total; a
pickle that would import or call code is refused and nothing of it runs;
truncated and corrupted pickles fail with an offset. Usage:
test_torch_pickle.py GCA_REPLAY [CSV] (with a CSV: its snapshot is compared)."""
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile

replay = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="gca-pickle-")


def run(*args):
    r = subprocess.run([replay, *args, "--no-progress", "--repeat", "0"], capture_output=True,
                       text=True, timeout=300)
    return r


def report(*args):
    r = run(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def program(seed, n=400):
    """A random program: (action, addr, size, stream) with frees of live blocks."""
    rng = random.Random(seed)
    live, out, nxt = {}, [], 0x7F0000000000
    for _ in range(n):
        if live and rng.random() < 0.45:
            addr = rng.choice(sorted(live))
            out.append(("free", addr, live.pop(addr), rng.choice([0, 7])))
        else:
            size = rng.choice([512, 4096, 1 << 20, 3 << 20, 65536 + 512 * rng.randrange(9)])
            addr, nxt = nxt, nxt + size + 4096
            live[addr] = size
            out.append(("alloc", addr, size, rng.choice([0, 7])))
    return out


def write_csv(path, events):
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for i, (a, addr, size, stream) in enumerate(events):
            f.write("1,00:00:%02d.%06d,%s,0x%x,%d,0x%x\n" % (i // 1000000, i % 1000000,
                    "allocate" if a == "alloc" else "free", addr, size, stream))


def snapshot(devices, segments):
    """devices: a list of event lists; frees become free_requested + free_completed."""
    traces = []
    for events in devices:
        tr = []
        for i, (a, addr, size, stream) in enumerate(events):
            e = {"action": "alloc" if a == "alloc" else "free_requested", "addr": addr,
                 "size": size, "stream": stream, "time_us": i, "frames": [
                     {"filename": "model.py", "line": 10 + i % 7, "name": "forward"}]}
            tr.append(e)
            if a == "free":
                tr.append(dict(e, action="free_completed"))
            if i % 50 == 0:
                tr.append({"action": "segment_alloc", "addr": addr, "size": 2 << 20,
                           "stream": stream, "time_us": i, "frames": []})
        traces.append(tr)
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"expandable_segments": False, "max_split_size": -1}}


def figures(rep):
    return (rep["peak_live_bytes"], rep["allocations"], rep["frees"],
            [(r["config"], r["peak_reserved_bytes"], r["device_allocations"]) for r in rep["runs"]])


def same_run(csv_path, pickle_path, extra=()):
    cfg = ["--config", "", "--config", "expandable_segments:True"]
    a = report(csv_path, *cfg, *extra)
    b = report(pickle_path, *cfg, *extra)
    assert figures(a) == figures(b), (figures(a), figures(b))
    return b


def main():
    # 1. a program, its CSV and its snapshot: identical figures
    dev0 = program(1)
    # a block live before the recording: its first event is a free
    before = ("free", 0x7E0000000000, 8192, 0)
    segs = [{"device": 0, "address": 0x7F0000000000, "total_size": 20 << 20, "stream": 0,
             "segment_type": "large", "allocated_size": 0, "active_size": 0,
             "blocks": [{"address": 0x7D0000000000, "size": 4096, "requested_size": 4000,
                         "state": "active_allocated", "frames": []}]},
            {"device": 0, "address": 0x7F0001400000, "total_size": 2 << 20, "stream": 7,
             "segment_type": "small", "allocated_size": 0, "active_size": 0, "blocks": []},
            {"device": 1, "address": 0x6F0000000000, "total_size": 6 << 20, "stream": 0,
             "segment_type": "large", "allocated_size": 0, "active_size": 0, "blocks": []}]
    dev1 = program(2, 100)
    snap = snapshot([[before] + dev0, dev1], segs)
    pk = os.path.join(tmp, "run.pickle")
    with open(pk, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    # the CSV of the same program: the live-before blocks allocated first, in address order
    csv = os.path.join(tmp, "run.csv")
    write_csv(csv, [("alloc", 0x7D0000000000, 4096, 0), ("alloc", 0x7E0000000000, 8192, 0)]
              + [before] + dev0)
    rep = same_run(csv, pk)
    assert rep["torch_reserved_bytes"] == 22 << 20, rep
    assert rep["torch_devices"] == 2 and rep["live_before_recording"] == 2, rep
    assert rep["runs"][0]["reserved_over_torch_reserved"] > 0, rep
    # device 1
    csv1 = os.path.join(tmp, "run1.csv")
    write_csv(csv1, dev1)
    rep1 = same_run(csv1, pk, ("--device", "1"))
    assert rep1["torch_reserved_bytes"] == 6 << 20, rep1
    r = run(pk, "--device", "5")
    assert r.returncode == 1 and "device 5: the snapshot has 2 device traces" in r.stderr, r.stderr
    # every protocol the reader takes
    for proto in (2, 3, 5):
        p = os.path.join(tmp, "run%d.pickle" % proto)
        with open(p, "wb") as f:
            pickle.dump(snap, f, protocol=proto)
        same_run(csv, p)
    table = run(pk)
    assert table.returncode == 0 and "PyTorch reserved (snapshot)" in table.stdout, table.stdout

    # 2. a pickle that would run code is refused, and nothing runs
    marker = os.path.join(tmp, "ran")

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + marker,))

    for proto, opcode in ((2, "GLOBAL"), (4, "STACK_GLOBAL")):
        bad = os.path.join(tmp, "evil%d.pickle" % proto)
        with open(bad, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[Evil()]]}, f, protocol=proto)
        r = run(bad)
        assert r.returncode == 1 and ("opcode %s" % opcode) in r.stderr and "refused" in r.stderr, \
            r.stderr
        assert not os.path.exists(marker)

    # 3. truncated and corrupted pickles: a clear error with an offset
    data = open(pk, "rb").read()
    cut = os.path.join(tmp, "cut.pickle")
    open(cut, "wb").write(data[: len(data) // 2])
    r = run(cut)
    assert r.returncode == 1 and "pickle offset" in r.stderr and "truncated" in r.stderr, r.stderr
    bad = bytearray(data)
    bad[len(bad) // 3] = 0xFF
    corrupt = os.path.join(tmp, "corrupt.pickle")
    open(corrupt, "wb").write(bytes(bad))
    r = run(corrupt)
    assert r.returncode == 1 and "pickle offset" in r.stderr, r.stderr
    notsnap = os.path.join(tmp, "list.pickle")
    with open(notsnap, "wb") as f:
        pickle.dump([1, 2, 3], f, protocol=4)
    r = run(notsnap)
    assert r.returncode == 1 and "not a PyTorch memory snapshot" in r.stderr, r.stderr

    # 4. (optional) a real trace and its snapshot
    if len(sys.argv) > 2:
        events = []
        with open(sys.argv[2]) as f:
            next(f)
            for line in f:
                _, _, action, ptr, size, stream = line.strip().split(",")
                if action in ("allocate", "free"):
                    events.append(("alloc" if action == "allocate" else "free", int(ptr, 16),
                                   int(size), int(stream, 16)))
        big = os.path.join(tmp, "trace.pickle")
        with open(big, "wb") as f:
            pickle.dump(snapshot([events], []), f, protocol=4)
        rep = same_run(sys.argv[2], big)
        print("trace %s: identical figures from its CSV and its snapshot; pickle read at %.1f "
              "MB/s (%d bytes)" % (sys.argv[2], rep["pickle_read_mb_per_s"], os.path.getsize(big)))
    print("torch pickle: ok")


if __name__ == "__main__":
    main()
