"""What Kiln tells its operators: Prometheus metrics and readiness.

`metrics` holds one registry per Kiln app and the instruments the request path records
into; `collectors` read, at scrape time, what other parts already count; `buffer` is the
bounded scrape-time read of the log queue; `readiness` answers "do Redis and Kafka answer?".
The HTTP endpoints that serve them live in proxy.http_endpoints.
"""
