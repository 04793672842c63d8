"""Command-line tools over the engine: `generate` (check a checkpoint) and `bench` (cache vs baseline)."""
