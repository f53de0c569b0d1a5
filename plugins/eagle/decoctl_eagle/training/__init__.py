"""``decoctl eagle train``'s machinery (needs the plugin's ``train`` extra: torch, tqdm, onnx).

data: the text and distilled continuations as windows of token ids; features: the ONNX target's features and
labels in memory-mapped shards; model: the head in torch; loop: batches, losses, evaluation, checkpoints; export:
the ONNX head checked against torch; run: one run from settings to a registered head. The command line is
decoctl_eagle.train.
"""
