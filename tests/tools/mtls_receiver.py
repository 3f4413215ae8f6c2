"""An HTTPS webhook receiver that requires a client certificate (Python's ssl, certificates
made with trustme), for the hub's mutual TLS test.

Prints one JSON line first: its port and the PEM files the test hands the hub (`ca`: the CA
that issued the server's and the client's certificates; `client_cert`/`client_key`: a client
pair it accepts; `stranger_cert`/`stranger_key`: a pair from another CA, which it refuses).
Then one JSON line per request (method, path, the client certificate's common name, body)
and one per refused handshake. Answers a verification GET with its hub.challenge and a
POST with 200. Ends when its standard input closes. The PEM files go in the folder given as
its argument.
"""

import json
import os
import ssl
import sys
import tempfile
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import trustme

out_lock = threading.Lock()


def say(obj):
    with out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


ca = trustme.CA()
server = ca.issue_cert("127.0.0.1")
client = ca.issue_cert("hub.example.org")
stranger = trustme.CA().issue_cert("hub.example.org")
# The folder the test gives (and removes when it ends), else one of our own.
folder = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="mtls-")
files = {}
for name, blob in [
    ("ca", ca.cert_pem),
    ("client_cert", client.cert_chain_pems[0]),
    ("client_key", client.private_key_pem),
    ("stranger_cert", stranger.cert_chain_pems[0]),
    ("stranger_key", stranger.private_key_pem),
]:
    path = os.path.join(folder, name + ".pem")
    blob.write_to_path(path)
    files[name] = path

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
server.configure_cert(ctx)
ca.configure_trust(ctx)
ctx.verify_mode = ssl.CERT_REQUIRED


def common_name(sock):
    cert = sock.getpeercert() or {}
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    # trustme puts the name in the subjectAltName only
    for kind, value in cert.get("subjectAltName", ()):
        return value
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        say({"method": "GET", "path": self.path, "client": common_name(self.connection)})
        body = q.get("hub.challenge", [""])[0].encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(n).decode("utf-8", "replace")
        say(
            {
                "method": "POST",
                "path": self.path,
                "client": common_name(self.connection),
                "body": body,
            }
        )
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def get_request(self):
        sock, addr = self.socket.accept()
        try:
            return ctx.wrap_socket(sock, server_side=True), addr
        except (ssl.SSLError, OSError) as e:
            say({"refused": str(e)})
            sock.close()
            raise


httpd = Server(("127.0.0.1", 0), Handler)
say({"port": httpd.server_address[1], **files})
threading.Thread(target=httpd.serve_forever, daemon=True).start()
sys.stdin.read()
httpd.shutdown()
