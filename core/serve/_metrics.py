"""The server's Prometheus metrics, in a registry of its own (never prometheus_client's process-wide one)."""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from decoctl.generation._prefix_cache import PrefixCache
from decoctl.serve._engine import Engine
from decoctl.serve._transcriber import Transcriber

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]


class Metrics:
    """Requests by endpoint and status, the queue and the rows, tokens by controller, time to first token, request
    seconds and tokens per target forward by controller, and the prefix cache's hits, tokens saved and bytes."""

    def __init__(self, engine: Engine | Transcriber) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "decoctl_requests", "HTTP requests by endpoint and status", ("endpoint", "status"), registry=self.registry
        )
        queue = Gauge("decoctl_queue_requests", "requests waiting for rows", registry=self.registry)
        queue.set_function(lambda: engine.queued)
        rows = Gauge("decoctl_rows_live", "rows running a completion", registry=self.registry)
        rows.set_function(lambda: engine.live_rows)
        capacity = Gauge("decoctl_rows_max", "rows of the KV buffer (--max-rows)", registry=self.registry)
        capacity.set(engine.max_rows)
        steps = Gauge("decoctl_engine_steps", "engine steps since start", registry=self.registry)
        steps.set_function(lambda: engine.steps)
        ended = Gauge("decoctl_completions_ended", "completions ended since start", registry=self.registry)
        ended.set_function(lambda: engine.completions)
        cancelled = Gauge(
            "decoctl_completions_cancelled", "completions ended because their client left", registry=self.registry
        )
        cancelled.set_function(lambda: engine.cancelled)
        joined = Gauge(
            "decoctl_rows_joined",
            "times the cost rule moved a speculating row into the batched step (their tokens unchanged)",
            registry=self.registry,
        )
        joined.set_function(lambda: engine.joined)
        resumed = Gauge(
            "decoctl_rows_resumed",
            "joined speculating rows the cost rule gave back to their drafting controller (their tokens unchanged)",
            registry=self.registry,
        )
        resumed.set_function(lambda: engine.resumed)
        preempted = Gauge(
            "decoctl_rows_preempted",
            "decoding rows given up to a request of a higher priority (resumed later from their history)",
            registry=self.registry,
        )
        preempted.set_function(lambda: engine.preempted)
        cache = engine.prefix_cache
        for name, text, read in (
            ("decoctl_prefix_cache_hits", "admissions that copied a cached prefix (--prefix-cache-mb)", "hits"),
            ("decoctl_prefix_cache_lookups", "admissions that looked the prefix cache up", "lookups"),
            (
                "decoctl_prefix_cache_tokens_saved",
                "prompt tokens copied from the prefix cache, not computed",
                "tokens_saved",
            ),
            ("decoctl_prefix_cache_bytes", "bytes of KV the prefix cache holds", "bytes"),
            ("decoctl_prefix_cache_budget_bytes", "the prefix cache's budget in bytes (0: off)", "budget"),
            ("decoctl_prefix_cache_evicted_blocks", "blocks the prefix cache dropped for room", "evicted"),
            ("decoctl_prefix_cache_image_hits", "requests whose images' features the cache kept", "image_hits"),
            (
                "decoctl_prefix_cache_source_hits",
                "generations whose encoder output the cache kept (an encoder-decoder model's audio or source)",
                "source_hits",
            ),
        ):
            gauge = Gauge(name, text, registry=self.registry)
            gauge.set_function(functools.partial(_cache_stat, cache, read))
        self.prompt_tokens = Counter(
            "decoctl_prompt_tokens", "prompt tokens of admitted requests", ("controller",), registry=self.registry
        )
        self.generated_tokens = Counter(
            "decoctl_generated_tokens", "tokens generated, by controller", ("controller",), registry=self.registry
        )
        self.drafted_tokens = Counter(
            "decoctl_drafted_tokens",
            "generated tokens that were drafted and accepted, by controller",
            ("controller",),
            registry=self.registry,
        )
        self.first_token = Histogram(
            "decoctl_time_to_first_token_seconds",
            "from the request's arrival to its first token",
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
        )
        self.request_seconds = Histogram(
            "decoctl_request_seconds",
            "from the request's arrival to its last token",
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
        )
        self.tokens_per_forward = Histogram(
            "decoctl_tokens_per_target_forward",
            "each completion's tokens over its target forwards, by controller",
            ("controller",),
            registry=self.registry,
            buckets=(1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0),
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)


def _cache_stat(cache: PrefixCache | None, name: str) -> float:
    """One of the prefix cache's counters (0 with the cache off)."""
    return 0 if cache is None else float(getattr(cache.stats(), name))
