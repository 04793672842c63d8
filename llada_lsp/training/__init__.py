"""Training the embedded model: corpus, tokenizer, the block-diffusion objective and the loop."""
