"""
Local stand-ins of real infrastructure for tests and benchmarks (not imported by the library).

- `latency_proxy.LatencyProxy`: S3-like response times in front of moto's server;
- `faults.FaultProxy`: S3-like failures (500, 503 SlowDown, resets, withheld answers, slow answers) on top of that.
"""
