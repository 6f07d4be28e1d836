"""Where the broker's (and a frontend's) time goes under load: py-spy samples of each process
while the closed loop of bench/scaling_bench.py runs (``null_fp32``, JSON, C clients). From the
repository root, with py-spy installed anywhere (it is not a dependency of shoal):

    .venv/bin/python -m bench.hops_profile --py-spy /path/to/py-spy [--seconds 8]

Prints, per process, the share of its active samples (py-spy leaves idle waits out) spent in
each function (self) and under each function (inclusive). Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import pathlib
import subprocess
import tempfile
import threading
import time

from bench import loadgen, servers
from bench.hops_bench import MODEL, write_body, write_null_repository
from bench.scaling_bench import role

ROLES = ("broker", "frontend")


def summarize(path: pathlib.Path, top: int) -> str:
    """Self and inclusive shares of a py-spy raw (collapsed stacks) file."""
    own: collections.Counter[str] = collections.Counter()
    under: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, count_text = line.rsplit(" ", 1)
        frames, count = stack.split(";"), int(count_text)
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            under[frame] += count
    lines = [f"{total} active samples", "self:"]
    lines += [f"  {n * 100 / total:5.1f}% {f}" for f, n in own.most_common(top)]
    lines.append("inclusive:")
    lines += [f"  {n * 100 / total:5.1f}% {f}" for f, n in under.most_common(top * 2)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--py-spy", required=True, help="the py-spy executable")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-hops-profile-") as tmp:
        root = pathlib.Path(tmp)
        profiles = root / "profiles"
        profiles.mkdir()
        server = servers.launch_shoal(write_null_repository(root), root, [], MODEL)
        try:
            pids = {role(p): p.pid for p in server.processes() if role(p) in ROLES}
            load = argparse.Namespace(host="127.0.0.1", port=server.port,
                                      path=f"/v2/models/{MODEL}/infer",
                                      body_file=str(write_body(root)), header=[],
                                      concurrency=args.concurrency, seconds=args.seconds + 4)
            driver = threading.Thread(target=lambda: print(asyncio.run(loadgen.run(load))))
            driver.start()
            time.sleep(2)  # past the warm-up
            samplers = [subprocess.Popen(
                [args.py_spy, "record", "-p", str(pids[name]), "-d", str(args.seconds),
                 "-r", "200", "-f", "raw", "--nonblocking", "-o", str(profiles / f"{name}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name in pids]
            for sampler in samplers:
                sampler.wait()
            driver.join()
        finally:
            server.process.terminate()
            server.process.wait(timeout=120)
        for name in pids:
            print(f"== {name}\n{summarize(profiles / f'{name}.txt', args.top)}")


if __name__ == "__main__":
    main()
