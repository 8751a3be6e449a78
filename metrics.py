"""The server's Prometheus metrics: every series is defined here, in one registry per
server (tests run many servers in one process, so never the global default registry).

Counters and histograms are updated where their events happen: the HTTP exchange
(requests and their duration), a generation slot (time to first token, between tokens,
whole responses, tokens), the job supervisor (jobs by status) and the model thread
(engine steps; prometheus-client's metrics are thread-safe). The actors' state that is
not an event (slots, the waiting line, the store's tables) is read when `/metrics` is
scraped and set just before the text is made.

Imports nothing of the package, so every layer may use it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics", "PromptDiskStats", "TokenTimer"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text format, which every Prometheus version reads."""

# A `_created` twin of every counter and histogram doubles the series for a start time
# nothing here needs (prometheus-client's switch is process-wide).
disable_created_metrics()  # type: ignore[no-untyped-call]

ROUTE_UNMATCHED = "unmatched"
"""The route label of a request no route matched (the raw path would be unbounded)."""
METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS", "WS"})
TABLES = ("responses", "conversations", "ephemeral", "active")
JOB_STATES = ("queued", "in_progress")
JOB_ENDINGS = ("completed", "incomplete", "failed", "cancelled")

_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_LONG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


GENERATION_SERIES = (
    "prompt_tokens",
    "output_tokens",
    "cache_hit_tokens",
    "ttft",
    "itl",
    "response_seconds",
    "step_seconds",
)
"""The series a model's engines update, labelled by model."""


