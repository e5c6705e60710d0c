"""Test rigs of our own that do not ship in the wheel: a one-node Ceph RGW (`ceph_rgw`) for the real-S3 lane."""
