"""A complete custom controller: greedy with a repetition guard, in a few lines over host primitives.

decoctl generate "def fibonacci(n):" --controller examples/custom_loop.py:MyLoop -o penalty=2.0
"""

import numpy as np

from decoctl import Option


class MyLoop:
    """Greedy, but tokens already in the last 16 outputs lose ``penalty`` logits."""

    roles = ("target",)
    options = (Option(name="penalty", type="float", default=0.0, minimum=0.0),)

    def __init__(self, options):
        self.penalty = options["penalty"]

    def start(self, host):
        self.recent = []

    def step(self, host):
        row = host.process(host.target.logits()[-1:])[0]
        if self.penalty and self.recent:
            row = row.copy()
            row[self.recent[-16:]] -= self.penalty
        token = int(np.argmax(row))
        host.commit([token])
        self.recent.append(token)
        if not host.done:
            host.target.forward([token])
