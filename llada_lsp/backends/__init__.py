"""Where generation runs: `native` (this process's engine, on the model thread) and `sglang` (SGLang
servers over HTTP), both serving the completion pipeline's neutral generation requests.

Imports nothing here: the native backend pays for torch, the SGLang one for httpx, each when used.
"""
