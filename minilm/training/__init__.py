"""Training: the Lightning adapter (lit_module), phases as data (phases), checkpoints (checkpoint)."""
