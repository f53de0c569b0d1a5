"""decoctl-speculative: speculative decoding with a draft model or prompt lookup, lossless by construction."""

from decoctl_speculative.controller import Speculative

__all__ = ["Speculative"]
