"""Speculative decoding: proposers (draft model, n-gram), the k schedule, and verification."""
