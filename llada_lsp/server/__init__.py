"""The language server (pygls): settings, positions, prompts, post-processing, the model thread, handlers.

Only `main` and `headless` know pygls; the rest are plain functions and classes over text and ids.
"""
