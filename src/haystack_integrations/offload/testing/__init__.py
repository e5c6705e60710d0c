"""
What your own tests import to run against S3 without an account (never imported by the library itself).

- `local_s3.LocalS3Server`: moto's S3 server over real HTTP on loopback, every request recorded;
- `endpoint.S3Endpoint`: what a test needs of any S3 endpoint (store options, environment, a boto3 client);
- `faults.FaultProxy`: S3-like failures (500, 503 SlowDown, 409, resets, withheld and slow answers) and latency
  between a client and the server, each request decided on its own and every injected fault counted; it is built on
  the HTTP/1.1 relay `relay.LatencyProxy`.
The suite's one-node Ceph RGW is a rig of the repository's tests (``tests/support``), not shipped.
"""
