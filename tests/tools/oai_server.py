"""An OAI-PMH 2.0 repository for the tests: PyPI `oaipmh` (the maintained pyoai)'s
BatchingServer answering every verb and error, over Python's http.server, from a JSON fixture.

Usage: oai_server.py FIXTURE.json [--batch N]

The fixture: {"granularity": "YYYY-MM-DDThh:mm:ssZ" | "YYYY-MM-DD", "deletedRecord":
"persistent" | "transient" | "no", "earliest": "2001-01-01T00:00:00Z", "sets": [[spec, name],
...], "records": [{"id", "datestamp" (ISO, Z), "sets": [...], "deleted": bool, "dc": {"title":
[...], ...}, "raw": "<xml/>" (optional: this element is the record's metadata instead of its
Dublin Core, as a repository that writes its own XML sends it)}], "faults": {...}}. Records are listed in fixture order. The file is read again
whenever it changes (a test rewrites it to change the repository), which also resets the
faults' counters. Prints one JSON line with its port, then serves (GET and POST) until its
standard input closes.

Faults (all optional), for the misbehaving repositories of the tests:
- "busy": {"count": N, "retry_after": "2" or an HTTP date}: the next N requests get 503 with
  that Retry-After;
- "html": N: the next N requests get a 200 HTML error page;
- "expire_tokens": N: the next N requests with a resumption token get badResumptionToken;
- "refuse": 401 or 403: every request gets it;
- "ignore_from": true: `from` is ignored (every list starts at the beginning);
- "replace": [[find, replace], ...]: text replaced in every answer (to inject what the XML
  writer would refuse, such as a U+0001);
- "encoding": "ISO-8859-1": answers are sent in that encoding, as the declaration says;
- "delay_ms": N: every answer waits N ms.

GET /_requests answers every request so far as JSON: [{"t": unix seconds, "query": ...}].
"""

import datetime
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from oaipmh import common, error
from oaipmh.metadata import MetadataRegistry
from oaipmh.server import BatchingServer, oai_dc_writer

FIXTURE = sys.argv[1]
fixture = json.load(open(FIXTURE))
fixture_mtime = os.stat(FIXTURE).st_mtime_ns
faults = dict(fixture.get("faults", {}))
requests = []
lock = threading.Lock()


def reread():
    """Takes the fixture again if the file changed (resetting the faults' counters)."""
    global fixture, fixture_mtime, faults
    m = os.stat(FIXTURE).st_mtime_ns
    if m != fixture_mtime:
        try:
            new = json.load(open(FIXTURE))
        except ValueError:
            return  # caught half-written: the next request reads it whole
        fixture, fixture_mtime = new, m
        faults = dict(fixture.get("faults", {}))


batch = int(sys.argv[sys.argv.index("--batch") + 1]) if "--batch" in sys.argv else 10


