"""Sending a large answer from a worker's output segment: ``write`` from the mapping (what the
lean transport's ``writelines`` of memoryviews does) vs ``os.sendfile`` from the segment's
descriptor. From the repository root:

    .venv/bin/python -m bench.http_send_bench --mb 64 --repeat 15

A receiver process reads everything over loopback TCP into one buffer; the sender's CPU time
(user + system of this process, which only sends) per answer is what each way costs the
frontend. Both ways alternate, back to back. Prints a JSON line. Note: ``sendfile`` hands the
segment's pages to the socket by reference, so a page rewritten before the client has read it
would be sent rewritten: it is only safe if the memory is not reused meanwhile (see
bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import socket
import statistics
import time

import numpy as np
import posix_ipc


def receive(port: int, nbytes: int, rounds: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    for _ in range(rounds):
        got = 0
        while got < nbytes:
            got += sock.recv_into(view[got:])
        sock.sendall(b"k")
    sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    nbytes = args.mb << 20
    name = f"/shoal-sendbench-{os.getpid()}"
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=nbytes)
    try:
        mapping = mmap.mmap(shm.fd, nbytes)
        np.frombuffer(mapping, np.uint8)[:] = 7  # faulted in, as a worker's written output
        view = memoryview(mapping)
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        rounds = 2 * (args.repeat + 1)
        child = multiprocessing.Process(target=receive, args=(
            listening.getsockname()[1], nbytes, rounds))
        child.start()
        sock, _ = listening.accept()
        times: dict[str, list[float]] = {"write_from_mapping": [], "sendfile": []}

        def write_from_mapping() -> None:
            sock.sendall(view)

        def sendfile() -> None:
            sent = 0
            while sent < nbytes:
                sent += os.sendfile(sock.fileno(), shm.fd, sent, nbytes - sent)

        for index in range(rounds):
            name_, send = (("write_from_mapping", write_from_mapping) if index % 2 == 0
                           else ("sendfile", sendfile))
            start = time.process_time()
            send()
            spent = time.process_time() - start
            sock.recv(1)
            if index >= 2:  # one warm-up round each
                times[name_].append(spent * 1e3)
        child.join(30)
        sock.close()
        view.release()
        mapping.close()
        print(json.dumps({"mb": args.mb, "load": os.getloadavg()[0],
                          **{f"{k}_cpu_ms_median": statistics.median(v)
                             for k, v in times.items()}}))
    finally:
        shm.close_fd()
        posix_ipc.unlink_shared_memory(name)


if __name__ == "__main__":
    main()
