"""The engine service: the sessions of many LSP fronts over one backend (sessions.py), where it
listens (listener.py), and the client that fronts use to reach it (client.py), all speaking
llada_lsp.wire. The process and its command line are commands/engine.py.

Imports nothing here: a front that only needs the client must not pay for the model's imports.
"""
