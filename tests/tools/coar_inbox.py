"""A sender's LDN inbox for the tests, receiving the server's answers with PyPI `coarnotify`
(COAR's own library): each POST is parsed and validated by its COARNotifyServer (its pattern
models, chosen by the notification's types) and answered 201 + Location; one that its models
refuse is answered 400 and recorded as refused.

Usage: coar_inbox.py [--hang]

Prints one JSON line with its port, then serves until its standard input closes. With --hang
it reads each request and never answers. GET /_received answers what came, in order:
[{"type", "pattern", "valid", "error", "body"}].
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from coarnotify.server import COARNotifyReceipt, COARNotifyServer, COARNotifyServerError, COARNotifyServiceBinding

HANG = "--hang" in sys.argv
received = []
lock = threading.Lock()


class Binding(COARNotifyServiceBinding):
    def notification_received(self, notification):
        with lock:
            received.append({
                "type": notification.type,
                "pattern": type(notification).__name__,
                "valid": True,
                "error": None,
                "body": notification.to_jsonld(),
            })
            n = len(received)
        return COARNotifyReceipt(COARNotifyReceipt.CREATED, f"http://127.0.0.1/inbox/{n}")


server = COARNotifyServer(Binding())


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        with lock:
            body = json.dumps(received).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if HANG:
            threading.Event().wait()
        try:
            receipt = server.receive(raw.decode(), validate=True)
            self.send_response(receipt.status)
            if receipt.location:
                self.send_header("Location", receipt.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
        except Exception as e:  # COARNotifyServerError, ValidationError, NotifyException
            detail = getattr(e, "errors", None) or getattr(e, "message", None) or str(e)
            with lock:
                try:
                    doc = json.loads(raw)
                except ValueError:
                    doc = None
                received.append({"type": doc.get("type") if isinstance(doc, dict) else None,
                                 "pattern": None, "valid": False, "error": str(detail), "body": doc})
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()


httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
httpd.daemon_threads = True
print(json.dumps({"port": httpd.server_address[1]}), flush=True)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
sys.stdin.read()
