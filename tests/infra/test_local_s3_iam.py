"""`LocalS3Server(enforce_iam=True)`: the switch moto keeps process-wide is set while it runs and handed back after."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.s3

# In a child process: the switch is process-global, and this test process shares one moto with every other test.
_SCRIPT = textwrap.dedent(
    """
    import boto3
    from botocore.exceptions import ClientError
    from moto import settings
    from haystack_integrations.offload.testing.local_s3 import ADMIN_USER, LocalS3Server

    def refused(server):
        anonymous = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        ).client("s3", endpoint_url=server.endpoint_url)
        try:
            anonymous.list_objects_v2(Bucket=server.bucket)
        except ClientError as error:
            return error.response["Error"]["Code"]
        return "allowed"

    with LocalS3Server(enforce_iam=True) as server:
        admin_key = server.storage_options()["key"]
        assert server.environment()["AWS_ACCESS_KEY_ID"] == admin_key != "testing"
        server.client().put_object(Bucket=server.bucket, Key="k", Body=b"1")
        print("enforced:", refused(server))
        server.reset()
        assert server.storage_options()["key"] != admin_key  # the reset made a new admin
        assert server.client().list_objects_v2(Bucket=server.bucket)["KeyCount"] == 0
        print("after reset:", refused(server))
        users = [user["UserName"] for user in server.client("iam").list_users()["Users"]]
        print("users:", users == [ADMIN_USER])
    print("restored:", settings.INITIAL_NO_AUTH_ACTION_COUNT)
    with LocalS3Server() as plain:
        print("plain:", refused(plain))
    """
)


@pytest.mark.slow
def test_enforcement_holds_across_reset_and_is_handed_back_on_stop() -> None:
    result = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "enforced: InvalidAccessKeyId",
        "after reset: InvalidAccessKeyId",
        "users: True",
        "restored: inf",
        "plain: allowed",
    ]
