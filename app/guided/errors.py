"""The one error every unusable output format raises (answered with a 400)."""


class GuidedFormatError(ValueError):
    """A format the server cannot honour; the message names the problem (answered with a 400)."""
