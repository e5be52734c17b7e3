"""Idempotent submission: a `creation_id` names one request, and a different request under the
same key is refused (Stripe's rule), never answered with the first request's session.

A request is remembered by its fingerprint: per field of the validated request that is not
at its default, a short digest of its value (`creation_id` itself left out). Values are
compared as validated, so `{"cpu": "1"}` and `{"cpu": 1}`, or one time in two zones, are the
same request; the digests name the fields that differ without keeping the values (a command
may be a megabyte).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from pydantic import BaseModel

# The key field itself: the same request under another key is another request, not a change.
KEY_FIELD = "creation_id"
_DIGEST_HEX = 16  # 64 bits: a collision would only let a changed request pass as the same


def request_fingerprint(request: BaseModel) -> dict[str, str]:
    """Field name → digest of its value, for every field of `request` not at its default."""
    values = request.model_dump(mode="json", exclude_defaults=True, exclude={KEY_FIELD})
    return {name: _digest(value) for name, value in sorted(values.items())}


def differing_fields(first: Mapping[str, str], again: Mapping[str, str]) -> list[str]:
    """The fields whose values differ between two fingerprints, by name."""
    return sorted(
        name for name in first.keys() | again.keys() if first.get(name) != again.get(name)
    )


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_DIGEST_HEX]
