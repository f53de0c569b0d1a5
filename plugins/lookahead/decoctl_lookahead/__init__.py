"""decoctl-lookahead: lookahead decoding (Fu et al., ICML 2024) over decoctl's tree-verification primitives."""

from decoctl_lookahead.controller import Lookahead
from decoctl_lookahead.pool import NGramPool

__all__ = ["Lookahead", "NGramPool"]
