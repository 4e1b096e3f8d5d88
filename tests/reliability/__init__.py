"""Reliability tests: bad input, overload, cancellation, faults, auth, several nodes."""
