"""decoctl-speculative: speculative decoding with a draft model or prompt lookup, lossless by construction."""

from decoctl_speculative.controller import Speculative
from decoctl_speculative.draft_length import CostAwareLength, DraftLength, ScheduledLength

__all__ = ["CostAwareLength", "DraftLength", "ScheduledLength", "Speculative"]