class Metrics:
    """The server's series and the one registry they are exposed from."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._disk: _PromptDiskCollector | None = None
        self._http_series(self.registry)
        self._state_series(self.registry)
        self._generation_series(self.registry)
        self._model_series(self.registry)
        for status in JOB_STATES:
            self.jobs.labels(status)
        for status in JOB_ENDINGS:
            self.jobs_ended.labels(status)

    def _http_series(self, r: CollectorRegistry) -> None:
        """The HTTP exchange's series, updated as each request is answered."""
        self.requests = Counter(
            "mlxcel_http_requests",
            "HTTP requests answered, by route (the URL rule), method and status.",
            ("route", "method", "status"),
            registry=r,
        )
        self.request_seconds = Histogram(
            "mlxcel_http_request_duration_seconds",
            "HTTP exchanges from the request to the last byte of the answer (a stream's "
            "whole body), by route.",
            ("route",),
            buckets=_LONG_BUCKETS,
            registry=r,
        )

    def _state_series(self, r: CollectorRegistry) -> None:
        """The actors' state (slots, the waiting line, jobs, the store), set at each scrape."""
        self.slots = Gauge("mlxcel_slots", "Generation slots.", registry=r)
        self.slots_busy = Gauge("mlxcel_slots_busy", "Slots running a response.", registry=r)
        self.queue_depth = Gauge(
            "mlxcel_queue_depth", "Responses waiting for a slot (requests and jobs).", registry=r
        )
        self.jobs = Gauge(
            "mlxcel_background_jobs", "Active background jobs, by status.", ("status",), registry=r
        )
        self.jobs_ended = Counter(
            "mlxcel_background_jobs_ended",
            "Background jobs ended, by final status.",
            ("status",),
            registry=r,
        )
        self.resumes = Counter(
            "mlxcel_response_resumes",
            "Streams of background responses read from their event logs "
            "(GET /v1/responses/{id}?stream=true) that were answered with events.",
            registry=r,
        )
        self.webhook_attempts = Counter(
            "mlxcel_webhook_attempts",
            "Webhook POSTs attempted (each retry counts).",
            registry=r,
        )
        self.webhook_deliveries = Counter(
            "mlxcel_webhook_deliveries",
            "Webhook deliveries ended: succeeded (a 2xx answer) or failed (given up after "
            "--webhook-max-attempts, or no target is configured for it any more).",
            ("result",),
            registry=r,
        )
        for result in ("succeeded", "failed"):
            self.webhook_deliveries.labels(result)
        self.webhook_refused = Counter(
            "mlxcel_webhook_refused",
            "Background jobs left unannounced because their webhook delivery could not be "
            "kept: key_full (the key keeps --webhook-max-pending-per-key), store_full (the "
            "store keeps 10,000) or store_unavailable.",
            ("reason",),
            registry=r,
        )
        for reason in ("key_full", "store_full", "store_unavailable"):
            self.webhook_refused.labels(reason)
        self.store_entries = Gauge(
            "mlxcel_store_entries", "Entries kept in each store table.", ("table",), registry=r
        )
        self.store_up = Gauge(
            "mlxcel_store_up",
            "1 when the store answered this scrape, 0 when it could not be reached (its "
            "entry and byte gauges then keep their last readings).",
            registry=r,
        )
        self.store_bytes = Gauge(
            "mlxcel_store_bytes",
            "Approximate JSON bytes of each store table.",
            ("table",),
            registry=r,
        )

    def _generation_series(self, r: CollectorRegistry) -> None:
        """The slots' and the model thread's series: tokens, their timing, engine steps,
        each labelled by model (`for_model`)."""
        self.prompt_tokens = Counter(
            "mlxcel_prompt_tokens", "Prompt tokens of ended generations.", ("model",), registry=r
        )
        self.output_tokens = Counter(
            "mlxcel_output_tokens", "Tokens generated by ended generations.", ("model",), registry=r
        )
        self.cache_hit_tokens = Counter(
            "mlxcel_prompt_cache_hit_tokens",
            "Prompt tokens whose KV state came from the prompt cache instead of prefill.",
            labelnames=("model",),
            registry=r,
        )
        self.ttft = Histogram(
            "mlxcel_time_to_first_token_seconds",
            "From a response's submission to the scheduler (waiting for a slot included) to "
            "its first token.",
            buckets=_TTFT_BUCKETS,
            labelnames=("model",),
            registry=r,
        )
        self.itl = Histogram(
            "mlxcel_inter_token_latency_seconds",
            "Between consecutive tokens of a response, as its slot receives them.",
            buckets=_ITL_BUCKETS,
            labelnames=("model",),
            registry=r,
        )
        self.response_seconds = Histogram(
            "mlxcel_response_duration_seconds",
            "From a response's submission to the scheduler to its end (stored).",
            buckets=_LONG_BUCKETS,
            labelnames=("model",),
            registry=r,
        )
        self.step_seconds = Histogram(
            "mlxcel_engine_step_seconds",
            "One engine step on the model thread (a batched decode phase and a prefill phase).",
            buckets=_STEP_BUCKETS,
            labelnames=("model",),
            registry=r,
        )

    def _model_series(self, r: CollectorRegistry) -> None:
        """Loads and unloads of the configured models."""
        self.model_loads = Counter(
            "mlxcel_model_loads",
            "Model loads by model and outcome (loaded, failed).",
            ("model", "outcome"),
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "mlxcel_model_load_seconds",
            "From a load's start (making room included) to the model serving, or failing.",
            ("model",),
            buckets=_LONG_BUCKETS,
            registry=r,
        )
        self.model_unloads = Counter(
            "mlxcel_model_unloads", "Model unloads by model.", ("model",), registry=r
        )
        self.model_unload_seconds = Histogram(
            "mlxcel_model_unload_seconds",
            "From an unload's start (its work draining included) to its memory returned.",
            ("model",),
            buckets=_LONG_BUCKETS,
            registry=r,
        )

    def model_loaded(self, model: str, outcome: str, secs: float) -> None:
        self.model_loads.labels(model, outcome).inc()
        self.model_load_seconds.labels(model).observe(secs)

    def model_unloaded(self, model: str, secs: float) -> None:
        self.model_unloads.labels(model).inc()
        self.model_unload_seconds.labels(model).observe(secs)

    def for_model(self, model: str) -> Metrics:
        """These metrics as one model's engines update them: the generation series are
        `model`'s children, the rest is shared."""
        view = copy.copy(self)
        for name in GENERATION_SERIES:
            setattr(view, name, getattr(self, name).labels(model))
        return view

    def observe_request(
        self, route: str | None, method: str, status: int | None, secs: float
    ) -> None:
        """One HTTP exchange; the labels stay bounded whatever a client sends."""
        route = route or ROUTE_UNMATCHED
        method = method if method in METHODS else "other"
        self.requests.labels(route, method, "none" if status is None else str(status)).inc()
        self.request_seconds.labels(route).observe(secs)

    def count_tokens(self, prompt: int, output: int, cached: int) -> None:
        self.prompt_tokens.inc(prompt)
        self.output_tokens.inc(output)
        self.cache_hit_tokens.inc(cached)

    def set_scheduler(self, slots: int, busy: int, queued: int) -> None:
        self.slots.set(slots)
        self.slots_busy.set(busy)
        self.queue_depth.set(queued)

    def set_table(self, table: str, entries: int, size: int) -> None:
        self.store_entries.labels(table).set(entries)
        self.store_bytes.labels(table).set(size)

    def job_moved(self, before: str | None, after: str) -> None:
        """A job changed status (`before` None: just admitted); an end status ends it."""
        if before is not None:
            self.jobs.labels(before).dec()
        if after in JOB_ENDINGS:
            self.jobs_ended.labels(after).inc()
        else:
            self.jobs.labels(after).inc()

    def watch_prompt_disk(self, model: str, source: Callable[[], PromptDiskStats]) -> None:
        """Expose a model's prompt-cache disk tier, read from `source` at each scrape."""
        if self._disk is None:
            self._disk = _PromptDiskCollector()
            self.registry.register(self._disk)
        self._disk.sources[model] = source

    def exposition(self) -> bytes:
        """The Prometheus text of every series."""
        return generate_latest(self.registry)


