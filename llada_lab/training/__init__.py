"""Training the embedded model (corpus, tokenizer, the block-diffusion objective, the loop) and scoring
it on held-out files (infill, rewrite, a candidate beside the shipped model); their commands are in
commands/."""
