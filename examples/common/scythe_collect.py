"""bench_collect's peer: PyPI oaipmh-scythe (the maintained Sickle) harvesting ListRecords and
writing each record's metadata element to a file, as the collector does (a folder per first
byte of the identifier's SHA-256, the identifier percent-encoded as the name).

Usage: scythe_collect.py BASE_URL OUT_DIR
Prints one JSON line: {"records", "secs", "cpu_secs", "max_rss_kb"}.
"""

import hashlib
import json
import os
import resource
import sys
import time
import urllib.parse

from lxml import etree
from oaipmh_scythe import Scythe

OAI = "{http://www.openarchives.org/OAI/2.0/}"
base, out = sys.argv[1], sys.argv[2]
t0 = time.time()
n = 0
made = set()
with Scythe(base, timeout=120) as scythe:
    for record in scythe.list_records(metadata_prefix="oai_dc", ignore_deleted=True):
        ident = record.header.identifier
        meta = record.xml.find(OAI + "metadata")
        folder = os.path.join(out, hashlib.sha256(ident.encode()).hexdigest()[:2])
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        name = urllib.parse.quote(ident, safe="") + ".xml"
        with open(os.path.join(folder, name), "wb") as fh:
            fh.write(etree.tostring(meta[0]))
        n += 1
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"records": n, "secs": time.time() - t0, "cpu_secs": ru.ru_utime + ru.ru_stime, "max_rss_kb": ru.ru_maxrss}))
