"""The export loop: batching, processors, sampling, OTLP, the live state file."""
