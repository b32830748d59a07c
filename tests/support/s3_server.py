"""A throwaway S3-compatible server for the storage tests: moto's server (`python -m
moto.server`), speaking S3's HTTP protocol on loopback, driven by the real boto3 through
django-storages. One bucket, created empty; stopped after the test."""

import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.support.ports import free_port

BUCKET = "agentloop-test-files"
KEY_ID, SECRET = "AKIDTESTAGENTLOOP", "test-secret-access-key-0123456789"


@dataclass
class S3:
    endpoint: str
    bucket: str = BUCKET

    def env(self) -> dict:
        """What a web server's or a worker's environment needs to store files there."""
        return {"AGENTLOOP_S3_BUCKET": self.bucket, "AGENTLOOP_S3_ENDPOINT_URL": self.endpoint,
                "AGENTLOOP_S3_REGION": "us-east-1", "AGENTLOOP_S3_ACCESS_KEY_ID": KEY_ID,
                "AGENTLOOP_S3_SECRET_ACCESS_KEY": SECRET}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)

    def keys(self) -> list[str]:
        listed = self.client().list_objects_v2(Bucket=self.bucket)
        return sorted(item["Key"] for item in listed.get("Contents", []))

    def storages(self) -> dict:
        """STORAGES for this process (settings.STORAGES = …), as agentloop.settings builds it."""
        return {"default": {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
                    "bucket_name": self.bucket, "endpoint_url": self.endpoint, "region_name": "us-east-1",
                    "access_key": KEY_ID, "secret_key": SECRET, "default_acl": None}},
                "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}


@pytest.fixture
def s3_server(tmp_path):
    port = free_port()
    log_path = tmp_path / "moto.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    server = S3(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                server.client().create_bucket(Bucket=BUCKET)
                break
            except Exception:  # not listening yet
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto's S3 server did not start:\n{log_path.read_text(errors='replace')}",
                                pytrace=False)
                time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
