"""What runs beside the event loop: the model thread (worker.py), which the in-process LSP front and
the engine service both use, and the event loop itself (loop.py).

Knows jobs and plans, not sockets or the LSP.
"""
