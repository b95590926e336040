"""Prometheus metrics of one server (a registry of its own, so that apps never share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS_PER_CALL_BUCKETS = (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)

# errors by kind: what the client sent or met
ERROR_KINDS = ("input", "invalid", "too_large", "overloaded", "timeout", "unavailable", "internal", "not_found",
               "method_not_allowed")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram("aggdec_request_duration_seconds", "Time from a request's arrival to its answer.",
                                 ["status"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("aggdec_queue_depth", "Texts waiting for a slot in a batch.", registry=r)
        self.active = Gauge("aggdec_rows_active", "Texts accepted and not finished (waiting or decoding).",
                            registry=r)
        self.in_flight = Gauge("aggdec_requests_in_flight", "Generate requests being served.", registry=r)
        self.batch_rows = Histogram("aggdec_batch_rows", "Rows in each verifier call.", buckets=BATCH_BUCKETS,
                                    registry=r)
        self.tokens_per_call = Histogram("aggdec_tokens_per_verifier_call",
                                         "Tokens each finished text gained per verifier call (mean over its calls).",
                                         buckets=TOKENS_PER_CALL_BUCKETS, registry=r)
        self.tokens = Counter("aggdec_generated_tokens", "Tokens generated.", registry=r)
        self.row_calls = Counter("aggdec_verifier_row_calls", "Verifier calls, counted once per finished text "
                                 "they decoded (a beam-search text once per call, whatever its num_beams; "
                                 "aggdec_batch_rows counts rows).", registry=r)
        self.texts = Counter("aggdec_texts", "Texts decoded to an output (as each finishes: one whose client "
                             "has just left counts too).", registry=r)
        self.errors = Counter("aggdec_errors", "Errors by kind (per item where one text failed: `input`, and "
                              "`internal` for a text whose decode failed; per request otherwise).", ["kind"], registry=r)
        for kind in ERROR_KINDS:
            self.errors.labels(kind)  # every kind shows, at 0

    def observe_result(self, result) -> None:
        iterations = max(result.stats.iterations, 1)
        self.tokens_per_call.observe(len(result.ids) / iterations)
        self.tokens.inc(len(result.ids))
        self.row_calls.inc(result.stats.iterations)
        self.texts.inc()
