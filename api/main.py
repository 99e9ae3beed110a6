"""The ASGI app built from the environment's settings (`uvicorn coldbench.api.main:app`, which is
what `coldbench server` serves); tests build theirs with `create_app`."""

import gc

from coldbench.api.app import create_app

app = create_app()

# The server process's garbage collector. With CPython's defaults a full collection scans every
# module, model and compiled statement built at start-up, and the event loop stands still while
# it does. What was built at start-up is frozen out of every collection, and the young
# generation is collected every 20,000 allocations instead of 700: a request allocates
# thousands, the objects of a finished request are freed by reference counting, and the
# collector only has cycles to find.
gc.collect()
gc.freeze()
gc.set_threshold(20_000, 10, 10)
