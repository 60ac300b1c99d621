"""Structured items in MongoDB: one collection per item type, upserted on the item's key.

A spider's items stay plain Python (dicts, dataclasses, ``scrapy.Item``); how
they are stored is declared on them:

* **collection**: the class attribute ``item_collection``, else the class name
  in snake case (``ProductItem`` → ``product_item``); a dict names it with the
  key ``_collection``, else the spider's ``item_collection``, else ``items``;
* **key**: the class attribute ``key_fields`` (``("sku",)``); a dict gives
  ``_key`` (a field name or a list), else the spider's ``item_key_fields``,
  else ``("source_url",)`` (one item of that type per page).

Each document is the item's fields plus ``source_url``, ``content_hash`` (of
the page it came from), ``extracted_at``, ``extractor_version`` (the spider's
``extractor_version``), ``item_hash`` (of the fields alone), so re-parsing
tells *created*, *changed* and *unchanged* apart, and ``item_key`` (the key's field
names, so documents stored under a key the items no longer use can be found).
``_id`` is the key value (a sub-document for composite keys); the key fields are
indexed too, and the fields ``WEBFARM_ITEM_INDEXES`` names (none by default: every
index is more work on every write, and on SecantusDB a write's cost grows by about a
fifth per index).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import bson
from itemadapter import ItemAdapter
from pymongo import InsertOne, UpdateOne
from pymongo.database import Database

from webfarm.attrnames import dict_key_slips, item_class_slips
from webfarm.bulkwrite import WriteOp, write_unordered
from webfarm.config import ConfigError
from webfarm.exceptions import ItemError
from webfarm.refetch import as_utc, stored_later

CREATED, CHANGED, UNCHANGED = "created", "changed", "unchanged"
SUPERSEDED = "superseded"  # not written: a later extraction is stored
DEFAULT_COLLECTION = "items"
_RESERVED = ("_collection", "_key", "_id")
# Values ItemAdapter.asdict() keeps as they are: a flat item needs no walk (a per-item cost).
_PLAIN = (str, int, float, bytes, dt.datetime, type(None))
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,100}$")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


# MongoDB's document limit, less room for the fields the store adds (URL, hashes, times).
MAX_ITEM_BYTES = 16 * 1024 * 1024 - 16 * 1024


@dataclass(frozen=True)
class ItemEntry:
    collection: str
    key: Any  # the _id
    key_fields: tuple[str, ...]
    fields: dict[str, Any]
    source_url: str
    content_hash: str | None
    extracted_at: dt.datetime
    extractor_version: str | None
    #: when the item's page was fetched (None: at ``extracted_at``, as in a crawl). Of two
    #: pages giving one key, the item of the one fetched last is kept (``source_fetched_at``)
    fetched_at: dt.datetime | None = None

    @property
    def source_fetched_at(self) -> dt.datetime:
        return self.fetched_at or self.extracted_at

    @functools.cached_property
    def digest(self) -> str:
        """:func:`item_hash` of the fields, once: the key-clash check and the write read it."""
        return item_hash(self.fields)


def collection_of(item: Any, spider: Any = None) -> str:
    if isinstance(item, dict):
        name = item.get("_collection") or getattr(spider, "item_collection", None)
    else:
        name = getattr(item, "item_collection", None) or _CAMEL.sub(
            "_", type(item).__name__).lower()
    name = str(name or DEFAULT_COLLECTION)
    if not _NAME.match(name) or name in ("pages", "contents") or name.startswith("system"):
        raise ItemError(f"item collection {name!r} is not allowed; name it with letters, "
                        "digits and _ (not pages/contents)")
    return name


def key_fields_of(item: Any, spider: Any = None) -> tuple[str, ...]:
    if isinstance(item, dict):
        key = item.get("_key") or getattr(spider, "item_key_fields", None)
    else:
        key = getattr(item, "key_fields", None)
    if isinstance(key, str):
        key = (key,)
    return tuple(key or ("source_url",))


def item_hash(fields: dict[str, Any]) -> str:
    return hashlib.sha256(
        json.dumps(fields, sort_keys=True, default=str, ensure_ascii=False).encode()
    ).hexdigest()


def make_entry(item: Any, spider: Any, source_url: str, content_hash: str | None,
               extracted_at: dt.datetime, fetched_at: dt.datetime | None = None) -> ItemEntry:
    """What to store for one item; raises ItemError for a missing key or unstorable value.
    ``fetched_at``: when its page was fetched, if not at ``extracted_at`` (a re-parse)."""
    if isinstance(item, dict):
        dict_key_slips(item)
    else:
        item_class_slips(type(item))  # said once a class: key_field for key_fields...
    adapter = ItemAdapter(item)
    fields = dict(adapter.items())
    if not all(isinstance(v, _PLAIN) for v in fields.values()):
        fields = adapter.asdict()  # nested items, lists, dicts: converted all the way down
    for name in _RESERVED:
        fields.pop(name, None)
    collection = collection_of(item, spider)
    key_fields = key_fields_of(item, spider)
    values = {**fields, "source_url": source_url}
    missing = [f for f in key_fields if values.get(f) in (None, "")]
    if missing:
        what = f"{type(item).__name__} for {collection!r} has no value for its key field(s) " \
            f"{', '.join(missing)}"
        if not source_url and "source_url" in missing:
            raise ItemError(f"{what}: it does not come from a page (it was yielded by "
                            "start() or by an errback); give the item a key of its own "
                            "(key_fields on its class, _key in a dict)")
        raise ItemError(f"{what} (from {source_url}); fill it in the spider, or name another "
                        "key (key_fields on the item's class, _key in a dict)")
    several = [f for f in key_fields if isinstance(values[f], (list, tuple, set, frozenset))]
    if several:
        raise ItemError(f"{type(item).__name__} for {collection!r} has several values for its "
                        f"key field(s) {', '.join(several)} (from {source_url}): a key is one "
                        "value; extract it with .get() rather than .getall(), or join them")
    key = values[key_fields[0]] if len(key_fields) == 1 else {f: values[f] for f in key_fields}
    try:
        size = len(bson.encode({"_id": key, **fields}))
    except (bson.errors.InvalidDocument, OverflowError) as exc:
        hint = next((h for name, h in _STORE_AS.items() if f"<class '{name}'>" in str(exc)),
                    "use str, int, float, bool, None, lists, dicts or datetimes")
        raise ItemError(f"{type(item).__name__} from {source_url} cannot be stored: {exc}; "
                        f"{hint}") from None
    except UnicodeEncodeError as exc:  # a lone surrogate: json.loads of "\ud83d" (half an emoji)
        raise ItemError(f"{type(item).__name__} from {source_url} has text that is not valid "
                        f"Unicode ({exc.object[exc.start:exc.end]!r}, half of a surrogate "
                        "pair, as JSON escapes of a cut emoji give); clean it in the spider, "
                        "e.g. text.encode('utf-8', 'replace').decode()") from None
    bad = [n for n in fields if not n or n.startswith("$") or "." in n]
    if bad:
        raise ItemError(f"{type(item).__name__} from {source_url} has field name(s) "
                        f"{', '.join(map(repr, bad))} that MongoDB reads as operators or paths; "
                        "rename them without '.' or a leading '$'")
    if size > MAX_ITEM_BYTES:
        raise ItemError(f"{type(item).__name__} from {source_url} is {size / 2**20:.1f} MiB as "
                        "BSON; MongoDB stores documents up to 16 MiB. Keep long text out of "
                        "items (the page itself is kept in the blob store) or split the item")
    version = getattr(spider, "extractor_version", None)
    return ItemEntry(collection, key, key_fields, fields, source_url, content_hash,
                     extracted_at, None if version is None else str(version),
                     as_utc(fetched_at) if isinstance(fetched_at, dt.datetime) else None)


#: What to store instead of a type BSON has no encoding for (said where it is met).
_STORE_AS = {
    "decimal.Decimal": "store a Decimal as str(value) (exact), float(value), whole cents as "
                       "an int, or bson.Decimal128(value)",
    "datetime.date": "store a date as its ISO text (value.isoformat()) or as a datetime "
                     "(datetime.combine(value, time()))",
    "set": "store a set as a sorted list (sorted(value))",
    "frozenset": "store a set as a sorted list (sorted(value))",
}


def fold_keyless(entries: list[ItemEntry]) -> tuple[list[ItemEntry], dict[str, int]]:
    """One page's entries as the store keeps them: items without a key of their own are
    keyed on the page, so several of one collection are one document, the last one's.
    Returns the entries left and, per collection, how many were folded away."""
    last: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if entry.key_fields == ("source_url",):
            last[entry.collection] = i
    folded: dict[str, int] = {}
    kept = []
    for i, entry in enumerate(entries):
        if entry.key_fields == ("source_url",) and last[entry.collection] != i:
            folded[entry.collection] = folded.get(entry.collection, 0) + 1
        else:
            kept.append(entry)
    return kept, folded


def keyless_advice() -> str:
    return ("Give them a key: key_fields on the Item class, '_key' in a dict, or the "
            "spider's item_key_fields")


def index_fields(settings: Any) -> tuple[str, ...]:
    """``WEBFARM_ITEM_INDEXES``: fields indexed in every item collection besides its key."""
    names = tuple(str(n).strip() for n in settings.getlist("WEBFARM_ITEM_INDEXES"))
    for name in names:
        if not _FIELD.match(name):
            raise ConfigError(f"WEBFARM_ITEM_INDEXES: {name!r} is not a field name; list "
                              "fields such as source_url,content_hash (dots for sub-fields)")
    return names


# What the store adds to an item's fields in its document (see ItemStore.write_items).
STORED_FIELDS = frozenset({"_id", "source_url", "content_hash", "extracted_at",
                           "extractor_version", "item_hash", "changed_at",
                           "first_extracted_at", "item_fields", "item_key",
                           "source_fetched_at"})
_SEEN = {"item_hash": 1, "extracted_at": 1, "first_extracted_at": 1, "changed_at": 1,
         "item_fields": 1, "source_fetched_at": 1}
_CREATED_HERE = object()
_CHANGED_HERE = "(changed by this batch)"  # an item hash no entry has


def _before_batch(doc: dict[str, Any], last: ItemEntry) -> Any:
    """The item hash a stored key had before this batch, for its outcome. A batch retried
    after some of its writes landed (a connection lost between the insert and the update
    commands of one bulk write) finds its own writes: a document stored at the time and
    with the hash of the batch's last entry of that key. Its timestamps then tell whether
    the batch created it or changed it, so the counts stay those of the first attempt."""
    at = last.extracted_at
    if not _same_ms(doc.get("extracted_at"), at) or doc.get("item_hash") != item_hash(
            last.fields):
        return doc.get("item_hash")
    if _same_ms(doc.get("first_extracted_at"), at):
        return _CREATED_HERE
    return _CHANGED_HERE if _same_ms(doc.get("changed_at"), at) else doc.get("item_hash")


_ABSENT = object()


def _outcome(known: dict[Any, Any], key: Any, digest: str) -> str:
    """The one rule of write and preview: created if ``key`` has no stored item, changed
    if its item hash differs from ``digest``, else unchanged. ``known`` (key -> stored
    item hash) then holds ``digest``: a key met again in a batch is compared with the
    batch's own earlier entry, as the store will hold it by then."""
    before = known.get(key, _ABSENT)
    known[key] = digest
    return CREATED if before is _ABSENT else UNCHANGED if before == digest else CHANGED


