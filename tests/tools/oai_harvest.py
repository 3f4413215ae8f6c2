"""Harvests our /oai with an independent client, keeping what it learned in a state file, and
compares the result with the set's files.

Usage: oai_harvest.py pyoai|scythe BASE_URL STATE.json EXPECT.json [--from DATESTAMP]

STATE.json (created when missing): {identifier: sha256 of the record's metadata in exclusive
C14N, or "deleted"}. EXPECT.json: {identifier: path of the resource file} for every live
record. Prints one JSON object: {"seen", "equal", "differ", "missing", "extra", "deleted",
"sets": {identifier: [setSpec...] of each record this harvest listed}, "listed": [identifiers
this harvest listed, in order]}.
"""

import datetime
import hashlib
import json
import os
import sys

from lxml import etree

client_kind, base, state_path, expect_path = sys.argv[1:5]
since = sys.argv[sys.argv.index("--from") + 1] if "--from" in sys.argv else None
state = json.load(open(state_path)) if os.path.exists(state_path) else {}
expect = json.load(open(expect_path))
c14n = lambda el: hashlib.sha256(etree.tostring(el, method="c14n", exclusive=True)).hexdigest()
OAI = "{http://www.openarchives.org/OAI/2.0/}"
seen = 0
sets = {}
listed = []

if client_kind == "pyoai":
    from oaipmh import error
    from oaipmh.client import Client
    from oaipmh.metadata import MetadataRegistry, oai_dc_reader

    registry = MetadataRegistry()
    registry.registerReader("oai_dc", oai_dc_reader)
    client = Client(base, registry)
    kw = {"metadataPrefix": "oai_dc"}
    if since:
        kw["from_"] = datetime.datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ")
    try:
        for header, metadata, _ in client.listRecords(**kw):
            seen += 1
            sets[header.identifier()] = sorted(header.setSpec())
            listed.append(header.identifier())
            if header.isDeleted():
                state[header.identifier()] = "deleted"
            else:
                state[header.identifier()] = c14n(metadata.element()[0])
    except error.NoRecordsMatchError:
        pass
else:
    from oaipmh_scythe import Scythe
    from oaipmh_scythe.exceptions import NoRecordsMatch

    with Scythe(base) as scythe:
        try:
            for record in scythe.list_records(metadata_prefix="oai_dc", from_=since):
                seen += 1
                sets[record.header.identifier] = sorted(record.header.setSpecs)
                listed.append(record.header.identifier)
                if record.header.deleted:
                    state[record.header.identifier] = "deleted"
                else:
                    state[record.header.identifier] = c14n(record.xml.find(OAI + "metadata")[0])
        except NoRecordsMatch:
            pass

json.dump(state, open(state_path, "w"))
# scythe parses answers dropping whitespace-only text (remove_blank_text): the files are read
# the same way for it.
parser = etree.XMLParser(remove_blank_text=client_kind == "scythe")
out = {"seen": seen, "equal": 0, "differ": [], "missing": [], "extra": [], "deleted": 0, "sets": sets, "listed": listed}
for ident, path in expect.items():
    got = state.get(ident)
    if got is None or got == "deleted":
        out["missing"].append(ident)
    elif got == c14n(etree.parse(path, parser).getroot()):
        out["equal"] += 1
    else:
        out["differ"].append(ident)
for ident, got in state.items():
    if got == "deleted":
        out["deleted"] += 1
    elif ident not in expect:
        out["extra"].append(ident)
print(json.dumps(out))
