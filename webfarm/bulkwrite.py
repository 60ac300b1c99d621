"""Unordered bulk writes that tell the writer which documents met which fate.

The index and the item store write batches with ``bulk_write(ordered=False)``: one
round trip, and one document's error does not stop the others. What comes back is
sorted here: a duplicate key (another writer inserted first: the caller upserts
instead), a refusal for good (the document itself cannot be stored: only that one
fails), or anything else (the whole batch is retried as a store failure).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pymongo import InsertOne, UpdateOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError

DUPLICATE_KEY = 11000
WriteOp = InsertOne | UpdateOne


# Write errors that say the document itself cannot be stored: sending it again gets the
# same answer. (BadValue, FailedToParse, TypeMismatch, PathNotViable, DollarPrefixedFieldName,
# InvalidIdField, InvalidDBRef, EmptyFieldName, DottedFieldName, ImmutableField,
# DocumentValidationFailure, BSONObjectTooLarge, KeyTooLong, document too large after update.)
REFUSED_CODES = frozenset({2, 9, 14, 28, 52, 53, 55, 56, 57, 66, 121, 10334, 17280, 17419})


_OWN_CONCERN = re.compile(r"(?:^|&)(?:w|journal|wtimeoutms)=", re.IGNORECASE)


def durable(uri: str) -> dict[str, Any]:
    """MongoClient options for writes that outlive the server's crash: journaled (j:true),
    unless the URI says its own write concern (``w=``, ``journal=``, ``wtimeoutMS=``).

    A write acknowledged lets its lease be acknowledged: the page is then never fetched
    again, so a write the server loses on a crash is a page lost. With w:1 and no ``j``
    the server acknowledges before its journal reaches the disk: a probe killed the
    embedded SecantusDB (``kill -9``) after a crawl, and acknowledged page and item
    updates were gone on restart (kill -9 right after 160 writes kept none of them).
    Journaled, each bulk write waits for one journal flush, and all were kept."""
    return {} if _OWN_CONCERN.search(urlsplit(uri).query) else {"journal": True}


def write_unordered(collection: Collection, ops: list[WriteOp],
                    refused: dict[int, str] | None = None) -> list[int]:
    """``bulk_write(ordered=False)``; returns the indexes of ops that hit a duplicate key.

    Documents known to be new are written with ``InsertOne`` rather than an upsert:
    an insert skips the server's lookup and costs about half as much (measured on
    SecantusDB: 0.45 vs 0.85 ms a document); its duplicate key means another writer
    was first, which callers handle like a failed upsert guard.

    With ``refused``, ops the server refused for good (a ``REFUSED_CODES`` write error:
    a collection's validator, a document too large) are put there, index -> the server's
    message, and the rest of the batch stands. Any other write error raises (the caller
    retries the whole batch)."""
    if not ops:
        return []
    try:
        collection.bulk_write(ops, ordered=False)
    except BulkWriteError as exc:
        duplicates, other = [], bool(exc.details.get("writeConcernErrors"))
        for error in exc.details.get("writeErrors", []):
            code = error.get("code")
            if code == DUPLICATE_KEY:
                duplicates.append(error["index"])
            elif refused is not None and code in REFUSED_CODES:
                refused[error["index"]] = f"{error.get('errmsg', '')} (code {code})"
            else:
                other = True
        if other:
            raise
        return sorted(duplicates)
    return []
