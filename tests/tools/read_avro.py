"""Reads every part-*.avro of an Ingestion 3 activity folder with fastavro (the reference
reader the issue names) and prints one JSON object: the writer schema, the codec of each
file, and every record."""
import glob
import json
import os
import sys

import fastavro

folder = sys.argv[1]
out = {"schemas": [], "codecs": [], "records": []}
for path in sorted(glob.glob(os.path.join(folder, "part-*.avro"))):
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        out["schemas"].append(reader.writer_schema)
        out["codecs"].append(reader.codec)
        out["records"].extend(reader)
json.dump(out, sys.stdout)
