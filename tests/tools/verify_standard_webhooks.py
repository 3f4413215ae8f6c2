"""Verifies deliveries with the official Standard Webhooks library (PyPI `standardwebhooks`).

Usage: verify_standard_webhooks.py CASES.json
CASES.json: a list of {"secret": "whsec_...", "headers": {name: value}, "body_b64": "..."}.
Prints a JSON list, one entry per case: null when the library verified it, else its error.
"""

import base64
import json
import sys

from standardwebhooks import Webhook


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    out = []
    for case in cases:
        body = base64.b64decode(case["body_b64"])
        try:
            # The payloads are XML: verified, not parsed as JSON.
            Webhook(case["secret"]).verify(body, case["headers"], json_parse=False)
            out.append(None)
        except Exception as e:  # the library's verdict, whatever its kind
            out.append(f"{type(e).__name__}: {e}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
