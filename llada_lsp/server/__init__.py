"""The LSP front (pygls): the protocol's fixes (protocol.py), the server's state (main.py) and its
handlers (handlers.py), the transports (transport.py, tcp.py), documents, positions, settings, and the
completer that sends jobs to the model (in this process, or in the engine service).

Nothing here imports torch, transformers, tokenizers or httpx.
"""
