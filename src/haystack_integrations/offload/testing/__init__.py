"""
Local stand-ins of real infrastructure for tests and benchmarks (not imported by the library).

- `local_s3.LocalS3Server`: moto's S3 server over real HTTP on loopback, every request recorded;
- `latency_proxy.LatencyProxy`: S3-like response times in front of moto's server;
- `faults.FaultProxy`: S3-like failures (500, 503 SlowDown, resets, withheld answers, slow answers) on top of that.
"""
