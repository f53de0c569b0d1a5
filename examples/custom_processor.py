"""A custom logits processor as an object: any callable that takes (rows, context) and returns the rows.

python examples/custom_processor.py ["prompt" [model]]    # default model: pycode
"""

import sys

import numpy as np

import decoctl


class Penalise:
    """Lower by ``amount`` every token already in the row's own prefix (prompt, output, drafted tokens)."""

    def __init__(self, amount):
        self.amount = np.float32(amount)

    def __call__(self, rows, context):  # rows: float32[n, vocab], one per position being decided
        for i in range(len(rows)):
            rows[i, np.unique(context.prefix(i))] -= self.amount
        return rows


if __name__ == "__main__":
    prompt = sys.argv[1] if len(sys.argv) > 1 else "def fibonacci(n):"
    model = sys.argv[2] if len(sys.argv) > 2 else "pycode"
    generator = decoctl.Generator({"target": model}, "greedy", processors=[Penalise(1.5)])
    print(generator.generate(prompt, max_new_tokens=48).text)
