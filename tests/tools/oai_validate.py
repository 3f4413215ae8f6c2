"""Walks our /oai with plain HTTP and checks every answer against OAI-PMH.xsd (lxml), and the
error codes of the protocol's error cases.

Usage: oai_validate.py BASE_URL SCHEMA.xsd [--provenance PROVENANCE.xsd] [--sets]
Prints one JSON object: {"answers": n checked, "invalid": [[query, reason]...],
"errors": {case: code answered}, "records": records listed, "identifiers": headers listed,
"provenance": <about> containers checked, "set_records": {setSpec: records ListRecords lists in
it} (with --sets, every set of ListSets walked)}.

With --provenance, every element inside a record's <about> is checked against that schema too
(OAI-PMH.xsd skips what <about> holds).
"""

import json
import sys
import urllib.parse
import urllib.request

from lxml import etree

base, xsd = sys.argv[1], sys.argv[2]
schema = etree.XMLSchema(etree.parse(xsd))
prov = None
if "--provenance" in sys.argv:
    prov = etree.XMLSchema(etree.parse(sys.argv[sys.argv.index("--provenance") + 1]))
OAI = "{http://www.openarchives.org/OAI/2.0/}"
out = {"answers": 0, "invalid": [], "errors": {}, "records": 0, "identifiers": 0, "provenance": 0, "set_records": {}}


def get(query, post=False):
    data = urllib.parse.urlencode(query)
    if post:
        req = urllib.request.Request(base, data=data.encode(), headers={"content-type": "application/x-www-form-urlencoded"})
    else:
        req = urllib.request.Request(base + "?" + data)
    try:
        with urllib.request.urlopen(req) as r:
            doc = etree.fromstring(r.read())
    except etree.XMLSyntaxError as e:
        out["answers"] += 1
        out["invalid"].append([data, "not XML: %s" % e])
        return etree.fromstring("<none/>")
    out["answers"] += 1
    if not schema.validate(doc):
        out["invalid"].append([data, str(schema.error_log.last_error)])
    if prov is not None:
        for about in doc.iter(OAI + "about"):
            for el in about:
                out["provenance"] += 1
                if not prov.validate(etree.ElementTree(el)):
                    out["invalid"].append([data, "about: %s" % prov.error_log.last_error])
    return doc


def error_code(doc):
    e = doc.find(OAI + "error")
    return None if e is None else e.get("code")


get({"verb": "Identify"})
get({"verb": "Identify"}, post=True)
get({"verb": "ListMetadataFormats"})
sets_doc = get({"verb": "ListSets"})
first = None
for verb, key in (("ListRecords", "records"), ("ListIdentifiers", "identifiers")):
    q = {"verb": verb, "metadataPrefix": "oai_dc"}
    while True:
        doc = get(q)
        code = error_code(doc)
        if code:
            out["errors"][verb] = code
            break
        items = doc.findall(".//" + OAI + "header")
        out[key] += len(items)
        if first is None and items:
            first = items[0].findtext(OAI + "identifier")
        token = doc.findtext(".//" + OAI + "resumptionToken")
        if not token:
            break
        q = {"verb": verb, "resumptionToken": token}
if "--sets" in sys.argv:
    for spec in [e.text for e in sets_doc.iter(OAI + "setSpec")]:
        n = 0
        q = {"verb": "ListRecords", "metadataPrefix": "oai_dc", "set": spec}
        while True:
            doc = get(q)
            if error_code(doc):
                break
            n += len(doc.findall(".//" + OAI + "header"))
            token = doc.findtext(".//" + OAI + "resumptionToken")
            if not token:
                break
            q = {"verb": "ListRecords", "resumptionToken": token}
        out["set_records"][spec] = n
if first:
    get({"verb": "GetRecord", "identifier": first, "metadataPrefix": "oai_dc"})
    get({"verb": "ListMetadataFormats", "identifier": first})
cases = {
    "badVerb": {"verb": "Nonsense"},
    "noVerb": {},
    "badArgument": {"verb": "ListRecords", "metadataPrefix": "oai_dc", "colour": "red"},
    "badFrom": {"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "yesterday"},
    "mixedGranularity": {"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2020-01-01", "until": "2030-01-01T00:00:00Z"},
    "missingPrefix": {"verb": "ListRecords"},
    "exclusiveToken": {"verb": "ListRecords", "metadataPrefix": "oai_dc", "resumptionToken": "x"},
    "badResumptionToken": {"verb": "ListRecords", "resumptionToken": "forged.token"},
    "cannotDisseminateFormat": {"verb": "ListRecords", "metadataPrefix": "marc21"},
    "idDoesNotExist": {"verb": "GetRecord", "identifier": "http://nowhere.example/x", "metadataPrefix": "oai_dc"},
    "idDoesNotExistFormats": {"verb": "ListMetadataFormats", "identifier": "http://nowhere.example/x"},
    "noRecordsMatch": {"verb": "ListRecords", "metadataPrefix": "oai_dc", "from": "2999-01-01"},
    "noRecordsMatchSet": {"verb": "ListIdentifiers", "metadataPrefix": "oai_dc", "set": "nosuchset"},
    "listSetsToken": {"verb": "ListSets", "resumptionToken": "x"},
    "identifyArgument": {"verb": "Identify", "metadataPrefix": "oai_dc"},
    # What a fuzzer sends: characters XML 1.0 cannot carry are never echoed.
    "controlIdentifier": {"verb": "GetRecord", "identifier": "\x01", "metadataPrefix": "oai_dc"},
    "controlToken": {"verb": "ListRecords", "resumptionToken": "\x01"},
    "controlPrefix": {"verb": "ListRecords", "metadataPrefix": "\x01"},
    "escapeSet": {"verb": "ListRecords", "metadataPrefix": "oai_dc", "set": "\x1b"},
    "nonCharacter": {"verb": "GetRecord", "identifier": "\ufffe", "metadataPrefix": "oai_dc"},
    "repeatedVerb": [("verb", "Identify"), ("verb", "Identify")],
}
for case, q in cases.items():
    out["errors"][case] = error_code(get(q))
print(json.dumps(out))
