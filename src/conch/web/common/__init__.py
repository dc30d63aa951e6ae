"""Parts both servers share: error envelopes, SSE, Prometheus metrics, the security guard."""
