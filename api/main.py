"""The ASGI app built from the environment's settings (`uvicorn api.main:app`, which is what
`coldbench server` serves); tests build theirs with `create_app`."""

import gc

from api.app import create_app

app = create_app()

# The server process's garbage collector. Measured under benchmarks/service_load.py (50 agents,
# docs/RELIABILITY.md): with CPython's defaults the collector took about 1.9 s of each minute,
# the event loop stood still for up to 234 ms in its full collections (every module, model
# and compiled statement scanned each time) and the young generation was collected 550 times.
# What was built at start-up is frozen out of every collection, and the young generation is
# collected every 20,000 allocations instead of 700 (a request allocates thousands: the
# objects of a finished request are freed by reference counting, the collector only finds
# cycles): the collector's time fell to about 0.16 s and the longest stall to 75 ms.
gc.collect()
gc.freeze()
gc.set_threshold(20_000, 10, 10)
