"""Text <-> ids for the loaded model: the tokenizer codec, prompt layouts (FIM, chat template), prompt
cutting and token healing, post-processing, the rewrite guard, and the infill and rewrite pipelines
that run on the model thread.

Knows strings, token ids and the engine's drafts; nothing of the LSP, documents or positions. The
server, the engine service, training and evaluation import it; it imports none of them.
"""
