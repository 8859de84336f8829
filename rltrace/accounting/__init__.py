"""How rltrace counts: goodput buckets and the waste taxonomy, quantiles, counters."""
