"""A custom decode loop as an object: greedy with a repetition guard, over host primitives only.

python examples/custom_loop.py ["prompt" [model]]    # MyLoop passed to a Generator as a class (default model: pycode)
decoctl generate "def fibonacci(n):" --controller examples/custom_loop.py:MyLoop -o penalty=2.0
"""

import sys

import decoctl


class MyLoop:
    """Greedy, but tokens among its last 16 outputs lose ``penalty`` logits."""

    options = (decoctl.Option(name="penalty", type="float", default=0.0, minimum=0.0),)

    def __init__(self, options):
        self.penalty = options["penalty"]

    def start(self, host):
        self.recent = []

    def step(self, host):
        row = host.process(host.target.logits()[-1:])[0].copy()
        row[self.recent[-16:]] -= self.penalty
        token = int(row.argmax())
        host.commit([token])
        self.recent.append(token)
        if not host.done:
            host.target.forward([token])


if __name__ == "__main__":
    prompt = sys.argv[1] if len(sys.argv) > 1 else "def fibonacci(n):"
    model = sys.argv[2] if len(sys.argv) > 2 else "pycode"
    generator = decoctl.Generator({"target": model}, MyLoop, options={"penalty": 2.0})
    print(generator.generate(prompt, max_new_tokens=48).text)