def _superseded(doc: dict[str, Any] | None, entry: ItemEntry, run: RunOrder | None = None,
                ) -> bool:
    """Whether ``doc`` holds, or will hold, the item of a page fetched after ``entry``'s:
    a worker stalled past its lease while another fetched the page again; in a re-parse,
    an older copy of a record (a product's second URL, not refetched since its price
    changed). A re-parse read pages in content-hash order, and the one read last won,
    stale or not, with a "changed" each time it flipped. Documents stored before
    ``source_fetched_at`` compare ``extracted_at``."""
    if doc is None:
        return False
    later = (stored_later(doc, "source_fetched_at", entry.source_fetched_at)
             if isinstance(doc.get("source_fetched_at"), dt.datetime)
             else stored_later(doc, "extracted_at", entry.extracted_at))
    if run is None or not later or stored_later(doc, "extracted_at", run.since - _MS):
        return later  # a crawl's, or an item this re-parse (or a crawl beside it) wrote
    # Stored before the re-parse. The same extractor's item of a later page stays (a
    # --url-pattern slice of older pages put their stale price back). A new extractor's
    # replaces it, unless the later page it came from is read in this run too and decides
    # then: the run re-extracts.
    return (doc.get("extractor_version") == entry.extractor_version
            or doc.get("source_url") in run.ahead)