def when(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ")


class Repository:
    def identify(self):
        return common.Identify(
            repositoryName="Test repository",
            baseURL="http://127.0.0.1/oai",
            protocolVersion="2.0",
            adminEmails=["admin@example.org"],
            earliestDatestamp=when(fixture.get("earliest", "2001-01-01T00:00:00Z")),
            deletedRecord=fixture.get("deletedRecord", "persistent"),
            granularity=fixture.get("granularity", "YYYY-MM-DDThh:mm:ssZ"),
            compression=["identity"],
        )

    def listMetadataFormats(self, identifier=None):
        return [
            (
                "oai_dc",
                "http://www.openarchives.org/OAI/2.0/oai_dc.xsd",
                "http://www.openarchives.org/OAI/2.0/oai_dc/",
            )
        ]

    def listSets(self, cursor=0, batch_size=10):
        return [(spec, name, None) for spec, name in fixture.get("sets", [])][
            cursor : cursor + batch_size
        ]

    def _matching(self, metadataPrefix, set=None, from_=None, until=None):
        if metadataPrefix != "oai_dc":
            raise error.CannotDisseminateFormatError(metadataPrefix)
        out = []
        for r in fixture["records"]:
            d = when(r["datestamp"])
            if set is not None and set not in r.get("sets", []):
                continue
            if from_ is not None and d < from_ and not faults.get("ignore_from"):
                continue
            if until is not None and d > until:
                continue
            out.append(r)
        if not out:
            raise error.NoRecordsMatchError("nothing in this window")
        return out

    def _header(self, r):
        return common.Header(
            None, r["id"], when(r["datestamp"]), r.get("sets", []), r.get("deleted", False)
        )

    def _record(self, r):
        if r.get("raw") and not r.get("deleted"):
            return (self._header(r), common.Metadata(None, {"raw": r["raw"]}), None)
        meta = None if r.get("deleted") else common.Metadata(None, r.get("dc", {}))
        return (self._header(r), meta, None)

    def listRecords(self, metadataPrefix=None, set=None, from_=None, until=None, cursor=0, batch_size=10):
        rs = self._matching(metadataPrefix, set, from_, until)
        return [self._record(r) for r in rs[cursor : cursor + batch_size]]

    def listIdentifiers(self, metadataPrefix=None, set=None, from_=None, until=None, cursor=0, batch_size=10):
        rs = self._matching(metadataPrefix, set, from_, until)
        return [self._header(r) for r in rs[cursor : cursor + batch_size]]

    def getRecord(self, metadataPrefix, identifier):
        for r in fixture["records"]:
            if r["id"] == identifier:
                return self._record(r)
        raise error.IdDoesNotExistError(identifier)


def writer(element, metadata):
    raw = metadata.getMap().get("raw")
    if raw:
        from lxml import etree

        element.append(etree.fromstring(raw))
    else:
        oai_dc_writer(element, metadata)


registry = MetadataRegistry()
registry.registerWriter("oai_dc", writer)
server = BatchingServer(Repository(), metadata_registry=registry, resumption_batch_size=batch)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle on, a keep-alive client's delayed
    # ACK held every answer 40 ms (a real repository's server sets TCP_NODELAY).
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def send(self, status, ctype, body, headers=()):
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def answer(self, query):
        params = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
        with lock:
            reread()
            requests.append({"t": time.time(), "query": query})
            f = faults
            if f.get("delay_ms"):
                time.sleep(f["delay_ms"] / 1000)
            if f.get("refuse"):
                return self.send(f["refuse"], "text/plain", b"no")
            busy = f.get("busy")
            if busy and busy.get("count", 0) > 0:
                busy["count"] -= 1
                return self.send(503, "text/plain", b"busy", [("Retry-After", busy["retry_after"])])
            if f.get("html", 0) > 0:
                f["html"] -= 1
                return self.send(200, "text/html", b"<html><body><h1>Internal error</h1></body></html>")
            if "resumptionToken" in params and f.get("expire_tokens", 0) > 0:
                f["expire_tokens"] -= 1
                params = {"verb": params["verb"], "resumptionToken": "expired!"}
            body = server.handleRequest(params)
            if isinstance(body, bytes):
                body = body.decode("utf-8")
            for find, replace in f.get("replace", []):
                body = body.replace(find, replace)
            enc = f.get("encoding")
            if enc:
                for q in "\"'":
                    body = body.replace("encoding=%sUTF-8%s" % (q, q), "encoding=%s%s%s" % (q, enc, q), 1)
                body = body.encode(enc)
                ctype = "text/xml"
            else:
                body = body.encode("utf-8")
                ctype = "text/xml; charset=utf-8"
        self.send(200, ctype, body)

    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        if u.path == "/_requests":
            with lock:
                body = json.dumps(requests).encode()
            return self.send(200, "application/json", body)
        self.answer(u.query)

    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        self.answer(self.rfile.read(n).decode("utf-8"))


httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
httpd.daemon_threads = True
print(json.dumps({"port": httpd.server_address[1]}), flush=True)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
sys.stdin.read()
httpd.shutdown()
