"""decoctl-models: the demo models bundled with decoctl (see MODEL_CARD.md in this folder)."""
