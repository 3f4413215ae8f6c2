"""Sends COAR Notify patterns to an LDN inbox with PyPI `coarnotify` (COAR's own library):
its pattern models (built from its own test fixtures, with the origin and target replaced),
its validation before sending, and its client, which expects 201 + Location (or 202).

Usage: coar_send.py INBOX_URL ORIGIN_ID ORIGIN_INBOX TARGET_ID

Prints one JSON line: [{"pattern", "id", "action", "location"}] in the order sent.
"""
import json
import sys

from coarnotify.client import COARNotifyClient
from coarnotify.patterns import AnnounceEndorsement, AnnounceRelationship, AnnounceReview
from coarnotify.test.fixtures import (
    AnnounceEndorsementFixtureFactory,
    AnnounceRelationshipFixtureFactory,
    AnnounceReviewFixtureFactory,
)

inbox, origin_id, origin_inbox, target_id = sys.argv[1:5]
client = COARNotifyClient(inbox)
out = []
for model, factory in [
    (AnnounceRelationship, AnnounceRelationshipFixtureFactory),
    (AnnounceReview, AnnounceReviewFixtureFactory),
    (AnnounceEndorsement, AnnounceEndorsementFixtureFactory),
]:
    source = factory.source()
    source["origin"] = {"id": origin_id, "inbox": origin_inbox, "type": "Service"}
    source["target"] = {"id": target_id, "inbox": inbox, "type": "Service"}
    n = model(source)
    n.validate()
    resp = client.send(n)
    out.append({"pattern": model.__name__, "id": n.id, "action": resp.action, "location": resp.location})
print(json.dumps(out))