@dataclass
class RunOrder:
    """A re-parse's part in :func:`_superseded`: when it began, and which of the pages the
    stored items came from it reads too (``read(urls)`` answers, ``ahead`` holds them)."""

    since: dt.datetime
    read: Callable[[set[str]], set[str]]
    ahead: set[str] = field(default_factory=set)

    def look_ahead(self, found: Iterable[dict[str, Any]], entries: Iterable[ItemEntry]
                   ) -> None:
        urls = {d["source_url"] for d in found
                if isinstance(d.get("source_url"), str) and not stored_later(
                    d, "extracted_at", self.since - _MS)}
        here = urls & {e.source_url for e in entries}  # read now: surely in the run
        self.ahead = here | (self.read(urls - here) if urls - here else set())


_MS = dt.timedelta(milliseconds=1)  # BSON dates keep milliseconds


def _same_ms(stored: Any, at: dt.datetime) -> bool:
    """``stored`` (a BSON date: milliseconds, UTC) is ``at``."""
    if not isinstance(stored, dt.datetime):
        return False
    at = as_utc(at)
    return as_utc(stored) == at.replace(microsecond=at.microsecond // 1000 * 1000)


class ItemStore:
    """Bulk upserts of structured items; one result (created/changed/unchanged) per entry."""

    def __init__(self, db: Database, uri: str | None = None,
                 indexes: tuple[str, ...] = ()) -> None:
        self.db = db
        self.uri = uri  # with it, the store can go to the storage process (see __reduce__)
        self.indexes = tuple(indexes)
        self._indexed: set[str] = set()
        self._owner: Any = None

    @classmethod
    def open(cls, uri: str, database: str, indexes: tuple[str, ...] = ()) -> ItemStore:
        """A store on a client of its own (closed by :meth:`close`)."""
        from webfarm.index import IndexStore

        owner = IndexStore(uri, database)
        store = cls(owner.db, uri=uri, indexes=indexes)
        store._owner = owner
        return store

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as what opens it again: the storage process gets a client of its own.
        if self.uri is None:
            raise TypeError("an ItemStore made without uri= cannot go to another process")
        return (ItemStore.open, (self.uri, self.db.name, self.indexes))

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()

    def _ensure_indexes(self, collection: str, key_fields: tuple[str, ...]) -> None:
        if collection in self._indexed:
            return
        coll = self.db[collection]
        coll.create_index([(f, 1) for f in key_fields])
        for name in self.indexes:
            if name != key_fields[0]:  # the key's index (it leads) already serves it
                coll.create_index(name)
        self._indexed.add(collection)

    def write_items(self, entries: list[ItemEntry], retried: bool = False,
                    run: RunOrder | None = None) -> list[str | ItemError]:
        """Store the entries; each one's outcome, or the ItemError of one the server refused
        for good (the others are stored). ``retried``: an earlier attempt at these very
        entries failed, and may have landed in part; their outcomes are then those of the
        first attempt (see :func:`_before_batch`). ``run``: a re-parse's (see
        :func:`_superseded`)."""
        results: list[str | ItemError] = [UNCHANGED] * len(entries)
        by_coll: dict[str, list[int]] = {}
        for i, entry in enumerate(entries):
            by_coll.setdefault(entry.collection, []).append(i)
        for name, idx in by_coll.items():
            self._ensure_indexes(name, entries[idx[0]].key_fields)
            coll = self.db[name]
            keys = [entries[i].key for i in idx]
            seen = {**_SEEN} if retried else {"item_hash": 1, "item_fields": 1,
                                              "extracted_at": 1, "source_fetched_at": 1}
            seen["source_url"] = seen["extractor_version"] = 1
            found = {self._k(d["_id"]): d for d in coll.find({"_id": {"$in": keys}}, seen)}
            if run is not None:
                run.look_ahead(found.values(), (entries[i] for i in idx))
            missing = {self._k(k) for k in keys} - set(found)
            if retried:
                last = {self._k(entries[i].key): entries[i] for i in idx}  # what a key gets
                stored = {k: before for k, d in found.items()
                          if (before := _before_batch(d, last[k])) is not _CREATED_HERE}
            else:
                stored = {k: d.get("item_hash") for k, d in found.items()}
            docs: dict[str, tuple[Any, dict[str, Any], dt.datetime, list[str]]] = {}
            for i in idx:
                entry = entries[i]
                k = self._k(entry.key)
                held = docs[k][1] if k in docs else found.get(k)
                if _superseded(held, entry, run):  # an item of a page fetched later
                    # the same values (a product's print page): one record, unchanged
                    same = held is not None and held.get("item_hash") == entry.digest
                    results[i] = UNCHANGED if same else SUPERSEDED
                    continue
                digest = entry.digest
                results[i] = _outcome(stored, k, digest)
                doc = {**entry.fields, "source_url": entry.source_url,
                       "content_hash": entry.content_hash, "extracted_at": entry.extracted_at,
                       "extractor_version": entry.extractor_version, "item_hash": digest,
                       "item_fields": sorted(entry.fields), "item_key": list(entry.key_fields),
                       "source_fetched_at": entry.source_fetched_at}
                if results[i] != UNCHANGED or k in missing:
                    doc["changed_at"] = entry.extracted_at
                # A field the item had and has no more (renamed, dropped by a new extractor)
                # goes; it stayed, stale, beside its successor. Fields the item never had
                # (someone's annotations) are not the store's to remove.
                before = (found.get(k) or {}).get("item_fields") or ()
                gone = sorted(set(before) - set(entry.fields) - STORED_FIELDS)
                if k in docs and "changed_at" in docs[k][1] and "changed_at" not in doc:
                    # The key met earlier in the batch changed it (a mirror, a print page:
                    # the same item twice); this one, the same again, keeps that time.
                    doc["changed_at"] = docs[k][1]["changed_at"]
                docs[k] = (entry.key, doc, entry.extracted_at, gone)  # the last one wins
            # Keys read as missing are inserted (half the server's work of an upsert); a
            # duplicate key means another worker inserted it first: upsert those.
            ops: list[WriteOp] = [
                InsertOne({"_id": key, **doc, "first_extracted_at": at}) if k in missing
                else self._upsert(key, doc, at, gone)
                for k, (key, doc, at, gone) in docs.items()]
            order, refused = list(docs), {}
            dup = write_unordered(coll, ops, refused)
            if dup:
                self._lost_races(coll, [order[i] for i in dup], docs, entries, idx, results)
                again: dict[int, str] = {}
                write_unordered(coll, [self._upsert(*docs[order[i]]) for i in dup], again)
                refused.update((dup[j], why) for j, why in again.items())
            # The server's rules (a validator, the size limit): every entry of a refused key.
            errors = {order[i]: ItemError(f"MongoDB refused {name} item {order[i]}: {why}")
                      for i, why in refused.items()}
            if errors:
                for j in idx:
                    results[j] = errors.get(self._k(entries[j].key), results[j])
        return results

    def preview_items(self, entries: list[ItemEntry],
                      written: dict[tuple[str, str], tuple[str, dt.datetime]],
                      run: RunOrder | None = None
                      ) -> list[tuple[str, dict[str, Any] | None]]:
        """What :meth:`write_items` would do, writing nothing (``scrapy reparse --dry-run``):
        per entry its outcome and the stored document it would replace. ``written`` stands
        for the earlier previews' writes, ``(collection, key) -> (item_hash, page fetched
        at)``, and gets this batch's (a write stamps unchanged items too)."""
        results: list[tuple[str, dict[str, Any] | None]] = []
        by_coll: dict[str, list[ItemEntry]] = {}
        for entry in entries:
            by_coll.setdefault(entry.collection, []).append(entry)
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for name, group in by_coll.items():
            for doc in self.db[name].find({"_id": {"$in": [e.key for e in group]}}):
                found[(name, self._k(doc["_id"]))] = doc
        ats = [(entry.collection, self._k(entry.key)) for entry in entries]
        known = {at: doc.get("item_hash") for at, doc in found.items()}
        known.update((at, written[at][0]) for at in ats if at in written)
        if run is not None:
            run.look_ahead([d for at, d in found.items() if at not in written], entries)
        for entry, at in zip(entries, ats, strict=True):
            later = written.get(at)  # this run's, as the write would have left it
            if (later[1] > entry.source_fetched_at if later
                    else _superseded(found.get(at), entry, run)):
                held = later[0] if later else found[at].get("item_hash")
                results.append((UNCHANGED if held == entry.digest else SUPERSEDED,
                                found.get(at)))
                continue
            digest = entry.digest
            results.append((_outcome(known, at, digest), found.get(at)))
            written[at] = (digest, entry.source_fetched_at)  # as the write leaves it
        return results

    def _lost_races(self, coll: Any, lost: list[str], docs: dict[str, Any],
                    entries: list[ItemEntry], idx: list[int], results: list[Any]) -> None:
        """Keys another writer inserted first: their entries were counted created, though
        the item was there when they were written (``items/created`` 41 for 40 items). Read
        what it stored: each entry is then changed or unchanged against it, and an item
        that did not change keeps its ``changed_at``."""
        theirs = {self._k(d["_id"]): d.get("item_hash")
                  for d in coll.find({"_id": {"$in": [docs[k][0] for k in lost]}},
                                     {"item_hash": 1})}
        lost_keys = set(lost)
        changed: set[str] = set()
        for i in idx:
            k = self._k(entries[i].key)
            if k in lost_keys and k in theirs and results[i] == CREATED:
                results[i] = _outcome(theirs, k, entries[i].digest)
                if results[i] == CHANGED:
                    changed.add(k)
        for k in lost_keys & set(theirs) - changed:
            docs[k][1].pop("changed_at", None)

    @staticmethod
    def _upsert(key: Any, doc: dict[str, Any], at: dt.datetime, gone: list[str] | None = None
                ) -> UpdateOne:
        update: dict[str, Any] = {"$set": doc, "$setOnInsert": {"first_extracted_at": at}}
        if gone:
            update["$unset"] = dict.fromkeys(gone, "")
        return UpdateOne({"_id": key}, update, upsert=True)

    @staticmethod
    def _k(key: Any) -> str:
        return json.dumps(key, sort_keys=True, default=str)
