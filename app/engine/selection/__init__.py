"""Choosing tokens from logits on their device, for every row kind, with one copy to the host."""
