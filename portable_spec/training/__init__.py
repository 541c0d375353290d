"""Drafter training for any HF causal LM: prompts, self-distilled replies, cached features, the training
loop and the recipe that runs them. Imports the core (and kernels through it) only."""
