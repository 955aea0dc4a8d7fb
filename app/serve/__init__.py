"""The webhook process: HTTPS and its limits, TLS, callers, answers, logs, metrics."""
