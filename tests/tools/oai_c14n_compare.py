"""Compares a collected set's files with the repository's records, as canonical XML.

Usage: oai_c14n_compare.py BASE_URL MAP.json

MAP.json: {"identifier": "path of its file", ...} for every file the set holds. Harvests every
record of BASE_URL (ListRecords, oai_dc, following resumption tokens) with lxml, and compares
each live record's metadata element with its file, both in exclusive C14N (so namespace
declarations count by what they mean, not where they were written). Prints one JSON object:
{"records": live records, "deleted": deleted headers, "equal": n, "differ": [identifiers],
"missing": [live records without a file], "extra": [files of no live record]}.
"""

import json
import sys
import urllib.parse
import urllib.request

from lxml import etree

OAI = "{http://www.openarchives.org/OAI/2.0/}"
base, mapping = sys.argv[1], json.load(open(sys.argv[2]))
c14n = lambda el: etree.tostring(el, method="c14n", exclusive=True)
query = {"verb": "ListRecords", "metadataPrefix": "oai_dc"}
live, deleted = {}, 0
while True:
    with urllib.request.urlopen(base + "?" + urllib.parse.urlencode(query)) as r:
        doc = etree.fromstring(r.read())
    for rec in doc.iter(OAI + "record"):
        header = rec.find(OAI + "header")
        ident = header.findtext(OAI + "identifier")
        if header.get("status") == "deleted":
            deleted += 1
            live.pop(ident, None)
            continue
        meta = rec.find(OAI + "metadata")
        live[ident] = c14n(meta[0])
    token = doc.findtext(".//" + OAI + "resumptionToken")
    if not token:
        break
    query = {"verb": "ListRecords", "resumptionToken": token}

out = {"records": len(live), "deleted": deleted, "equal": 0, "differ": [], "missing": [], "extra": []}
for ident, canon in live.items():
    path = mapping.get(ident)
    if path is None:
        out["missing"].append(ident)
        continue
    if c14n(etree.parse(path).getroot()) == canon:
        out["equal"] += 1
    else:
        out["differ"].append(ident)
out["extra"] = sorted(set(mapping) - set(live))
print(json.dumps(out))
