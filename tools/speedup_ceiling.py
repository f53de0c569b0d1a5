"""The most a draft-and-verify strategy can gain on a model, from a bench report's measured verify costs.

    .venv/bin/python tools/speedup_ceiling.py build/bench/s5-draft-split.json --contender dm4 --k 4 \
        --draft-cost 0.092 --target 1.5
    .venv/bin/python tools/speedup_ceiling.py build/bench/s5-code.json --contender ec --k 2 \
        --draft-cost 0.22 --target 1.6

Model (the draft-length rule's, core/draft_length.py, without its catch-up term): a step drafts k tokens,
each accepted with probability a given the ones before it, so it yields E(k) = (1 - a^(k+1)) / (1 - a) tokens and
costs c(k + 1) + k * d one-token target forwards, where c(n) is the measured cost of a forward over n tokens
(the report's ``verify_cost``) and d the cost of one draft forward in the same unit. The speedup of the best k is
max_k E(k) / (c(k + 1) + k * d): an upper bound, since it ignores everything but forwards.

a comes from ``--acceptance``, or from a contender that drafted a fixed ``--k`` (its tokens per target forward
is E(k); a is solved from it). The output gives the bound with free drafting (d = 0), with the given d, and the
acceptance a that the bound needs to reach ``--target`` at that d.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def expected(a: float, k: int) -> float:
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def solve_acceptance(tokens_per_forward: float, k: int) -> float:
    """The a with E(k) = tokens_per_forward (bisection: E grows with a)."""
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if expected(middle, k) < tokens_per_forward else (low, middle)
    return (low + high) / 2


def best(a: float, costs: dict[int, float], d: float) -> tuple[float, int]:
    """(speedup, k) of the best draft length among the sizes whose cost was measured."""
    return max((expected(a, k) / (costs[k + 1] + k * d), k) for k in range(1, max(costs)) if k + 1 in costs)


def needed(costs: dict[int, float], d: float, target: float) -> float:
    """The smallest a whose best speedup reaches target (1.0 when none does)."""
    low, high = 0.0, 1.0
    if best(high, costs, d)[0] < target:
        return 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if best(middle, costs, d)[0] < target else (low, middle)
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="a decoctl bench --json report (its verify_cost is used)")
    parser.add_argument("--acceptance", type=float, help="per-token acceptance a")
    parser.add_argument("--contender", help="solve a from this contender's tokens per target forward (with --k)")
    parser.add_argument("--k", type=int, help="the fixed draft length that contender used")
    parser.add_argument("--draft-cost", type=float, default=0.0, help="d: one draft forward in one-token forwards")
    parser.add_argument("--target", type=float, default=1.5, help="the speedup whose needed acceptance is printed")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    costs = {int(n): float(c) for n, c in report["verify_cost"].items()}
    if args.acceptance is not None:
        a = args.acceptance
    elif args.contender and args.k:
        row = next(c for c in report["contenders"] if c["name"] == args.contender)
        a = solve_acceptance(row["tokens_per_target_forward"], args.k)
        print(f"{args.contender}: {row['tokens_per_target_forward']:.3f} tokens a forward at k={args.k} -> a = {a:.3f}")
    else:
        parser.error("give --acceptance, or --contender with --k")
    print("verify cost c(n):", ", ".join(f"{n}: {c:.2f}" for n, c in sorted(costs.items())))
    free, free_k = best(a, costs, 0.0)
    paid, paid_k = best(a, costs, args.draft_cost)
    print(f"a = {a:.3f}: bound {free:.3f}x with free drafting (k={free_k}),", end=" ")
    print(f"{paid:.3f}x at d = {args.draft_cost} (k={paid_k})")
    print(f"{args.target}x needs a >= {needed(costs, args.draft_cost, args.target):.3f} at d = {args.draft_cost}")


if __name__ == "__main__":
    main()
