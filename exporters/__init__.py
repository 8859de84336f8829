"""Span exporters shipped with rltrace (imported as ``rltrace.exporters``).

Each is a plain OpenTelemetry ``SpanExporter``: read one, write your own.
"""

from rltrace.exporters.chrome import ChromeEncoder, ChromeTraceExporter, chrome_args

__all__ = ["ChromeEncoder", "ChromeTraceExporter", "chrome_args"]
