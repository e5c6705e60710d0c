"""
Local stand-ins of real infrastructure for tests and benchmarks (not imported by the library).

- `local_s3.LocalS3Server`: moto's S3 server over real HTTP on loopback, every request recorded;
- `ceph_rgw.CephRGWServer`: a real S3 server, a throwaway one-node Ceph RADOS Gateway on loopback;
- `endpoint.S3Endpoint`: what both give tests (store options, environment, a boto3 client);
- `latency_proxy.LatencyProxy`: S3-like response times in front of either;
- `faults.FaultProxy`: S3-like failures (500, 503 SlowDown, resets, withheld answers, slow answers) on top of that.
"""
