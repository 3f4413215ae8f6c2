"""An OAI-PMH 2.0 repository for the tests: PyPI `oaipmh` (the maintained pyoai)'s
BatchingServer answering every verb and error, over Python's http.server, from a JSON fixture.

Usage: oai_server.py FIXTURE.json [--batch N]

The fixture: {"granularity": "YYYY-MM-DDThh:mm:ssZ" | "YYYY-MM-DD", "deletedRecord":
"persistent" | "transient" | "no", "earliest": "2001-01-01T00:00:00Z", "sets": [[spec, name],
...], "records": [{"id", "datestamp" (ISO, Z), "sets": [...], "deleted": bool, "dc": {"title":
[...], ...}}]}. Records are listed in fixture order. Prints one JSON line with its port, then
serves (GET and POST) until its standard input closes.
"""

import datetime
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from oaipmh import common, error
from oaipmh.metadata import MetadataRegistry
from oaipmh.server import BatchingServer, oai_dc_writer

fixture = json.load(open(sys.argv[1]))
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
            if from_ is not None and d < from_:
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


registry = MetadataRegistry()
registry.registerWriter("oai_dc", oai_dc_writer)
server = BatchingServer(Repository(), metadata_registry=registry, resumption_batch_size=batch)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, query):
        params = {k: v[0] for k, v in urllib.parse.parse_qs(query).items()}
        body = server.handleRequest(params)
        if isinstance(body, str):
            body = body.encode("utf-8")
        self.send_response(200)
        self.send_header("content-type", "text/xml; charset=utf-8")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.answer(urllib.parse.urlparse(self.path).query)

    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        self.answer(self.rfile.read(n).decode("utf-8"))


httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
httpd.daemon_threads = True
print(json.dumps({"port": httpd.server_address[1]}), flush=True)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
sys.stdin.read()
httpd.shutdown()
