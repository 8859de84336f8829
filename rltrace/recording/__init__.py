"""The hot path: scope records, OpenTelemetry's context, generators, argument checks, values."""
