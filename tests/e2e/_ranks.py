"""A job for multi-kernel tests whose ranks must all have printed before any ends.

A session ends when any kernel ends (spec 1's DetectTermination) and its other kernels are then
stopped: two ranks that print and exit race, and a rank started late may be stopped before it
printed. These ranks meet at MASTER_ADDR:MASTER_PORT as a distributed job's do: each prints
first, rank 0 listens and waits for a byte from every other rank, the others connect and send
it. So no rank ends before all have printed, whichever ends first.
"""

from __future__ import annotations

_TEMPLATE = """
import os, socket, sys, time
print({line}, flush=True)
master = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))
if os.environ['RANK'] == '0':
    server = socket.create_server(master)
    for _ in range(int(os.environ['WORLD_SIZE']) - 1):
        peer, _ = server.accept()
        peer.recv(1)
    sys.exit(0)
deadline = time.monotonic() + 60
while True:
    try:
        socket.create_connection(master).sendall(b'x')
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit('rank 0 never listened')
        time.sleep(0.05)
"""


def print_then_meet(line: str) -> str:
    """A `python -c` program: print the Python expression `line`, then meet the other ranks."""
    return _TEMPLATE.format(line=line)
