"""A local S3-compatible server for the tests: moto's ThreadedMotoServer on 127.0.0.1, an OS
port, with the buckets named on the command line created. Prints one JSON line with the
endpoint, then serves until its standard input closes."""
import contextlib
import io
import json
import sys

import boto3
from moto.server import ThreadedMotoServer

with contextlib.redirect_stdout(io.StringIO()):
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
host, port = server.get_host_and_port()
endpoint = f"http://{host}:{port}"
s3 = boto3.client(
    "s3",
    endpoint_url=endpoint,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)
for bucket in sys.argv[1:]:
    s3.create_bucket(Bucket=bucket)
print(json.dumps({"endpoint": endpoint}), flush=True)
sys.stdin.read()
server.stop()
