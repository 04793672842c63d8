"""The LSP front (pygls): handlers, documents, positions, settings, the headless client, and the
completer that sends text to the model (in this process, or in the engine service).

Only `main` and `headless` know pygls; nothing here imports torch, transformers or tokenizers.
"""
