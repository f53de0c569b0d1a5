"""decoctl-eagle: EAGLE decoding (a draft head fed the target's features; chain or EAGLE-2 dynamic trees), lossless."""

from decoctl_eagle.controller import Eagle

__all__ = ["Eagle"]