@dataclass(frozen=True, slots=True)
class PromptDiskStats:
    """The prompt cache's disk tier as counted since the server started (counters) and
    as it stands (`stored_bytes`, `files`)."""

    hits: int = 0
    """Lookups served from a file."""
    misses: int = 0
    """Lookups the disk had nothing (better than memory) for."""
    spills: int = 0
    """KV states written to files."""
    dropped: int = 0
    """Spills not written: the writer's queue was full, the state over the budget, or
    the disk refused."""
    rejected: int = 0
    """Files found damaged or foreign, and removed."""
    read_bytes: int = 0
    written_bytes: int = 0
    stored_bytes: int = 0
    files: int = 0


_DISK_HELP = {
    "hits": "Prompt-cache lookups served from a file of the disk tier.",
    "misses": "Prompt-cache lookups the disk tier had nothing better than memory for.",
    "spills": "KV states of cached prefixes written to the disk tier.",
    "dropped": "KV states not written to the disk tier (queue full, over budget, disk error).",
    "rejected": "Disk-tier files found damaged or foreign, and removed.",
    "read_bytes": "Bytes of KV state read from the disk tier.",
    "written_bytes": "Bytes of KV state written to the disk tier.",
}


class _PromptDiskCollector(Collector):
    """Reads each model's disk tier at scrape time (its counters live on the tier)."""

    def __init__(self) -> None:
        self.sources: dict[str, Callable[[], PromptDiskStats]] = {}

    def collect(self) -> Iterator[Metric]:
        readings = {name: source() for name, source in list(self.sources.items())}
        for field in fields(PromptDiskStats):
            name = f"mlxcel_prompt_cache_disk_{field.name}"
            if field.name in _DISK_HELP:
                family: CounterMetricFamily | GaugeMetricFamily = CounterMetricFamily(
                    name, _DISK_HELP[field.name], labels=["model"]
                )
            else:
                family = GaugeMetricFamily(
                    name, f"The disk tier's {field.name.replace('_', ' ')} now.", labels=["model"]
                )
            for model, stats in readings.items():
                family.add_metric([model], getattr(stats, field.name))
            yield family


class TokenTimer:
    """Times one response's tokens as its slot receives them: the first against the
    submission (time to first token), each later one against the one before."""

    __slots__ = ("_last", "_metrics", "_started")

    def __init__(self, metrics: Metrics, submitted: float) -> None:
        self._metrics = metrics
        self._last = submitted
        self._started = False

    def tick(self, now: float) -> None:
        if self._started:
            self._metrics.itl.observe(now - self._last)
        else:
            self._metrics.ttft.observe(now - self._last)
            self._started = True
        self._last = now
