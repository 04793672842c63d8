"""The LSP front (pygls): the protocol's fixes (protocol.py), the server's state (language_server.py),
its open documents (open_documents.py) and its handlers (handlers.py, inline.py, next_edit_requests.py,
actions.py), the transports (transport.py, tcp.py), positions, settings, and the completer that sends
jobs to the model (in this process, or in the engine service).

Nothing here imports torch, transformers, tokenizers or httpx, nor a backend: the command that starts
the server hands it the loader of the model in its process (`language_server.Launch.loader`).
"""
