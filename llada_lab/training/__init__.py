"""Training the embedded model (corpus, tokenizer, the block-diffusion objective, the loop, the
next-edit fine-tune) and scoring it on held-out files (infill, rewrite, typing, next edits, a candidate
beside the shipped model); their commands are in commands/. It builds on the product's completion,
engine and model layers and imports nothing of its server (llada_lsp/server/).
"""
