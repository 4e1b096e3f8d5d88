"""Guided decoding: the vocabulary outlines-core indexes, the format compiler, per-request decoders."""
