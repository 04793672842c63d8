"""The engine service: one process that owns the model (engine.py) and the client that LSP fronts use
to reach it over a socket (client.py), both speaking llada_lsp.wire.

Imports nothing here: a front that only needs the client must not pay for the model's imports.
"""
